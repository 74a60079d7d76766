"""How a rank applies gradients, and the `optim` section every trainer reads for it: the plain torch
optimiser here, DeepSpeed in `trainer/distributed/deepspeed_strategy.py`. The update code calls only `backward`, `step`,
`mean_over_ranks`, `gathered` and `state_dict`, so it is the same on both backends (OpenRLHF's `strategy.backward/optimizer_step`)."""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Literal

import torch

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
            (OpenRLHF's default); `constant_with_warmup` stays at the peak.
        min_lr_ratio: the cosine's floor as a share of the peak.
        max_norm: gradient clipping norm.
    """

    adam_betas: tuple[float, ...] = setting((0.9, 0.95), ge=0, lt=1)
    adam_eps: float = setting(1e-8, gt=0)
    weight_decay: float = setting(0.0, ge=0)
    lr_warmup_ratio: float = setting(0.05, ge=0, lt=1)
    lr_scheduler: Literal["cosine_with_min_lr", "constant_with_warmup"] = "cosine_with_min_lr"
    min_lr_ratio: float = setting(0.1, ge=0, le=1)
    max_norm: float = setting(1.0, gt=0)


@dataclass(frozen=True)
class OptimConfig(AdamWConfig):
    """`optim` of a trainer with one model (SFT, DPO/KTO, RM); RL's (trainer/config.py) has an
    actor's and a critic's rate instead.

    Attributes:
        learning_rate: peak learning rate.
    """

    learning_rate: float = setting(1e-3, gt=0)


def build_optimizer(params, cfg: AdamWConfig, lr: float) -> torch.optim.Optimizer:
    """AdamW with no weight decay on biases and norms (1-D tensors)."""
    params = [p for p in params if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=tuple(cfg.adam_betas), eps=cfg.adam_eps)


def build_scheduler(optimizer, cfg: AdamWConfig, total_steps: int):
    """Linear warmup, then cosine decay to `min_lr_ratio` of the peak (OpenRLHF's
    `cosine_with_min_lr`), or a constant peak (a floor of 1)."""
    warmup = int(math.ceil(cfg.lr_warmup_ratio * total_steps))
    floor = 1.0 if cfg.lr_scheduler == "constant_with_warmup" else cfg.min_lr_ratio

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class LocalStrategy:
    """AdamW + warmup/cosine schedule + gradient clipping on one process."""

    def __init__(self, params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer, scheduler,
                 max_norm: float):
        self.params, self.optimizer, self.scheduler, self.max_norm = params, optimizer, scheduler, max_norm

    @classmethod
    def from_config(cls, params, optim_cfg: AdamWConfig, total_steps: int, lr: float | None = None) -> LocalStrategy:
        """The trainable ones of `params` under `optim_cfg` for a schedule of `total_steps` optimiser
        steps; `lr` is the peak rate, by default `optim_cfg.learning_rate` (RL gives the actor's or
        the critic's)."""
        params = [p for p in params if p.requires_grad]
        optimizer = build_optimizer(params, optim_cfg, optim_cfg.learning_rate if lr is None else lr)
        return cls(params, optimizer, build_scheduler(optimizer, optim_cfg, total_steps), optim_cfg.max_norm)

    def backward(self, loss: torch.Tensor, last: bool = True) -> None:
        """Accumulate gradients; `last` marks the minibatch's final micro-batch (DeepSpeed reduces there)."""
        loss.backward()

    def step(self) -> float:
        """Clip, step, schedule, zero; returns the gradient norm before clipping."""
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def mean_over_ranks(self, x: float) -> float:
        """The mean of `x` over the data-parallel ranks (one rank here)."""
        return float(x)

    def gathered(self, params: list[torch.nn.Parameter]):
        """The parameters are whole already (DeepSpeed gathers ZeRO-3 shards here)."""
        return contextlib.nullcontext()

    @property
    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
