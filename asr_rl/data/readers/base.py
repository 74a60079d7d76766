"""The reader contract: `READERS`, one entry per on-disk format, and the options they take.

A reader turns its format's rows into manifest fields (`id`, `audio`, `text`, `language`,
`duration`, `speaker`, ... as a JSONL manifest line holds them) and never judges them: one checker
(data/manifest.py `scan_manifest`) validates every format's rows the same way, so every reader
yields the same `Utterance` and `asr-rl data check` names a bad row of any of them. A row's
`where` names it for the user (`train.parquet row 12 (id cv-12)`, `data/train/wav.scp:3 (utt3)`);
`Rows.columns` maps a field to the name the user's data gives it, so that messages name the user's
column (`missing `sentence``).

Formats are chosen by `data.format=NAME`, or recognised from the path by asking each entry's
`detect` in registration order (the first that recognises it wins); the choice is logged.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from asr_rl.config import DataConfig
from asr_rl.data.languages import LANGUAGE_NAMES
from asr_rl.registry import Registry


@dataclass(frozen=True)
class ReadOptions:
    """How a training set is read: its format and which columns hold what (the `data.*` keys of the
    same names: `ReadingDataConfig`; the flags of `asr-rl data check`).

    Attributes:
        format: a name in `READERS` (`jsonl`, `nemo`, `datasets`: a save_to_disk folder or parquet,
            `kaldi`: a wav.scp folder), or `auto`: recognised from the path (the choice is logged).
        audio_column: the column (or JSONL key) holding the audio: a path, the file's bytes or the
            `datasets` Audio feature.
        text_column: the transcript column (e.g. `sentence`); rows without one are unlabelled.
        id_column: the utterance-id column (absent: `row<N>` for tables, the file name for JSONL).
        language_column: the language-code column.
        language: the language of rows that give none (a set in one language), e.g. `en`.
    """

    format: str = "auto"
    audio_column: str = "audio"
    text_column: str = "text"
    id_column: str = "id"
    language_column: str = "language"
    language: str | None = None

    def __post_init__(self) -> None:  # checked when the config loads, before any model does
        if self.format != "auto":
            READERS.check(self.format)
        if self.language is not None and self.language not in LANGUAGE_NAMES:
            raise ValueError(f"data.language={self.language!r} is not a language code; valid codes: "
                             f"{', '.join(sorted(LANGUAGE_NAMES))}")

    def mapped(self) -> dict[str, str]:
        """{field: the user's column name} of the mapped fields."""
        return {"id": self.id_column, "audio": self.audio_column, "text": self.text_column,
                "language": self.language_column}

    def changed(self) -> set[str]:
        """Fields whose column the user named (not the default): such a column must exist."""
        default = ReadOptions()
        return {f for f, c in self.mapped().items() if c != default.mapped()[f]}


@dataclass(frozen=True)
class ReadingDataConfig(ReadOptions, DataConfig):
    """`data` of the commands that read a training set (`train sft`, `train grpo`, ...): the shared
    settings (`DataConfig`) and how the set is read (`ReadOptions`)."""


@dataclass(frozen=True)
class RawRow:
    """One row as its format gives it: `fields` (manifest fields), or `error` when the row could
    not be read at all. `line` orders the rows (a file's line, a table's row number); `where`
    names the row for the user ("" = `<path>:<line>`, as for a JSONL manifest)."""

    line: int
    fields: dict | None = None
    error: str = ""
    where: str = ""


@dataclass
class Rows:
    """What a reader returns: the rows (read lazily), the folder that relative audio paths resolve
    against, and {field: the user's name for it} for messages."""

    rows: Iterable[RawRow]
    base: Path
    columns: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ReaderSpec:
    """`detect(path)`: why `path` looks like this format (logged), or None."""

    detect: Callable[[Path], str | None]


ReaderFn = Callable[[Path, ReadOptions], Rows]
READERS: Registry[ReaderFn] = Registry("data.format", ReaderSpec)


def choose_reader(path: Path, fmt: str = "auto") -> tuple[str, str]:
    """(reader name, why): `fmt` when one is given, else the first entry that recognises `path`."""
    if fmt != "auto":
        READERS.check(fmt)
        return fmt, f"data.format={fmt}"
    for name in READERS:
        why = READERS.spec(name).detect(path)
        if why:
            return name, f"recognised: {why}"
    raise ValueError(f"{path} is not a format asr-rl recognises (a JSONL or NeMo manifest, a `datasets` folder or "
                     f"parquet, a Kaldi/WeNet folder with wav.scp); data.format= names one of: {', '.join(READERS)}")


def rename(row: dict, options: ReadOptions) -> dict:
    """`row` with the user's column names (`sentence`) renamed to the fields (`text`); `row`
    itself when no column is renamed (the default: no copy a row)."""
    renamed = [(name, column) for name, column in options.mapped().items() if column != name and column in row]
    if not renamed:
        return row
    out = dict(row)
    for name, column in renamed:
        out.pop(name, None)
        out[name] = out.pop(column)
    return out


def require_columns(path: Path, columns: list[str], options: ReadOptions) -> None:
    """A column the user named (`data.text_column=sentence`) must exist, and so must the audio;
    ValueError listing the columns there are."""
    needed = {f: c for f, c in options.mapped().items() if f in options.changed() or f == "audio"}
    missing = {f: c for f, c in needed.items() if c not in columns}
    if missing:
        which = ", ".join(f"`{c}` (data.{f}_column)" for f, c in missing.items())
        raise ValueError(f"{path} has no column {which}; its columns: {', '.join(columns)}")


def json_lines(path: Path) -> Iterator[tuple[int, dict | None, str]]:
    """(line number, object, "") of every non-blank line, or (line, None, why) for a line that is not
    a JSON object."""
    with open(path, encoding="utf-8") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except json.JSONDecodeError as e:
                yield lineno, None, f"malformed JSON ({e.msg} at column {e.colno})"
                continue
            if not isinstance(row, dict):
                yield lineno, None, f"expected a JSON object, got {type(row).__name__}"
                continue
            yield lineno, row, ""


def first_keys(path: Path) -> set[str] | None:
    """The keys of the first JSON-object line of `path` (None: not a text file of JSON lines)."""
    if not path.is_file():
        return None
    try:
        for _, row, _ in json_lines(path):
            if row is not None:
                return set(row)
    except (UnicodeDecodeError, OSError):
        return None
    return set()
