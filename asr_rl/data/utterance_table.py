"""A training set held packed: what `read_manifest` returns, so that memory grows by a couple of
hundred bytes per utterance rather than by the ~1.3 KB a Python object with its strings, tuples
and metadata dict costs (300k utterances: ~70 MB instead of ~400 MB).

Each row is one `marshal` record (its id, file name, text, keywords, context, metadata and where
it was read); the folders, languages and speakers, which repeat, are stored once and named by
index; the durations are one float64 array (what length bucketing and the prompt-length checks
read without decoding a row). An item is decoded into an `Utterance` when it is asked for: a
batch's worth per step. Items compare equal to the `Utterance`s appended, not identical to them.
"""
from __future__ import annotations

import marshal
import math
from array import array
from dataclasses import dataclass, field
from collections.abc import Iterable, Iterator, Sequence

import numpy as np



@dataclass(frozen=True, slots=True)
class Utterance:
    """One manifest line (or a row of another format), with `audio` an absolute path or an audio
    reference (data/audio_refs.py: a table row's bytes, a segment of a long file). Slotted: a
    training set holds one per line (packed while it waits: `UtteranceTable`)."""

    id: str
    audio: str
    text: str | None  # None: unlabelled (RL only); "": nobody speaks
    language: str
    keywords: tuple[str, ...] = ()
    duration: float | None = None
    speaker: str | None = None
    context: tuple[str, ...] = ()  # words or phrases the prompt names (contextual biasing); () = none
    meta: dict = field(default_factory=dict, compare=False, hash=False)
    source: str = ""  # "manifest.jsonl:12" (or "data.parquet row 12 (id a)"), for error messages downstream


class _Index(dict):
    """Values stored once: value -> its index in `values`."""

    def __init__(self):
        super().__init__()
        self.values: list = []

    def of(self, value) -> int:
        i = self.get(value)
        if i is None:
            i = self[value] = len(self.values)
            self.values.append(value)
        return i


class UtteranceTable(Sequence):
    """`Utterance`s, packed (module docstring); `append` adds one, `[i]` decodes one, a slice
    decodes a list."""

    def __init__(self, utterances: Iterable[Utterance] = ()):
        self._rows: list[bytes] = []
        self._durations = array("d")  # NaN: unknown
        self._context_chars = array("q")  # what a context list adds to the prompt (`context_chars`)
        self._folders, self._languages, self._speakers, self._prefixes = _Index(), _Index(), _Index(), _Index()
        for u in utterances:
            self.append(u)

    def append(self, u: Utterance) -> None:
        folder, sep, name = u.audio.rpartition("/")
        # `source` usually starts with the manifest's path: kept once, as the folders are
        prefix, tail = _split_source(u.source)
        self._rows.append(marshal.dumps((
            u.id, self._folders.of(folder + sep), name, u.text, self._languages.of(u.language), u.keywords,
            self._speakers.of(u.speaker), u.context, u.meta or None, self._prefixes.of(prefix), tail)))
        self._durations.append(math.nan if u.duration is None else float(u.duration))
        self._context_chars.append(context_chars(u.context))

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._decode(j) for j in range(*i.indices(len(self)))]
        return self._decode(range(len(self))[i])  # a negative index counts from the end; IndexError past it

    def __iter__(self) -> Iterator[Utterance]:
        return (self._decode(i) for i in range(len(self)))

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and all(a == b for a, b in zip(self, other))

    __hash__ = None

    def __add__(self, other) -> list[Utterance]:
        return list(self) + list(other)

    def __repr__(self) -> str:
        return f"UtteranceTable({len(self)} utterances)"

    @property
    def durations(self) -> np.ndarray:
        """Seconds per utterance `(n,)`, NaN where unknown (no row decoded)."""
        return np.frombuffer(self._durations, dtype=np.float64).copy()

    @property
    def context_chars(self) -> np.ndarray:
        """`context_chars` of each utterance's context list `(n,)` (no row decoded)."""
        return np.frombuffer(self._context_chars, dtype=np.int64).copy()

    def column(self, name: str) -> Iterator:
        """Each utterance's `name` (`id`, `text`, `keywords` or `context`), in order, without making
        the `Utterance`s (a pass over a field costs a third of a pass over the items)."""
        if name not in ("id", "text", "keywords", "context"):  # the others are stored as indices
            raise ValueError(f"no column {name!r}: id, text, keywords or context")
        k = _RECORD.index(name)
        return (marshal.loads(row)[k] for row in self._rows)

    def _decode(self, i: int) -> Utterance:
        (uid, folder, name, text, language, keywords, speaker, context, meta, prefix,
         tail) = marshal.loads(self._rows[i])
        duration = self._durations[i]
        return Utterance(id=uid, audio=self._folders.values[folder] + name, text=text,
                         language=self._languages.values[language], keywords=keywords,
                         duration=None if math.isnan(duration) else duration, speaker=self._speakers.values[speaker],
                         context=context, meta=meta or {}, source=self._prefixes.values[prefix] + tail)


# what each row's record holds, in order (`append`)
_RECORD = ("id", "folder", "name", "text", "language", "keywords", "speaker", "context", "meta", "prefix", "tail")


def _split_source(source: str) -> tuple[str, str]:
    """(`path:` or `path row `, the rest): what repeats from row to row, and what does not."""
    for mark in (" row ", ":"):
        head, sep, tail = source.rpartition(mark)
        if sep and "/" in head:
            return head + sep, tail
    return "", source


def context_chars(context: tuple[str, ...]) -> int:
    """The characters a context list takes in the prompt (its items and their separators)."""
    return sum(len(c) + 2 for c in context)


def durations_of(items: Sequence) -> np.ndarray:
    """Seconds per item `(n,)` (0 where unknown or not an utterance), without decoding a table's rows."""
    if isinstance(items, UtteranceTable):
        return np.nan_to_num(items.durations, nan=0.0)
    return np.asarray([getattr(u, "duration", None) or 0.0 for u in items], dtype=np.float64)


def column_of(items: Sequence, name: str) -> Iterator:
    """Each item's field `name` (`UtteranceTable.column` for a table)."""
    if isinstance(items, UtteranceTable):
        return items.column(name)
    return (getattr(u, name) for u in items)


def context_chars_of(items: Sequence) -> np.ndarray:
    """`context_chars` per item `(n,)` (0 for items without a context), without decoding a table's rows."""
    if isinstance(items, UtteranceTable):
        return items.context_chars
    return np.asarray([context_chars(getattr(u, "context", ())) for u in items], dtype=np.int64)
