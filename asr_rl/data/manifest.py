"""Manifests: one utterance per JSONL line (docs/data.md).

    {"id", "audio": path relative to the manifest or absolute, "text": reference (optional for RL;
     "" = nobody speaks: a non-speech line),
     "language": "en"|"zh"|..., "keywords": [...] (optional), "duration": seconds (optional),
     "speaker": voice or speaker id (optional), "context": [words or phrases] (optional: the
     hotword list the model is given with this utterance), ...any other fields are kept as metadata}

`scan_manifest` checks every line and collects all problems (never stopping at the first), so that
`asr-rl data check` can list every bad line at once; `read_manifest` is the strict form the trainers
use: any problem is an error naming the file and line.

A line without `text` (absent or null) is unlabelled: RL takes it (its reward must not need a
transcript, rewards/pipeline.py `check_reward_coverage`), SFT and eval refuse it naming the file
and line. `"text": ""` is a labelled line on which nobody speaks (a non-speech line: noise, music,
silence), scored by how much the model writes there.

The same fields come from the other formats `READERS` reads (NeMo manifests, `datasets` folders and
parquet, Kaldi/WeNet folders: data/readers), chosen by `data.format` or recognised from the path;
every row of every format is checked here, so each yields the same `Utterance` and its problems
name the row as its format counts them. Audio inside a table, or a segment of a long file, is an
audio reference (data/audio_refs.py) that `load_audio` opens.
"""
from __future__ import annotations

import contextlib

import functools
import json
import logging
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from asr_rl.data.audio import AudioError, audio_info, load_audio
from asr_rl.data.languages import LANGUAGE_NAMES
from asr_rl.data.readers import READERS, ReadOptions, choose_reader
from asr_rl.data.utterance_table import Utterance, UtteranceTable  # noqa: F401 (Utterance: re-exported)

log = logging.getLogger(__name__)

_KNOWN_FIELDS = ("id", "audio", "text", "language", "keywords", "duration", "speaker", "context")


@dataclass(frozen=True)
class Problem:
    """A bad row: `line` (a JSONL line, a table's row number), and `where` when the row is named
    otherwise than `<path>:<line>` (`data.parquet row 12 (id a)`, `data/train/text:3 (utt3)`)."""

    line: int
    message: str
    where: str = ""

    def at(self, path) -> str:
        """How to name the row of `path` this is about."""
        return self.where or f"{path}:{self.line}"


@dataclass
class ManifestScan:
    """Everything `scan_manifest` found: the usable utterances, the problems and harmless notes."""

    path: Path
    format: str = ""  # the reader's name (data/readers)
    format_reason: str = ""  # why it was chosen: `data.format=...` or what was recognised
    utterances: Sequence[Utterance] = field(default_factory=list)  # an UtteranceTable once scanned
    problems: list[Problem] = field(default_factory=list)
    notes: list[Problem] = field(default_factory=list)

    @property
    def hours(self) -> float:
        return sum(u.duration or 0.0 for u in self.utterances) / 3600.0

    @property
    def languages(self) -> Counter:
        return Counter(u.language for u in self.utterances)

    @property
    def speakers(self) -> set[str]:
        return {u.speaker for u in self.utterances if u.speaker}

    @property
    def unlabelled(self) -> list[Utterance]:
        return [u for u in self.utterances if u.text is None]


class ManifestError(ValueError):
    """A manifest with bad lines; the message lists each as `path:line: problem` (or the row as its
    format names it: `Problem.at`)."""

    def __init__(self, path: str | os.PathLike, problems: list[Problem], limit: int = 20, kind: str = "manifest"):
        self.path = Path(path)
        self.problems = problems
        shown = "\n".join(f"  {p.at(self.path)}: {p.message}" for p in problems[:limit])
        more = f"\n  ... and {len(problems) - limit} more" if len(problems) > limit else ""
        hint = f" (`asr-rl data check --manifest {self.path}` lists them all)" if kind == "manifest" else ""
        super().__init__(f"{kind} {self.path} has {len(problems)} bad line(s):\n{shown}{more}\n"
                         f"Fix or remove these lines{hint}.")


