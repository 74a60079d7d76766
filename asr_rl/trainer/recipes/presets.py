"""Defaults that depend on the starting checkpoint, applied like the algorithm presets (before the
config file and the overrides, which win).

The dataclass defaults suit the tiny demo models that `asr-rl model init` builds (learning rate
2e-3 for SFT from scratch, 2e-4 for RL). A released checkpoint (a folder `model init` did not
build, e.g. Qwen/Qwen3-ASR-0.6B-hf) is damaged by those rates; it gets the published fine-tuning
rates instead: ~1e-5 for SFT and ~1e-6 for RL (Qwen3-ASR technical report; OpenRLHF's actor 1e-6 /
critic 9e-6 defaults). The encoder of such a checkpoint is frozen by default already
(`models.builders.encoder_is_pretrained`), and SFT's CTC is off with it.
"""
from __future__ import annotations

import logging
from asr_rl.config import load_config
from asr_rl.models.builders import RELEASED_CHECKPOINT, is_released_checkpoint

log = logging.getLogger("asr_rl.train")


def load_with_checkpoint_presets(cls, kind: str, config, overrides: list[str], presets: list[str] = ()):
    """`load_config` with `presets` (and, when `pretrain` is a released checkpoint, its presets
    first) applied before the config file and the overrides."""
    cfg = load_config(cls, config, overrides, presets=list(presets))
    if not is_released_checkpoint(cfg.pretrain):
        return cfg
    log.info("pretrain=%s is a released checkpoint: its defaults %s (a config file or override wins)", cfg.pretrain,
             " ".join(RELEASED_CHECKPOINT[kind]))
    return load_config(cls, config, overrides, presets=[*RELEASED_CHECKPOINT[kind], *presets])


__all__ = ["load_with_checkpoint_presets"]
