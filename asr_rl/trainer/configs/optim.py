"""`optim`: AdamW and its learning-rate schedule, the section every trainer reads (the optimiser
that applies it is trainer/update/strategy.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from asr_rl.settings import setting


@dataclass(frozen=True)
class AdamWConfig:
    """AdamW and its learning-rate schedule: the part of `optim` every trainer shares. These are
    the only defaults; a trainer whose numbers differ declares them in its `optim` field's default
    (SFT's config), so a file or override that sets one key keeps the trainer's other defaults.

    Attributes:
        adam_betas: AdamW betas.
        adam_eps: AdamW epsilon.
        weight_decay: AdamW weight decay (never on biases and norms).
        lr_warmup_ratio: share of the schedule's steps spent warming up linearly.
        lr_scheduler: after the warmup, `cosine_with_min_lr` decays to `min_lr_ratio` of the peak
            (OpenRLHF's default); `constant_with_warmup` stays at the peak; `warmup_stable_decay`
            (WSD) stays at the peak, then decays to `min_lr_ratio` over the last `lr_decay_ratio` of
            the steps. WSD suits a run whose end is not known in advance: its stable phase is where
            early stopping watches dev (`early_stopping_decay_steps` then starts the decay at once).
        lr_decay_ratio: WSD's share of the steps spent decaying (the last ones); 0.2 matches a
            cosine of the same length (Hägele et al. 2024, arXiv:2405.18392).
        lr_decay_style: the shape of WSD's decay and of early stopping's: `cosine` or `linear`.
        min_lr_ratio: the floor of every decay as a share of the peak.
        max_norm: gradient clipping norm.
    """

    adam_betas: tuple[float, ...] = setting((0.9, 0.95), ge=0, lt=1)
    adam_eps: float = setting(1e-8, gt=0)
    weight_decay: float = setting(0.0, ge=0)
    lr_warmup_ratio: float = setting(0.05, ge=0, lt=1)
    lr_scheduler: Literal["cosine_with_min_lr", "constant_with_warmup", "warmup_stable_decay"] = "cosine_with_min_lr"
    lr_decay_ratio: float = setting(0.2, ge=0, le=1, note="warmup_stable_decay only")
    lr_decay_style: Literal["cosine", "linear"] = "cosine"
    min_lr_ratio: float = setting(0.1, ge=0, le=1)
    max_norm: float = setting(1.0, gt=0)

    def __post_init__(self) -> None:
        if self.lr_scheduler == "warmup_stable_decay" and self.lr_warmup_ratio + self.lr_decay_ratio > 1:
            raise ValueError(f"optim.lr_warmup_ratio {self.lr_warmup_ratio} + optim.lr_decay_ratio "
                             f"{self.lr_decay_ratio} exceed the run: together they may be at most 1")


@dataclass(frozen=True)
class OptimConfig(AdamWConfig):
    """`optim` of a trainer with one model (SFT, DPO/KTO, RM); RL's (trainer/configs/rl.py) has an
    actor's and a critic's rate instead.

    Attributes:
        learning_rate: peak learning rate.
    """

    learning_rate: float = setting(1e-3, gt=0)
