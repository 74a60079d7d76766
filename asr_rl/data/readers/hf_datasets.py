"""Hugging Face `datasets` on disk: a `save_to_disk` folder (Arrow shards, `state.json`), a parquet
file, or a folder of parquet shards (`to_parquet`, a hub repository's split).

Audio is the `datasets` Audio feature (`{bytes, path}`), a binary column (the file's bytes) or a
string column (a path, relative to the dataset's folder or absolute). Bytes stay where they are:
the utterance's `audio` is a reference to its row (audio_refs.py), decoded by soundfile from
memory when loaded. Nothing else is decoded here (`datasets` itself is not imported: its Audio
decoding needs torchcodec). Columns are mapped by `data.text_column`, `data.id_column`,
`data.language_column`, `data.audio_column`; other columns are kept (`speaker`, `duration`,
`keywords`, `context` as in a manifest, the rest as metadata). Rows are counted from 0 across
shards, as `dataset[i]` counts them.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from asr_rl.data.audio_refs import arrow_table, parquet_file, table_ref
from asr_rl.data.readers.base import READERS, RawRow, ReadOptions, Rows, rename, require_columns

_BATCH = 1000  # rows read at a time while scanning


def _detect(path: Path) -> str | None:
    if path.is_dir():
        if (path / "dataset_dict.json").is_file():
            return "a `datasets` DatasetDict folder (dataset_dict.json)"
        if (path / "state.json").is_file() or (path / "dataset_info.json").is_file():
            return "a `datasets` save_to_disk folder (state.json)"
        if any(path.glob("*.parquet")):
            return "a folder of parquet shards"
        return None
    return f"a {path.suffix} file" if path.suffix in (".parquet", ".arrow") else None


@READERS.register("datasets", detect=_detect)
def read_datasets(path: Path, options: ReadOptions) -> Rows:
    shards = shard_files(path)
    schema = _schema(shards[0])
    require_columns(path, list(schema.names), options)
    _require_audio_type(path, schema.field(options.audio_column).type, options.audio_column)
    base = path if path.is_dir() else path.parent
    return Rows(_rows(path, shards, base, options), base=base, columns=options.mapped())


def shard_files(path: Path) -> list[Path]:
    """The Arrow or parquet files of `path`, in row order."""
    if path.is_file():
        return [path]
    if (path / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in path.iterdir() if p.is_dir())
        raise ValueError(f"{path} is a DatasetDict with the splits {', '.join(splits)}: give one split's folder, "
                         f"e.g. {path / (splits[0] if splits else 'train')}")
    state = path / "state.json"
    if state.is_file():
        files = [path / f["filename"] for f in json.loads(state.read_text())["_data_files"]]
    else:
        files = sorted(path.glob("*.arrow")) or sorted(path.glob("*.parquet"))
    if not files:
        raise ValueError(f"{path} holds no .arrow or .parquet files")
    return files


def _schema(shard: Path):
    return parquet_file(shard)[0].schema_arrow if shard.suffix == ".parquet" else arrow_table(shard).schema


def _require_audio_type(path: Path, kind, column: str) -> None:
    import pyarrow as pa

    ok = (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)
          or pa.types.is_large_binary(kind)
          or (pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0))
    if not ok:
        raise ValueError(f"{path}: column `{column}` holds {kind}; asr-rl reads audio given as a path (string), "
                         "the file's bytes (binary) or the `datasets` Audio feature ({bytes, path})")


def _batches(shard: Path) -> Iterator:
    if shard.suffix == ".parquet":
        yield from parquet_file(shard)[0].iter_batches(batch_size=_BATCH)
    else:
        yield from arrow_table(shard).to_batches(max_chunksize=_BATCH)


def _rows(path: Path, shards: list[Path], base: Path, options: ReadOptions) -> Iterator[RawRow]:
    index = 0
    for shard in shards:
        offset = 0  # row within the shard: what an audio reference counts
        for batch in _batches(shard):
            audio = audio_values(batch.column(options.audio_column), shard, offset, options.audio_column, base)
            others = {name: batch.column(name).to_pylist() for name in batch.schema.names
                      if name != options.audio_column}
            for i in range(batch.num_rows):
                fields = rename({name: values[i] for name, values in others.items()}, options)
                fields["audio"] = audio[i]
                if fields.get("id") is None:
                    fields["id"] = f"row{index}"
                yield RawRow(index, fields, where=f"{path} row {index} (id {fields['id']})")
                index += 1
            offset += batch.num_rows


def audio_values(array, shard: Path, offset: int, column: str, base: Path) -> list[str | None]:
    """Per row of `array` (an Arrow array of `column`, starting at row `offset` of `shard`): a
    reference to the row's bytes, the path it gives (absolute), or None (no audio)."""
    import pyarrow as pa

    def path_of(p):
        return None if p is None else str(p if os.path.isabs(p) else base / p)

    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        return [path_of(p) for p in array.to_pylist()]
    valid = array.is_valid().to_pylist()
    if not pa.types.is_struct(array.type):  # binary: the file's bytes
        return [table_ref(shard, offset + i, column) if v else None for i, v in enumerate(valid)]
    # flatten(), not field(): a batch is a slice, and only flatten() applies its offset to the children
    children = dict(zip([f.name for f in array.type], array.flatten()))
    has_bytes = children["bytes"].is_valid().to_pylist()
    paths = children["path"].to_pylist() if "path" in children else [None] * len(array)
    return [None if not v else table_ref(shard, offset + i, column) if b else path_of(p)
            for i, (v, b, p) in enumerate(zip(valid, has_bytes, paths))]
