"""Small shared helpers: atomic file writes, seeding, logging setup."""
from __future__ import annotations

import json
import logging
import os
import random
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np

logger = logging.getLogger("asr_rl")


def setup_logging(level: int = logging.INFO) -> None:
    """One console format for every entry point (rank-0 filtering happens in the caller)."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    os.environ.setdefault("DS_ACCELERATOR", "cpu" if not _cuda_visible() else "cuda")
    quiet_transformers()


def quiet_transformers() -> None:
    """Per-shard "Loading weights"/"Writing model shards" bars drown the one progress bar that matters."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError:
        pass


def _cuda_visible() -> bool:
    """Cheap check that avoids initialising CUDA (DeepSpeed otherwise warns on every import)."""
    return os.path.exists("/dev/nvidia0") or bool(os.environ.get("CUDA_VISIBLE_DEVICES"))


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def umasked(mode: int) -> int:
    """`mode` under this process's umask: what a plain open()/mkdir() would give. Temp files and
    folders (mkstemp, mkdtemp) are private; files renamed into place should not stay so."""
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` via a temp file in the same folder and `os.replace`, so that a reader
    (or a crash) never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, umasked(0o666))  # mkstemp creates the file private (0600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    """Atomically write one JSON object per line (UTF-8, non-ASCII kept readable)."""
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def replace_dir(tmp_dir: str | os.PathLike, final_dir: str | os.PathLike) -> None:
    """Move a fully written temp folder into place; an existing `final_dir` is swapped out first so a
    crash leaves either the old or the new folder, never a mix."""
    tmp_dir, final_dir = Path(tmp_dir), Path(final_dir)
    os.chmod(tmp_dir, umasked(0o777))  # mkdtemp made it private (0700); the folder in place is not
    if final_dir.exists():
        trash = final_dir.with_name(f".{final_dir.name}.old")
        if trash.exists():
            shutil.rmtree(trash)
        os.replace(final_dir, trash)
        os.replace(tmp_dir, final_dir)
        shutil.rmtree(trash)
    else:
        os.replace(tmp_dir, final_dir)


class Deferred:
    """A value made when first read, for argparse: a help text (`%`, `strip`) or a choice list
    (`in`, iteration). The cli's registry-built texts import torch, which `asr-rl --help` and
    `data check` need not wait for."""

    def __init__(self, make):
        self.make, self._value = make, None

    def value(self):
        if self._value is None:
            self._value = self.make()
        return self._value

    def __mod__(self, params):  # argparse expands help texts with %
        return self.value() % params

    def strip(self) -> str:
        return self.value().strip()

    def __iter__(self):
        return iter(self.value())

    def __contains__(self, item) -> bool:
        return item in self.value()
