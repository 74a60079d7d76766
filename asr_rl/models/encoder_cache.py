"""Frozen-encoder states by utterance and augmentation variant, kept for a run and, optionally, on
disk for the next run (SFT fills it, GRPO from that SFT reads it), so a pipeline pays for a frozen
encoder once per utterance and variant.

A cache is valid only for the encoder and prompt format that filled it: its fingerprint hashes the
audio tower's weights, the feature extractor's settings and the tokenizer (prompt ids are cached
too). A file with another fingerprint is ignored with a warning, never used.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

import torch

from asr_rl.models.policy_base import PromptRow
from asr_rl.utils import umasked

log = logging.getLogger("asr_rl.models")


class EncoderCache(dict):
    """`{(audio path, variant tag, forced language): PromptRow}` with the fingerprint it belongs to."""

    def __init__(self, fingerprint: str = ""):
        super().__init__()
        self.fingerprint = fingerprint

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically (temp file, then rename)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = {key: (row.ids.cpu(), row.audio.cpu()) for key, row in self.items()}
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp")
        os.close(fd)
        try:
            torch.save({"fingerprint": self.fingerprint, "rows": rows}, tmp)
            os.chmod(tmp, umasked(0o666))
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        log.info("saved %d encoder states to %s", len(self), path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, fingerprint: str) -> "EncoderCache":
        """The cache in `path` if it was filled by this encoder and prompt format, else an empty one."""
        cache = cls(fingerprint)
        path = Path(path)
        if not path.is_file():
            return cache
        data = torch.load(path, weights_only=True)
        if data.get("fingerprint") != fingerprint:
            log.warning("ignoring the encoder cache %s: another encoder or prompt format filled it", path)
            return cache
        cache.update({tuple(key): PromptRow(ids, audio) for key, (ids, audio) in data["rows"].items()})
        log.info("loaded %d encoder states from %s", len(cache), path)
        return cache


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
