"""How a worker applies gradients under the `optim` section (trainer/configs/optim.py): the plain torch
optimiser here, DeepSpeed in `trainer/distributed/deepspeed_strategy.py`. The update code calls only `backward`, `step`,
`mean_over_ranks`, `gathered` and `state_dict`, so it is the same on both backends (OpenRLHF's `strategy.backward/optimizer_step`)."""
from __future__ import annotations

import contextlib
import math

import torch

from asr_rl.trainer.configs.optim import AdamWConfig


def build_optimizer(params, cfg: AdamWConfig, lr: float) -> torch.optim.Optimizer:
    """AdamW with no weight decay on biases and norms (1-D tensors)."""
    params = [p for p in params if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=tuple(cfg.adam_betas), eps=cfg.adam_eps)


class LRSchedule:
    """The learning rate as a share of the peak, `schedule(k)`, for the optimiser step that follows
    `k` completed ones (LambdaLR's lambda): a linear warmup over ceil(lr_warmup_ratio x total) steps,
    then `lr_scheduler`'s shape (AdamWConfig). `decay_now(k, n)` ends any of them early: from the
    rate step k trained at down to `min_lr_ratio` over the next n steps, the last of which trains at
    the floor (early stopping's decay, trainer/run/early_stopping.py). WSD: Hu et al. 2024 (MiniCPM,
    arXiv:2404.06395); its decay may branch off the stable phase anywhere (Hägele et al. 2024)."""

    def __init__(self, cfg: AdamWConfig, total_steps: int):
        self.kind, self.style, self.floor = cfg.lr_scheduler, cfg.lr_decay_style, cfg.min_lr_ratio
        self.warmup_ratio, self.decay_ratio = cfg.lr_warmup_ratio, cfg.lr_decay_ratio
        self.cut: tuple[int, int, float] | None = None  # a decay begun early: (k, n, the rate step k trained at)
        self.plan(total_steps)

    def plan(self, total_steps: int) -> None:
        """Warm-up, stable phase and decay laid out over `total_steps` (`max_steps`, or the steps a
        time cap holds: `StepEnd` plans again once it knows the pace). A warm-up under way goes on
        at the shorter warm-up's rate."""
        self.total = total_steps
        self.warmup = int(math.ceil(self.warmup_ratio * total_steps))
        decay = int(math.ceil(self.decay_ratio * total_steps)) if self.kind == "warmup_stable_decay" else 0
        self.stable_end = max(self.warmup, total_steps - decay)  # WSD's decay trains steps stable_end+1 ..

    def base(self, k: int) -> float:
        """The schedule as configured, without an early decay."""
        if k < self.warmup:
            return (k + 1) / (self.warmup + 1)
        if self.kind == "constant_with_warmup":
            return 1.0
        if self.kind == "warmup_stable_decay":
            if k < self.stable_end:
                return 1.0
            return self._decay(1.0, (k - self.stable_end + 1) / max(1, self.total - self.stable_end))
        progress = min(1.0, (k - self.warmup) / max(1, self.total - self.warmup))
        return self.floor + (1 - self.floor) * 0.5 * (1 + math.cos(math.pi * progress))

    def _decay(self, top: float, progress: float) -> float:
        """From `top` (progress 0) to the floor (progress >= 1) in `lr_decay_style`'s shape; never up
        (a decay begun below the floor, inside a warm-up, stays where it began)."""
        p, floor = min(1.0, progress), min(self.floor, top)
        shape = 0.5 * (1 + math.cos(math.pi * p)) if self.style == "cosine" else 1 - p
        return floor + (top - floor) * shape

    def decay_now(self, k: int, steps: int) -> None:
        """Steps k+1 .. k+steps decay from the rate step k trained at to the floor."""
        top = self(k - 1) if k > 0 else self.base(0)
        self.cut = (k, steps, top)

    def __call__(self, k: int) -> float:
        if self.cut is None or k < self.cut[0]:
            return self.base(k)
        start, steps, top = self.cut
        return self._decay(top, (k - start + 1) / max(1, steps))


