"""Our JSONL manifest (docs/data.md): one utterance a line, `audio` relative to
the manifest's folder or absolute. The `data.*_column` options rename keys (`sentence` -> `text`)."""
from __future__ import annotations

from pathlib import Path

from asr_rl.data.readers.base import READERS, RawRow, ReadOptions, Rows, first_keys, json_lines, rename


def _detect(path: Path) -> str | None:
    keys = first_keys(path)
    if keys is None:
        return None
    return "a JSONL manifest (`audio` key)" if "audio" in keys else "a file of JSON lines (our JSONL manifest)"


@READERS.register("jsonl", detect=_detect)
def read_jsonl(path: Path, options: ReadOptions) -> Rows:
    rows = (RawRow(n, rename(row, options) if row is not None else None, err) for n, row, err in json_lines(path))
    return Rows(rows, base=path.parent, columns=options.mapped())
