"""NeMo manifests: JSON lines with `audio_filepath` (relative to the manifest's folder or
absolute), `text`, `duration`, and optionally `offset` (seconds into the file: the utterance is
`duration` seconds from there, read as a segment of the file) and `lang`. There is no id field:
`id` or `utt_id` when a line has one, else the audio file's name (with the offset when there is
one)."""
from __future__ import annotations

import os
from pathlib import Path

from asr_rl.data.audio_refs import segment_ref
from asr_rl.data.readers.base import READERS, RawRow, ReadOptions, Rows, first_keys, json_lines, rename


def _detect(path: Path) -> str | None:
    keys = first_keys(path)
    return "a NeMo manifest (`audio_filepath` key)" if keys and "audio_filepath" in keys else None


@READERS.register("nemo", detect=_detect)
def read_nemo(path: Path, options: ReadOptions) -> Rows:
    columns = {**options.mapped(), "audio": "audio_filepath", "language": "lang"}
    rows = (RawRow(n, _fields(row, path.parent, options), err) if row is not None else RawRow(n, None, err)
            for n, row, err in json_lines(path))
    return Rows(rows, base=path.parent, columns=columns)


def _fields(row: dict, base: Path, options: ReadOptions) -> dict:
    row = dict(row)
    audio = row.pop("audio_filepath", None)
    if "lang" in row:  # NeMo's language key; a line's own `language` wins
        row = {"language": row.pop("lang"), **row}
    out = rename(row, options)
    out["audio"] = audio  # only NeMo's key gives the audio
    offset = row.get("offset")
    if isinstance(audio, str) and audio.strip() and isinstance(offset, (int, float)) and not isinstance(offset, bool):
        end = offset + out["duration"] if isinstance(out.get("duration"), (int, float)) else None
        out["audio"] = segment_ref(audio if os.path.isabs(audio) else base / audio, offset, end)
        out.pop("offset")
        out.setdefault("id", f"{Path(audio).stem}-{offset:g}")
    out.setdefault("id", out.pop("utt_id", None))
    return out
