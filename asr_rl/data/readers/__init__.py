"""Readers: one `READERS` entry per on-disk format (base.py has the contract). Importing the package
registers them, in the order `data.format=auto` asks them to recognise a path: `datasets` folders
and parquet, Kaldi/WeNet folders, NeMo manifests, then our JSONL (any other file)."""
from asr_rl.data.readers.base import (READERS, RawRow, ReaderSpec, ReadingDataConfig, ReadOptions, Rows,
                                      choose_reader)
from asr_rl.data.readers import hf_datasets, kaldi, nemo, jsonl  # noqa: F401,E402 (registers them, in this order)

__all__ = ["READERS", "RawRow", "ReaderSpec", "ReadingDataConfig", "ReadOptions", "Rows", "choose_reader"]