def scan_manifest(path: str | os.PathLike, *, check_audio: bool = True, min_duration: float = 0.0,
                  max_duration: float | None = None, text_needed_by: str | None = "training and evaluation",
                  options: ReadOptions | None = None, trust_durations: bool = False) -> ManifestScan:
    """Parse and validate every row of `path`: a JSONL manifest, or any format in `READERS`
    (`options.format`, or recognised from the path; the choice is logged).

    With `check_audio`, each audio header is read (existence, readability, length); durations come
    from the file, otherwise from the line's `duration` field when present. With `trust_durations`
    too, only the headers of rows without a `duration` are read: start-up then costs what reading
    the index costs, at any size, and a missing or unreadable file is reported when a batch loads
    it (data/batching.py `load_utterance`, naming the row). `text_needed_by` names
    what needs transcripts (a line without `text` is then a problem naming it); None accepts
    unlabelled lines (RL). `options` maps columns and sets the default language (data/readers).
    """
    path, options = Path(path), options or ReadOptions()
    if not path.exists():
        raise FileNotFoundError(f"manifest {path} does not exist")
    fmt, why = choose_reader(path, options.format)
    log.info("%s: read as %s (%s)", path, fmt, why)
    with _reading(path, fmt, why):
        rows = READERS.get(fmt)(path, options)
    check = _RowCheck(rows.base, {**_IDENTITY, **rows.columns}, check_audio, min_duration, max_duration,
                      text_needed_by, options.language, trust_durations)
    scan = ManifestScan(path=path, format=fmt, format_reason=why, utterances=UtteranceTable())
    with _reading(path, fmt, why):
        _scan_rows(path, rows, check, scan)
    return scan


@contextlib.contextmanager
def _reading(path: Path, fmt: str, why: str):
    """A file the reader cannot read at all (a truncated Arrow file, bytes that are not the format
    chosen) is a ValueError naming the file, the format and the format that would read it."""
    try:
        yield
    except (UnicodeDecodeError, OSError, EOFError) as e:
        raise ValueError(_unreadable(path, fmt, why, e)) from None
    except Exception as e:
        if type(e).__module__.split(".")[0] != "pyarrow":
            raise
        raise ValueError(_unreadable(path, fmt, why, e)) from None


def _unreadable(path: Path, fmt: str, why: str, e: Exception) -> str:
    msg = f"{path} could not be read as {fmt} ({why}): {type(e).__name__}: {e}"
    try:
        other, other_why = choose_reader(path, "auto")
    except ValueError:
        other = None
    if other and other != fmt:
        return f"{msg}. It looks like {other} ({other_why}): set data.format={other} (or auto)"
    return f"{msg}. The file may be cut short or damaged (copy it again), or not {fmt} at all (data.format=)"


def _scan_rows(path: Path, rows, check, scan: ManifestScan) -> None:
    seen: dict[str, int | str] = {}  # id -> where it first was: its line, or its `where`
    for raw in rows.rows:
        try:
            if raw.error:  # the reader could not make fields of the row
                raise _LineError(raw.error)
            utt, notes = _parse_row(raw.fields, raw.where or f"{path}:{raw.line}", check)
        except _LineError as e:
            scan.problems.append(Problem(raw.line, str(e), raw.where))
            continue
        if utt.id in seen:
            first = seen[utt.id]
            where = f"at {first}" if isinstance(first, str) else f"on line {first}"
            scan.problems.append(Problem(raw.line, f"duplicate id {utt.id!r} (first {where})", raw.where))
            continue
        seen[utt.id] = raw.where or raw.line
        scan.utterances.append(utt)
        if notes:
            scan.notes.extend(Problem(raw.line, n, raw.where) for n in notes)


def read_manifest(path: str | os.PathLike, *, check_audio: bool = True, min_duration: float = 0.0,
                  max_duration: float | None = None, text_needed_by: str | None = "training and evaluation",
                  options: ReadOptions | None = None, trust_durations: bool = False) -> Sequence[Utterance]:
    """Strict reading: every line must be usable and there must be at least one (`text_needed_by`,
    `options` and `trust_durations` as `scan_manifest`). The utterances come packed (an
    `UtteranceTable`: a sequence that decodes an item when it is asked for)."""
    scan = scan_manifest(path, check_audio=check_audio, min_duration=min_duration, max_duration=max_duration,
                         text_needed_by=text_needed_by, options=options, trust_durations=trust_durations)
    if scan.problems:
        raise ManifestError(path, scan.problems)
    if not scan.utterances:
        raise ManifestError(path, [Problem(0, "the manifest holds no utterances")])
    return scan.utterances


