"""How a rank applies gradients: the plain torch optimiser here, DeepSpeed in
`trainer/distributed/deepspeed_strategy.py`. The update code calls only `backward`, `step`,
`mean_over_ranks`, `gathered` and `state_dict`, so it is the same on both backends (OpenRLHF's `strategy.backward/optimizer_step`)."""
from __future__ import annotations

import contextlib
import math

import torch



def build_optimizer(params, lr: float, weight_decay: float, betas: tuple[float, ...]) -> torch.optim.Optimizer:
    """AdamW with no weight decay on biases and norms (1-D tensors)."""
    params = [p for p in params if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=tuple(betas))


def build_scheduler(optimizer, max_steps: int, warmup_ratio: float, min_lr_ratio: float):
    """Linear warmup, then cosine decay to `min_lr_ratio` of the peak (OpenRLHF's
    `cosine_with_min_lr`)."""
    warmup = int(math.ceil(warmup_ratio * max_steps))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class LocalStrategy:
    """AdamW + warmup/cosine schedule + gradient clipping on one process."""

    def __init__(self, params: list[torch.nn.Parameter], lr: float, weight_decay: float, betas: tuple[float, ...],
                 max_norm: float, total_steps: int, warmup_ratio: float, min_lr_ratio: float):
        self.params = [p for p in params if p.requires_grad]
        self.optimizer = build_optimizer(self.params, lr, weight_decay, betas)
        self.scheduler = build_scheduler(self.optimizer, total_steps, warmup_ratio, min_lr_ratio)
        self.max_norm = max_norm

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
