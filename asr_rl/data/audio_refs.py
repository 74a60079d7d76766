"""Audio references: audio that is not a whole file of its own, named by one string.

`Utterance.audio` is a path, or a path followed by `::` and where the audio lies inside it:

    /data/cv/data-00000-of-00002.arrow::row=12&column=audio    the bytes held in row 12 (of that
                                                               shard) of an Arrow or parquet column
    /data/meetings/a.wav::start=1.25&end=3.5                   seconds 1.25 to 3.5 of a long file
                                                               (Kaldi `segments`, NeMo `offset`)

No copy of a corpus is written: a row's bytes are read from the memory-mapped Arrow shard (or its
parquet row group) when the utterance is loaded, and decoded by soundfile from memory; a segment is
read with soundfile's start/stop frames. `end=` may be left out (to the end of the file). A
reference is an ordinary string, so it goes into a JSONL manifest (`manifest_row`), the encoder
cache's keys and error messages as a path does.
"""
from __future__ import annotations

import bisect
import functools
import io
import re
from dataclasses import dataclass
from pathlib import Path

SEPARATOR = "::"
_TABLE = re.compile(r"row=(\d+)&column=(.+)")
_SEGMENT = re.compile(r"start=([0-9.]+)(?:&end=([0-9.]+))?")


@dataclass(frozen=True)
class TableRef:
    """Audio bytes in `row` (counted within `path`, an Arrow shard or a parquet file) of `column`."""

    path: Path
    row: int
    column: str

    def __str__(self) -> str:
        return f"bytes in column `{self.column}` of {self.path} row {self.row}"


@dataclass(frozen=True)
class SegmentRef:
    """Seconds `start` to `end` (None: the end of the file) of the audio file `path`."""

    path: Path
    start: float
    end: float | None

    def __str__(self) -> str:
        return f"{self.path} from {self.start:g} s to {'the end' if self.end is None else f'{self.end:g} s'}"


def table_ref(path: str | Path, row: int, column: str) -> str:
    return f"{Path(path).resolve()}{SEPARATOR}row={int(row)}&column={column}"


def segment_ref(path: str | Path, start: float, end: float | None) -> str:
    tail = "" if end is None else f"&end={_seconds(end)}"
    return f"{Path(path).resolve()}{SEPARATOR}start={_seconds(start)}{tail}"


def _seconds(x: float) -> str:
    """Seconds to the microsecond, never in exponent notation (`1.25`, `3600`)."""
    return f"{float(x):.6f}".rstrip("0").rstrip(".")


def parse_ref(audio: str) -> TableRef | SegmentRef | None:
    """The reference `audio` names, or None for a plain path (a string without a known `::` tail)."""
    head, sep, tail = str(audio).rpartition(SEPARATOR)
    if not sep:
        return None
    if m := _TABLE.fullmatch(tail):
        return TableRef(Path(head), int(m.group(1)), m.group(2))
    if m := _SEGMENT.fullmatch(tail):
        return SegmentRef(Path(head), float(m.group(1)), None if m.group(2) is None else float(m.group(2)))
    return None


def row_bytes(ref: TableRef) -> bytes | None:
    """The audio bytes `ref` names: a binary column's value, or the `bytes` field of a struct
    column (the `datasets` Audio feature's `{bytes, path}`); None when the row holds none."""
    if ref.path.suffix == ".parquet":
        value = _parquet_value(ref.path, ref.row, ref.column)
    else:
        value = _arrow_value(ref.path, ref.row, ref.column)
    if isinstance(value, dict):
        value = value.get("bytes")
    return value


def bytes_file(ref: TableRef) -> io.BytesIO:
    """`ref`'s bytes as a file soundfile can open (one row in memory, no copy on disk)."""
    data = row_bytes(ref)
    if not data:
        raise ValueError("holds no audio bytes")
    return io.BytesIO(data)


def arrow_table(path: Path):
    """The table of an Arrow shard (`datasets`' save_to_disk writes the IPC stream format; the file
    format is read too), memory-mapped: rows are paged in from disk only when read."""
    return _arrow_table(path, _stamp(path))


def parquet_file(path: Path):
    """(ParquetFile, first row of each row group, rows) of a parquet file."""
    return _parquet_file(path, _stamp(path))


def _stamp(path: Path) -> tuple[int, int]:
    # opened files are cached by (path, mtime, size): a file written again is opened again
    st = path.stat()
    return st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=64)
def _arrow_table(path: Path, stamp):
    import pyarrow as pa

    try:
        return pa.ipc.open_stream(pa.memory_map(str(path))).read_all()
    except pa.ArrowInvalid:
        return pa.ipc.open_file(pa.memory_map(str(path))).read_all()


@functools.lru_cache(maxsize=64)
def _arrow_chunks(path: Path, stamp, column: str):
    """(chunks, first row of each, rows) of `column` in an Arrow shard: a row is found by
    bisection, not by walking the chunks (as ChunkedArray indexing does)."""
    chunks = _arrow_table(path, stamp).column(column).chunks
    return chunks, *_starts(len(c) for c in chunks)


def _arrow_value(path: Path, row: int, column: str):
    chunks, starts, total = _arrow_chunks(path, _stamp(path), column)
    if row >= total:
        raise IndexError(f"row {row} is past the end of {path} ({total} rows)")
    i = bisect.bisect_right(starts, row) - 1
    return chunks[i][row - starts[i]].as_py()


@functools.lru_cache(maxsize=64)
def _parquet_file(path: Path, stamp):
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(str(path))
    return pf, *_starts(pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups))


@functools.lru_cache(maxsize=4)
def _row_group(path: Path, stamp, group: int, column: str):
    # a few row groups in memory (`datasets` writes audio in groups of about 100 rows): a sequential
    # pass reads each group once
    return _parquet_file(path, stamp)[0].read_row_group(group, columns=[column]).column(0)


def _parquet_value(path: Path, row: int, column: str):
    stamp = _stamp(path)
    _, starts, total = _parquet_file(path, stamp)
    if row >= total:
        raise IndexError(f"row {row} is past the end of {path} ({total} rows)")
    group = bisect.bisect_right(starts, row) - 1
    return _row_group(path, stamp, group, column)[row - starts[group]].as_py()


def _starts(sizes) -> tuple[tuple[int, ...], int]:
    """(first index of each part, total) of parts of `sizes`."""
    starts, total = [], 0
    for n in sizes:
        starts.append(total)
        total += n
    return tuple(starts), total