def manifest_row(u: Utterance) -> dict:
    """`u` as a manifest line again: every field it was read with (its other fields included), with
    `audio` absolute, so that the line resolves from any folder it is written to."""
    row = {"id": u.id, "audio": u.audio, "text": u.text, "language": u.language}
    row.update({k: v for k, v in (("keywords", list(u.keywords)), ("duration", u.duration), ("speaker", u.speaker),
                                  ("context", list(u.context))) if v not in (None, [])})
    return {**row, **{k: v for k, v in u.meta.items() if k not in row}}


def sample_problems(utterances: list[Utterance]) -> list[Problem]:
    """What only decoding shows (`asr-rl data check --deep`): a file whose samples are NaN or
    infinite, or whose data stops short of its header's length. One file in memory at a time."""
    out = []
    for i, u in enumerate(utterances):
        try:
            load_audio(u.audio, 16000)
        except AudioError as e:
            tail = u.source.rsplit(":", 1)[-1]
            out.append(Problem(int(tail) if tail.isdigit() else i, str(e), u.source))
    return out


class _LineError(ValueError):
    pass


@dataclass(frozen=True)
class _RowCheck:
    """What every row is checked against; `names` maps a field to the user's name for it."""

    base: Path
    names: dict[str, str]
    check_audio: bool
    min_duration: float
    max_duration: float | None
    text_needed_by: str | None
    language: str | None
    trust_durations: bool = False


_IDENTITY = {f: f for f in _KNOWN_FIELDS}


def _parse_row(row: dict, source: str, check: _RowCheck) -> tuple[Utterance, list[str]]:
    name = check.names
    if row.get("audio") is None:
        raise _LineError(f"missing `{name['audio']}`")
    text, audio = _check_text(row.get("text"), check.text_needed_by, name["text"]), row["audio"]
    language = row.get("language") if row.get("language") is not None else check.language
    if not isinstance(audio, str) or not audio.strip():
        raise _LineError(f"`{name['audio']}` must be a non-empty path string")
    if language is None:
        raise _LineError(f"missing `{name['language']}` (e.g. \"en\" or \"zh\"; data.language=CODE sets it for "
                         "every row without one)")
    if language not in LANGUAGE_NAMES:
        raise _LineError(f"unknown language {language!r}; valid codes: {', '.join(sorted(LANGUAGE_NAMES))} "
                         f"(from `{name['language']}`)")
    keywords = row.get("keywords") or []
    if not isinstance(keywords, list) or not all(isinstance(k, str) for k in keywords):
        raise _LineError("`keywords` must be a list of strings")
    context = check_context(row.get("context", []))
    audio_path = audio if os.path.isabs(audio) else os.path.join(check.base, audio)  # str: Path costs µs a row
    duration, notes = _check_duration(row, audio_path, check, name["duration"])
    if text == "":
        notes.append("empty `text`: a non-speech line (nobody speaks; eval counts words written there)")
    utt_id = str(row.get("id") or Path(audio).stem)
    meta = {k: v for k, v in row.items() if k not in _KNOWN_FIELDS}
    speaker = row.get("speaker")
    return Utterance(id=utt_id, audio=_resolved(audio_path), text=text, language=language,
                     keywords=tuple(keywords), duration=duration,
                     speaker=str(speaker) if speaker is not None else None, context=context, meta=meta,
                     source=source), notes


def _resolved(audio: str) -> str:
    """`audio` absolute, its folder resolved: what `Path.resolve` gives for a file that is not a
    link, at one `realpath` per folder instead of an `lstat` per path component per row (reading a
    300k-line manifest spent most of its time there)."""
    folder, _, name = audio.rpartition("/")
    real = _real_folder(folder or "/")
    return real + name if real.endswith("/") else f"{real}/{name}"


