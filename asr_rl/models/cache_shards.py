"""The encoder cache's folder: append-only shards of prompt rows, memory-mapped for reading.

Layout of `model.encoder_cache=DIR`:
- `meta.json`: `{"format": 1, "fingerprints": [...]}`, the encoders and prompt formats whose rows it
  holds (each one's shards carry the first 12 characters of its fingerprint);
- per writer process, shards `<fp12>-<host>-<pid>-<token>-<n>.bin` (the rows' bytes: prompt ids
  as int32, then the audio states in their dtype) and `.idx` beside it (one JSON line per row: key,
  offset, id count, frames, width, dtype, CRC-32 of the row's bytes), at most `shard_bytes` of data each.

Each row's bytes are checked against their CRC when read (~1 ms a row): a row whose bytes were
altered, or whose index line points where no row fits, is dropped with a warning naming the shard
and encoded again; it never reaches training.

Each row is written data first, then its index line, each flushed: a process killed between the two
leaves bytes no index line points to, and at worst a partial last line; both are ignored, and cut off
when the folder is next opened by a process that finds the shard's writer gone (its lock released).
Every complete row is there for the next run (SFT killed at step N resumes with its states). Rows
survive a killed process, not a power cut (no fsync: the cost per row would be a disk round trip).

Two ranks on one folder never write the same file (the name carries host, pid and a random token);
each reads every shard indexed when it opened the folder. The same key in two shards (two ranks
encoded it at once) is read from the first shard in name order.

A folder another encoder or prompt format filled (another fingerprint in `meta.json`: an acoustic
scorer's encoder given the policy's cache folder) keeps that encoder's rows: each encoder reads and
writes only the shards of its own fingerprint, so two encoders on one folder never cost each other a
row (the log says the folder is shared). Only shards of another on-disk format are deleted (when no
live process writes them). A path that is a file (that earlier single-file format) is refused with
the setting to change.
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import secrets
import socket
import zlib
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from asr_rl.config import ConfigError
from asr_rl.models.policy_base import PromptRow

log = logging.getLogger("asr_rl.models")

FORMAT = 1
SHARD_BYTES = 256 * 2**20
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_OPEN_MAPS = 128  # memory maps kept open at once (each holds a file descriptor)


@dataclass(frozen=True)
class Location:
    """Where a row lies: its data file, byte offset, id count, frames x width and dtype name."""

    data: Path
    offset: int
    n_ids: int
    frames: int
    width: int
    dtype: str
    crc: int | None = None  # CRC-32 of the row's bytes; None in rows written before checksums

    @property
    def end(self) -> int:
        return self.offset + 4 * self.n_ids + self.frames * self.width * _DTYPES[self.dtype].itemsize


def fingerprints(meta: dict | None) -> set[str]:
    """The fingerprints whose rows a folder's `meta.json` says it holds (this format's only; the first
    version named one, as `fingerprint`)."""
    if not meta or meta.get("format") != FORMAT:
        return set()
    return set(meta.get("fingerprints", [])) | ({meta["fingerprint"]} if "fingerprint" in meta else set())


class ShardStore:
    """The rows of one folder for one fingerprint: `index` maps a key to its `Location`."""

    def __init__(self, folder: str | os.PathLike, fingerprint: str, shard_bytes: int = SHARD_BYTES):
        self.folder, self.fingerprint, self.shard_bytes = Path(folder), fingerprint, shard_bytes
        if self.folder.is_file():
            raise ConfigError(f"model.encoder_cache={self.folder} is a file (the single-file cache of earlier "
                              "versions); the cache is now a folder of shards: give a folder path (e.g. "
                              f"model.encoder_cache={self.folder.with_suffix('')}; the states are encoded again "
                              "once), or model.encoder_cache=null to keep them in RAM only")
        self.folder.mkdir(parents=True, exist_ok=True)
        self.prefix = fingerprint[:12] or "nofp"
        self.index: dict[tuple, Location] = {}
        self._maps: OrderedDict[Path, np.memmap] = OrderedDict()
        self._writer: _Writer | None = None
        self._shard_count = 0
        with _locked(self.folder / ".lock"):  # one opener at a time: the stale-folder replacement is not raced
            self._adopt_meta()
            for idx in sorted(self.folder.glob(f"{self.prefix}-*.idx")):
                self._read_shard(idx)
        log.info("encoder cache %s: %d rows on disk", self.folder, len(self.index))

    # --- opening -----------------------------------------------------------------------------
    def _adopt_meta(self) -> None:
        meta_path = self.folder / "meta.json"
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else None
        known = fingerprints(meta)
        if self.fingerprint in known:
            return
        if known:
            log.warning("encoder cache %s holds another encoder's (or prompt format's) states: they are kept, and "
                        "this encoder's are written beside them in shards of its own", self.folder)
        elif meta is not None:  # another on-disk format: its shards cannot be read
            log.warning("encoder cache %s is of another format; its shards are replaced", self.folder)
            for idx in self.folder.glob("*.idx"):
                if _writer_gone(idx):
                    idx.unlink(missing_ok=True)
                    idx.with_suffix(".bin").unlink(missing_ok=True)
        tmp = meta_path.with_name(f".meta.json.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"format": FORMAT, "fingerprints": sorted(known | {self.fingerprint})}) + "\n")
        os.replace(tmp, meta_path)  # atomic: a reader sees the old meta or the new one

    def _read_shard(self, idx: Path) -> None:
        """Index a shard's complete rows; with its writer gone, cut off a torn tail."""
        data = idx.with_suffix(".bin")
        size = data.stat().st_size if data.is_file() else 0
        raw = idx.read_bytes()
        good, data_end, at, skipped = 0, 0, 0, []
        for n, line in enumerate(raw.splitlines(keepends=True), start=1):
            at += len(line)
            loc = _parse(line, data)
            if loc is None or loc.end > size:  # a partial line, or one whose data is not all there
                skipped.append(n)
                continue
            self.index.setdefault(loc.key, loc.loc)
            good, data_end = at, max(data_end, loc.loc.end)
        # bad lines before a good one were damaged, not torn: skipped, never cut off
        damaged = [n for n in skipped if n <= raw[:good].count(b"\n")]
        if damaged:
            log.warning("encoder cache %s: %s line(s) %s point where no row is: skipped (their rows are encoded "
                        "again)", self.folder, idx.name, ", ".join(map(str, damaged)))
        if (good < len(raw) or data_end < size) and _writer_gone(idx):
            os.truncate(idx, good)
            os.truncate(data, data_end)
            log.warning("encoder cache %s: cut a torn tail off %s (%d index bytes, %d data bytes)", self.folder,
                        idx.name, len(raw) - good, size - data_end)

    # --- reading and writing -------------------------------------------------------------------
    def read(self, key: tuple) -> PromptRow:
        """The row of `key`, copied out of its shard (CPU tensors). A damaged row (its bytes fail
        their CRC, or its index line points outside the shard or at the wrong size) is dropped from
        the index with a warning and `KeyError` is raised: the caller encodes it again."""
        loc = self.index[key]
        try:
            buf = np.array(self._map(loc.data, loc.end)[loc.offset:loc.end])
            if len(buf) != loc.end - loc.offset or loc.offset < 0:
                raise ValueError(f"the index line points at bytes {loc.offset}..{loc.end}, past the shard's end")
            if loc.crc is not None and zlib.crc32(buf) != loc.crc:
                raise ValueError("its bytes fail their checksum (altered on disk)")
            ids = torch.from_numpy(buf[:4 * loc.n_ids]).view(torch.int32).long()
            audio = torch.from_numpy(buf[4 * loc.n_ids:]).view(_DTYPES[loc.dtype]).reshape(loc.frames, loc.width)
        except (ValueError, IndexError, RuntimeError, KeyError, OSError) as e:
            del self.index[key]
            log.warning("encoder cache %s: the row of %s in %s is damaged (%s): dropped, it is encoded again",
                        self.folder, key[0] if key else key, loc.data.name, e)
            raise KeyError(key) from None
        return PromptRow(ids, audio)

    def _map(self, data: Path, end: int) -> np.memmap:
        mm = self._maps.pop(data, None)
        if mm is None or len(mm) < end:  # not mapped yet, or our own shard grew since
            mm = np.memmap(data, dtype=np.uint8, mode="r")
        self._maps[data] = mm
        while len(self._maps) > _OPEN_MAPS:
            self._maps.popitem(last=False)
        return mm

    def append(self, key: tuple, row: PromptRow) -> None:
        """Write `row` to this process's current shard (a new one past `shard_bytes`)."""
        if key in self.index:
            return
        ids = row.ids.detach().to("cpu", torch.int32).contiguous()
        audio = row.audio.detach().cpu().contiguous()
        dtype = str(audio.dtype).removeprefix("torch.")
        payload = ids.view(torch.uint8).numpy().tobytes() + audio.view(torch.uint8).numpy().tobytes()
        if self._writer is None or (self._writer.size and self._writer.size + len(payload) > self.shard_bytes):
            self._next_shard()
        offset = self._writer.size
        crc = zlib.crc32(payload)
        line = json.dumps({"key": list(key), "offset": offset, "ids": ids.numel(), "frames": audio.shape[0],
                           "width": audio.shape[1], "dtype": dtype, "crc": crc})
        try:
            self._writer.write(payload, line)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            raise OSError(e.errno, f"encoder cache {self.folder}: no space left on the device writing "
                                   f"{self._writer.data_path.name}; free space there, move the cache "
                                   "(model.encoder_cache=DIR) or keep the states in RAM only "
                                   "(model.encoder_cache=null)") from None
        self.index[key] = Location(self._writer.data_path, offset, ids.numel(), audio.shape[0], audio.shape[1], dtype,
                                   crc)

    def _next_shard(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._shard_count += 1
        name = f"{self.prefix}-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}-{self._shard_count:04d}"
        self._writer = _Writer(self.folder / f"{name}.bin", self.folder / f"{name}.idx")

    @property
    def disk_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.folder.glob("*.bin"))

    def close(self) -> None:
        """Release this process's shard (its lock) and the memory maps; reads and writes reopen them."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._maps.clear()

    def __del__(self):  # a dropped cache releases its lock at once, not when the process ends
        try:
            self.close()
        except Exception:
            pass


class _Writer:
    """One shard this process appends to; its index file stays locked while open (`_writer_gone`)."""

    def __init__(self, data_path: Path, idx_path: Path):
        self.data_path = data_path
        self.data = open(data_path, "xb")
        self.idx = open(idx_path, "xb")
        fcntl.flock(self.idx, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.size = 0

    def write(self, payload: bytes, line: str) -> None:
        self.data.write(payload)
        self.data.flush()  # the data reaches the file before the index line that points to it
        self.idx.write((line + "\n").encode())
        self.idx.flush()
        self.size += len(payload)

    def close(self) -> None:
        self.data.close()
        self.idx.close()  # closing releases the lock


@dataclass(frozen=True)
class _Line:
    key: tuple
    loc: Location

    @property
    def end(self) -> int:
        return self.loc.end


def _parse(line: bytes, data: Path) -> _Line | None:
    if not line.endswith(b"\n"):
        return None
    try:
        d = json.loads(line)
        crc = d.get("crc")
        return _Line(tuple(d["key"]), Location(data, int(d["offset"]), int(d["ids"]), int(d["frames"]),
                                               int(d["width"]), str(d["dtype"]), None if crc is None else int(crc)))
    except (ValueError, KeyError, TypeError):
        return None


def _writer_gone(idx: Path) -> bool:
    """No live process holds the shard's lock (its writer closed it, or was killed)."""
    try:
        with open(idx, "rb") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
    except BlockingIOError:
        return False
    except FileNotFoundError:
        return True


@contextmanager
def _locked(path: Path):
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


__all__ = ["ShardStore", "Location", "SHARD_BYTES", "FORMAT", "fingerprints"]
