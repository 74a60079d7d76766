"""Loss aggregation: how a per-token loss ``(N, T)`` becomes a scalar (a registry, `loss_agg_mode`),
and the unit each mode averages over, so that an optimiser step of several micro-batches and
data-parallel ranks divides by the count over the whole step (trainer/update/ppo.py `micro_weights`).
Pure torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from asr_rl.algos.masked import zero_outside as _where
from asr_rl.registry import Registry


@dataclass(frozen=True)
class AggSpec:
    """What a loss aggregation declares.

    Attributes:
        unit: what the mode averages over, so that an optimiser step made of several micro-batches
            (and data-parallel ranks) divides by the count of that unit over the whole step
            (`agg_count`; OpenRLHF 0.11.2 `aggregate_loss` with `batch_num_tokens` /
            `global_batch_size`): "token" (valid tokens), "sequence" (sequences with at least one
            valid token) or "row" (all sequences).
    """

    unit: str = "token"


# `fn(x, m) -> (total, count)`: x ``(N, T)`` the per-token loss, 0 at padding; m ``(N, T)`` the bool
# mask; the aggregate is total / count, and `count` is the number of the spec's `unit` in `m`.
LOSS_AGG_MODES: Registry[Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]] = Registry("loss_agg_mode", AggSpec)


@LOSS_AGG_MODES.register("token-mean", unit="token")
def _token_mean(x: Tensor, m: Tensor) -> tuple[Tensor, Tensor]:
    return x.sum(), m.sum()


@LOSS_AGG_MODES.register("seq-mean-token-mean", unit="sequence")
def _seq_mean_token_mean(x: Tensor, m: Tensor) -> tuple[Tensor, Tensor]:
    per_seq = x.sum(dim=-1) / m.sum(dim=-1).clamp(min=1)
    has_tokens = m.any(dim=-1)
    return _where(has_tokens, per_seq).sum(), has_tokens.sum()


@LOSS_AGG_MODES.register("seq-mean-token-sum", unit="row")
def _seq_mean_token_sum(x: Tensor, m: Tensor) -> tuple[Tensor, Tensor]:
    return x.sum(), torch.tensor(m.shape[0], device=m.device)


def aggregate_loss(loss_mat: Tensor, mask: Tensor, mode: str) -> Tensor:
    """Reduce a per-token loss to a scalar (verl `agg_loss`, OpenRLHF `aggregate_loss`).

    - "token-mean": sum over all valid tokens / number of valid tokens (DAPO, arXiv:2503.14476: long
      sequences weigh by their length).
    - "seq-mean-token-mean": mean over sequences of each sequence's token mean (GRPO paper,
      arXiv:2402.03300); sequences with no valid token are left out of the mean.
    - "seq-mean-token-sum": mean over all N sequences of each sequence's token sum (Dr. GRPO,
      arXiv:2503.20783: a constant normaliser, no length bias).

    Args:
        loss_mat: ``(N, T)`` per-token loss; anything at padding.
        mask: ``(N, T)`` response mask.
        mode: a name in `LOSS_AGG_MODES`.

    Returns:
        Scalar; 0 (still differentiable) when there is no valid token. Over an optimiser step of
        several micro-batches the update weighs each by its `agg_count` over the step's.
    """
    fn = LOSS_AGG_MODES.get(mode)
    if loss_mat.shape != mask.shape:
        raise ValueError(f"loss_mat {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} differ in shape")
    m = mask.bool()
    total, count = fn(_where(m, loss_mat), m)
    return total / count.clamp(min=1)


def agg_count(mode: str, mask: Tensor) -> float:
    """How many of mode `mode`'s units (`AggSpec.unit`) ``(N, T)`` `mask` holds: valid tokens,
    sequences with a valid token, or rows."""
    m = mask.bool()
    return float(LOSS_AGG_MODES.get(mode)(torch.zeros(m.shape, device=m.device), m)[1])


__all__ = ["AggSpec", "LOSS_AGG_MODES", "aggregate_loss", "agg_count"]