def build_scheduler(optimizer, cfg: AdamWConfig, total_steps: int, schedule: LRSchedule | None = None):
    """LambdaLR over `schedule` (by default `LRSchedule(cfg, total_steps)`)."""
    schedule = schedule if schedule is not None else LRSchedule(cfg, total_steps)
    # through a plain function: LambdaLR would save a callable object's settings in its state and put
    # them back on resume, where they come from the config (max_steps may change on resume)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: schedule(k))


class LocalStrategy:
    """AdamW + its schedule (`LRSchedule`) + gradient clipping on one process."""

    def __init__(self, params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer, scheduler,
                 max_norm: float, schedule: LRSchedule | None = None):
        self.params, self.optimizer, self.scheduler, self.max_norm = params, optimizer, scheduler, max_norm
        self.schedule = schedule

    @classmethod
    def from_config(cls, params, optim_cfg: AdamWConfig, total_steps: int, lr: float | None = None) -> LocalStrategy:
        """The trainable ones of `params` under `optim_cfg` for a schedule of `total_steps` optimiser
        steps; `lr` is the peak rate, by default `optim_cfg.learning_rate` (RL gives the actor's or
        the critic's)."""
        params = [p for p in params if p.requires_grad]
        optimizer = build_optimizer(params, optim_cfg, optim_cfg.learning_rate if lr is None else lr)
        schedule = LRSchedule(optim_cfg, total_steps)
        return cls(params, optimizer, build_scheduler(optimizer, optim_cfg, total_steps, schedule), optim_cfg.max_norm,
                   schedule)

    def decay_now(self, steps: int) -> None:
        """Decay the rate to the floor over the next `steps` optimiser steps (`LRSchedule.decay_now`);
        the rate of the next step, set when the last one ended, is set again."""
        k = self.scheduler.last_epoch
        self.schedule.decay_now(k, steps)
        for group, base in zip(self.optimizer.param_groups, self.scheduler.base_lrs):
            group["lr"] = base * self.schedule(k)

    def fit_schedule(self, steps: int, decay_steps: int = 0) -> bool:
        """When the warm-up and a decay of `decay_steps` do not fit in `steps` (what a time cap holds
        at the run's pace), lay the schedule out over `steps` instead (`LRSchedule.plan`: a shorter
        warm-up that reaches the peak) and set the next step's rate again; True when it did."""
        if self.schedule is None or self.schedule.cut is not None or self.schedule.warmup + decay_steps <= steps:
            return False
        k = self.scheduler.last_epoch
        self.schedule.plan(steps)
        for group, base in zip(self.optimizer.param_groups, self.scheduler.base_lrs):
            group["lr"] = base * self.schedule(k)
        return True

    def decaying(self) -> bool:
        """Whether a decay begun early (`decay_now`) is under way or done."""
        return self.schedule is not None and self.schedule.cut is not None

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
        """The rate of the next step (the optimiser's, which `decay_now` may have set since LambdaLR's)."""
        return self.optimizer.param_groups[0]["lr"]

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "lr_decay": self.schedule.cut if self.schedule is not None else None}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.schedule is not None:
            self.schedule.cut = state.get("lr_decay")  # a checkpoint from before early decays has none


def total_optimizer_steps(cfg) -> int:
    """Optimiser steps of a whole RL run (`cfg`: an RLConfig), for the LR schedule: epochs x
    minibatches per rollout."""
    total = cfg.rollout.rollout_batch_size * cfg.rollout.group_size
    return cfg.max_steps * cfg.algo.max_epochs * (total // (cfg.optim.train_batch_size or total))


def make_strategy(params, cfg, lr: float) -> LocalStrategy:
    """An RL run's policy or critic optimiser (`lr`: its peak rate) over the whole run's steps."""
    return LocalStrategy.from_config(params, cfg.optim, total_optimizer_steps(cfg), lr)
