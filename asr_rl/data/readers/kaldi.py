"""Kaldi/WeNet data folders: `wav.scp` (`<recording> <path>`) and `text` (`<utterance> <words>`),
optionally `segments` (`<utterance> <recording> <start> <end>` in seconds; end -1 = the end of the
file), `utt2spk`, `utt2lang` and `utt2dur`.

Without `segments` each recording is an utterance; with it each segment is one, read as that span
of its recording (audio_refs.py `segment_ref`: soundfile reads just those frames; nothing is cut
to disk). Relative paths in `wav.scp` resolve against the data folder. Command entries (`... |`)
and archive offsets (`foo.ark:12`) are refused per row: asr-rl reads audio files. An utterance
without a line in `text` is unlabelled; without `utt2lang` the language is `data.language`.
Problems name the file, line and utterance (`data/train/text:3 (utt3)`).
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from asr_rl.data.audio_refs import segment_ref
from asr_rl.data.readers.base import READERS, RawRow, ReadOptions, Rows

COLUMNS = {"audio": "wav.scp", "text": "text", "speaker": "utt2spk", "language": "utt2lang", "duration": "utt2dur"}
_PER_UTTERANCE = (("text", "text"), ("speaker", "utt2spk"), ("language", "utt2lang"), ("duration", "utt2dur"))


@dataclass
class _Table:
    """`<key> <value>` lines of one file: {key: value}, and the rows it could not read. Only
    `wav.scp` keeps each key's line (its lines number the rows); the per-utterance files look a
    line up when a message needs it: a line number and a tuple per entry cost ~80 bytes an
    utterance and file, which a 300k-utterance folder paid in peak memory."""

    file: Path
    entries: dict[str, str]
    bad: list[RawRow]
    lines: dict[str, int] | None = None

    def where(self, line: int, key: str) -> str:
        return f"{self.file}:{line} ({key})"

    def line_numbers(self, keys) -> dict[str, int]:
        """{key: the line that first gives it} of `keys`."""
        if self.lines is not None:
            return {k: self.lines[k] for k in keys}
        wanted, out = set(keys), {}
        with open(self.file, encoding="utf-8") as f:
            for line, raw in enumerate(f, start=1):
                key = raw.split(maxsplit=1)[0] if raw.strip() else None
                if key in wanted and key not in out:
                    out[key] = line
        return out


def _detect(path: Path) -> str | None:
    return "a Kaldi/WeNet data folder (wav.scp)" if path.is_dir() and (path / "wav.scp").is_file() else None


@READERS.register("kaldi", detect=_detect)
def read_kaldi(path: Path, options: ReadOptions) -> Rows:
    if not (path / "wav.scp").is_file():
        raise ValueError(f"{path} holds no wav.scp: a Kaldi/WeNet data folder lists its audio there")
    named = sorted(options.changed())
    if named:  # a column setting has nothing to choose in a Kaldi folder: refused, not ignored
        keys = ", ".join(f"data.{f}_column={options.mapped()[f]}" for f in named)
        raise ValueError(f"{keys} does not apply to the Kaldi folder {path}: its files say what each field is "
                         "(wav.scp the audio, text the transcripts, utt2spk, utt2lang, utt2dur); drop the setting")
    tables = {"wav.scp": _read_table(path / "wav.scp", keep_lines=True)}
    shared = {k: k for k in tables["wav.scp"].entries}  # each utterance's id held once, not once per file
    for name in ("text", "utt2spk", "utt2lang", "utt2dur"):
        if (path / name).is_file():
            tables[name] = _read_table(path / name, empty_ok=name == "text", keys=shared,
                                       repeat=name in ("utt2spk", "utt2lang"))
    del shared
    return Rows(_rows(path, tables), base=path, columns=dict(COLUMNS))


def _rows(path: Path, tables: dict[str, _Table]) -> Iterator[RawRow]:
    for table in tables.values():
        yield from table.bad
    wavs = tables["wav.scp"]
    segments = path / "segments"
    units = _segments(segments, wavs) if segments.is_file() else (
        (line, rec, _audio(wavs, rec), wavs.where(line, rec)) for rec, line in wavs.lines.items())
    seen = set()
    for line, utt, audio, where in units:
        seen.add(utt)
        if isinstance(audio, RawRow):
            yield audio
            continue
        fields = {"id": utt, "audio": audio}
        for field, name in _PER_UTTERANCE:
            if name in tables and utt in tables[name].entries:
                value = tables[name].entries[utt]
                fields[field] = _number(value) if field == "duration" and _number(value) is not None else value
        yield RawRow(line, fields, where=where)
    for _, name in _PER_UTTERANCE:  # lines for utterances that are not there: a mismatched folder
        unknown = [utt for utt in tables[name].entries if utt not in seen] if name in tables else []
        lines = tables[name].line_numbers(unknown) if unknown else {}
        for utt in unknown:
            line = lines[utt]
            yield RawRow(line, error=f"utterance {utt!r} is not in `{'segments' if segments.is_file() else 'wav.scp'}`",
                         where=tables[name].where(line, utt))


def _read_table(file: Path, empty_ok: bool = False, keep_lines: bool = False, keys: dict | None = None,
                repeat: bool = False) -> _Table:
    """`file`'s entries; `keys` gives the id strings to share, `repeat` stores each distinct value
    once (speakers, languages)."""
    table, values = _Table(file, {}, [], {} if keep_lines else None), {}
    with open(file, encoding="utf-8") as f:
        for line, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            key, *rest = raw.split(maxsplit=1)  # the key, then the rest of the line (spaces or tabs)
            value = rest[0].strip() if rest else ""
            if key in table.entries:
                first = table.line_numbers([key])[key]
                table.bad.append(RawRow(line, error=f"duplicate key {key!r} (first on line {first})",
                                        where=table.where(line, key)))
            elif not value and not empty_ok:
                table.bad.append(RawRow(line, error=f"expected `<id> <value>`, got {raw.strip()!r}",
                                        where=table.where(line, key)))
            else:
                key = keys.get(key, key) if keys is not None else key
                table.entries[key] = values.setdefault(value, value) if repeat else value
                if table.lines is not None:
                    table.lines[key] = line
    return table


def _audio(wavs: _Table, rec: str) -> str | RawRow:
    """The absolute path `wav.scp` gives `rec`, or an error row."""
    line, value = wavs.lines[rec], wavs.entries[rec]
    if value.endswith("|"):
        return RawRow(line, error=f"`wav.scp` gives a command (`{value}`), not a file: asr-rl reads audio files; "
                                  "write the audio out (e.g. with sox) and list the files", where=wavs.where(line, rec))
    return value if os.path.isabs(value) else str(wavs.file.parent / value)


def _segments(file: Path, wavs: _Table) -> Iterator[tuple[int, str, str | RawRow, str]]:
    """(line, utterance, audio reference or error row, where) of every line of `segments`."""
    with open(file, encoding="utf-8") as f:
        for line, raw in enumerate(f, start=1):
            parts = raw.split()
            if not parts:
                continue
            where = f"{file}:{line} ({parts[0]})"
            if len(parts) != 4 or _number(parts[2]) is None or _number(parts[3]) is None:
                yield line, parts[0], RawRow(line, error=f"expected `<utterance> <recording> <start> <end>`, got "
                                                         f"{raw.strip()!r}", where=where), where
            elif parts[1] not in wavs.entries:
                yield line, parts[0], RawRow(line, error=f"recording {parts[1]!r} is not in `wav.scp`",
                                             where=where), where
            else:
                audio = _audio(wavs, parts[1])
                start, end = float(parts[2]), float(parts[3])
                ref = audio if isinstance(audio, RawRow) else segment_ref(audio, start, None if end < 0 else end)
                yield line, parts[0], ref, where


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None
