"""Frozen-encoder states by utterance and augmentation variant, kept for a run and, optionally, in a
folder on disk for this run's later epochs and the next runs (SFT fills it, GRPO from that SFT reads
it), so a pipeline pays for a frozen encoder once per utterance and variant, at any corpus size.

RAM holds the most recently used rows up to a bound (`model.encoder_cache_max_gib`, counted as the
bytes of the ids and audio tensors): past it the least recently used rows are dropped. With a folder
(`model.encoder_cache=DIR`, models/cache_shards.py) every row is written through to it when it is
encoded, and a dropped row is read back from its memory-mapped shard; without one a dropped row is
gone and `AudioPolicy.encode_batch` encodes it again on its next use (the states are a pure function
of the audio and the frozen encoder, so the result is the same up to float rounding).

A cache is valid only for the encoder and prompt format that filled it: its fingerprint hashes the
audio tower's weights, the feature extractor's settings and the tokenizer (prompt ids are cached
too). Rows of another fingerprint in the same folder are never read (and never deleted: each encoder has shards of its own).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import OrderedDict
from collections.abc import MutableMapping
from pathlib import Path

import torch

from asr_rl.models.policy_base import PromptRow

log = logging.getLogger("asr_rl.models")


def row_bytes(row: PromptRow) -> int:
    """What a row holds in RAM: its ids and audio tensors."""
    return sum(t.numel() * t.element_size() for t in (row.ids, row.audio) if t is not None)


class EncoderCache(MutableMapping):
    """`{(audio path, variant tag, forced language): PromptRow}` with the fingerprint it belongs to.

    Args:
        fingerprint: `encoder_fingerprint` of the encoder and processor that fill it.
        max_bytes: the RAM bound of the rows kept decoded (least recently used dropped past it);
            None: no bound (a policy built outside a run; a run sets `model.encoder_cache_max_gib`).
        folder: the shard folder rows are written through to and read back from (None: RAM only).

    Attributes:
        ram_bytes: bytes of the rows in RAM now (never above `max_bytes`).
        evictions, disk_reads: rows dropped from RAM, and rows read back from the folder, so far.
    """

    def __init__(self, fingerprint: str = "", max_bytes: int | None = None,
                 folder: str | os.PathLike | None = None):
        from asr_rl.models.cache_shards import ShardStore

        self.fingerprint, self.max_bytes = fingerprint, max_bytes if max_bytes is not None else float("inf")
        self.store = ShardStore(folder, fingerprint) if folder is not None else None
        self._ram: OrderedDict[tuple, PromptRow] = OrderedDict()
        self.ram_bytes = self.evictions = self.disk_reads = 0

    # --- the mapping -------------------------------------------------------------------------------
    def __contains__(self, key) -> bool:
        return key in self._ram or (self.store is not None and key in self.store.index)

    def __getitem__(self, key: tuple) -> PromptRow:
        row = self._ram.get(key)
        if row is not None:
            self._ram.move_to_end(key)
            return row
        if self.store is None or key not in self.store.index:
            raise KeyError(key)
        row = self.store.read(key)
        self.disk_reads += 1
        self._keep(key, row)
        return row

    def __setitem__(self, key: tuple, row: PromptRow) -> None:
        row = PromptRow(row.ids.detach().cpu(), None if row.audio is None else row.audio.detach().cpu())
        if self.store is not None:
            self.store.append(key, row)  # write-through: a killed run keeps every row it encoded
        self._keep(key, row)

    def __delitem__(self, key: tuple) -> None:
        """Drop `key` from RAM (a folder's shards are append-only: its row stays on disk)."""
        self.ram_bytes -= row_bytes(self._ram.pop(key))

    def __len__(self) -> int:
        return len(self.store.index) if self.store is not None else len(self._ram)

    def __iter__(self):
        return iter(list(self.store.index if self.store is not None else self._ram))

    def clear(self) -> None:
        """Empty the mapping: RAM, and this object's view of the folder (its files stay, for the next run)."""
        self._ram.clear()
        self.ram_bytes = 0
        if self.store is not None:
            self.store.index.clear()

    def _keep(self, key: tuple, row: PromptRow) -> None:
        size = row_bytes(row)
        if key in self._ram:
            self.ram_bytes -= row_bytes(self._ram.pop(key))
        if size > self.max_bytes:
            return  # bigger than the whole bound: served to the caller, not kept
        while self._ram and self.ram_bytes + size > self.max_bytes:
            _, old = self._ram.popitem(last=False)
            self.ram_bytes -= row_bytes(old)
            self.evictions += 1
        self._ram[key] = row
        self.ram_bytes += size

    # --- lifetime ------------------------------------------------------------------------------------
    def close(self) -> None:
        """Release the folder's files (every row is on disk already); the cache stays usable."""
        if self.store is not None:
            self.store.close()

    def metrics(self) -> dict[str, float]:
        """What the SFT log shows: rows known, RAM held, rows dropped and read back."""
        return {"encoder/cached": len(self), "encoder/ram_gib": self.ram_bytes / 2**30,
                "encoder/evictions": self.evictions, "encoder/disk_reads": self.disk_reads}

    def __deepcopy__(self, memo):  # a copied model (critic, reference) shares the cache: same frozen encoder
        return self

    def __repr__(self) -> str:
        where = f"folder {self.store.folder}" if self.store is not None else "RAM only"
        ram = f"{self.ram_bytes / 2**30:.2f}/{self.max_bytes / 2**30:.2f} GiB RAM"
        return f"EncoderCache({len(self)} rows, {where}, {ram})"

    @property
    def folder(self) -> Path | None:
        return None if self.store is None else self.store.folder


def encoder_fingerprint(tower: torch.nn.Module, processor) -> str:
    """sha1 of the tower's weights, the feature extractor's settings and the tokenizer's vocabulary
    and chat template."""
    h = hashlib.sha1()
    for name, tensor in sorted(tower.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    h.update(processor.feature_extractor.to_json_string().encode())
    tok = processor.tokenizer
    h.update(json.dumps(sorted(tok.get_vocab().items())).encode())
    h.update(str(getattr(tok, "chat_template", "")).encode())
    return h.hexdigest()