@functools.lru_cache(maxsize=4096)
def _real_folder(folder: str) -> str:
    return os.path.realpath(folder)


def _check_text(text, needed_by: str | None, name: str = "text") -> str | None:
    """A line's transcript: None when absent (unlabelled), "" when nobody speaks."""
    if text is None:
        if needed_by:
            raise _LineError(f"missing `{name}` (the transcript): {needed_by} needs one; lines without one are "
                             "unlabelled audio, which only RL takes")
        return None
    if not isinstance(text, str):
        raise _LineError(f"`{name}` must be a string (the transcript), got {type(text).__name__} {text!r}")
    return text.strip() and text


def check_context(context) -> tuple[str, ...]:
    """A line's `context` as a tuple; anything but a list of non-empty strings is refused (never
    dropped: a silently shortened list would bias toward other words than the user gave)."""
    if context is None:
        return ()
    if not isinstance(context, list):
        raise _LineError(f"`context` must be a list of strings (words or phrases), got {type(context).__name__}")
    for i, item in enumerate(context):
        if not isinstance(item, str):
            raise _LineError(f"`context` item {i} must be a string, got {type(item).__name__} {item!r}")
        if not item.strip():
            raise _LineError(f"`context` item {i} is an empty string")
    return tuple(item.strip() for item in context)


def read_context_file(path: str | os.PathLike) -> tuple[str, ...]:
    """A context list from a UTF-8 text file, one word or phrase a line (blank lines are skipped), or
    a JSON array of strings (as a manifest line's `context` holds it). A folder, bytes that are not
    UTF-8 text, a JSON array of anything but strings, or an empty list is refused, naming the file."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"context file {path} is a folder; give a text file, one word or phrase a line")
    if not path.is_file():
        raise FileNotFoundError(f"context file {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"context file {path} is not UTF-8 text (byte {e.start} is {e.object[e.start:e.start + 1]!r}); "
                         "give a text file, one word or phrase a line") from None
    if "\x00" in text:
        raise ValueError(f"context file {path} holds NUL bytes: it is binary, not a text file")
    if text.lstrip().startswith("["):
        items = _json_context(path, text)
    else:
        items = tuple(line.strip() for line in text.splitlines() if line.strip())
    if not items:
        raise ValueError(f"context file {path} holds no words or phrases")
    return items


def _json_context(path: Path, text: str) -> tuple[str, ...]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"context file {path} starts like a JSON array but is not one ({e.msg} at line {e.lineno}, "
                         f"column {e.colno}); give a JSON array of strings or one word or phrase a line") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"context file {path}: a JSON context list must be an array of strings")
    return tuple(v.strip() for v in value if v.strip())


def _check_duration(row: dict, audio_path: str, check: _RowCheck, name: str) -> tuple[float | None, list[str]]:
    notes: list[str] = []
    duration, min_duration, max_duration = row.get("duration"), check.min_duration, check.max_duration
    if duration is not None and (isinstance(duration, bool) or not isinstance(duration, (int, float))):
        raise _LineError(f"`{name}` must be a number of seconds, got {duration!r}")
    if duration is not None and duration <= 0:  # the line's own field, whatever the file's header says
        raise _LineError(f"`{name}` is {duration!r}: a duration is a positive number of seconds; correct it, or drop "
                         "the field and the audio file's header gives it")
    if check.check_audio and not (check.trust_durations and duration is not None):
        try:
            info = audio_info(audio_path)
        except AudioError as e:
            raise _LineError(str(e)) from None
        duration = info.duration
        if info.channels > 1:
            notes.append(f"{info.channels} channels: mixed down to mono")
        if info.sample_rate != 16000:
            notes.append(f"sample rate {info.sample_rate} Hz: resampled at load to the model's rate")
    if duration is not None:
        if duration <= 0:
            raise _LineError(f"zero-length audio {audio_path}")
        if duration < min_duration:
            raise _LineError(f"audio {audio_path} is {duration:.2f}s, shorter than min_duration {min_duration}s")
        if max_duration is not None and duration > max_duration:
            raise _LineError(f"audio {audio_path} is {duration:.1f}s, longer than max_duration {max_duration}s")
    return (float(duration) if duration is not None else None), notes
