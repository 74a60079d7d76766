"""Masked statistics over the valid (response) positions of ``(N, T)`` tensors: mean, variance and
whitening, shared by the advantage estimators and the losses (torchtune `torchtune/rlhf/rewards.py`,
from TRL `trl/core.py`). Pure torch."""
from __future__ import annotations

import torch
from torch import Tensor


def zero_outside(mask: Tensor, x: Tensor) -> Tensor:
    """`x` with masked-out positions set to 0 by `torch.where`: padding may hold anything (-inf
    log-probs included) and its gradient is exactly 0 (multiplying -inf by a 0 mask would give NaN)."""
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `x` over positions where `mask` is set.

    Args:
        x: any shape, e.g. ``(N, T)``; values at masked-out positions may be anything (NaN, -inf).
        mask: same shape as `x`, bool or 0/1.
        dim: reduce over this dim only; None = over all elements.

    Returns:
        Scalar (dim=None) or `x` reduced over `dim`. An empty mask gives 0, not NaN.
    """
    m = mask.bool()
    # where, not x * mask: padding may hold -inf/NaN and -inf * 0 = NaN.
    total = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum(dim=dim)
    return total / m.sum(dim=dim).clamp(min=1)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of `x` over positions where `mask` is set (scalar).

    Args:
        x: any shape, e.g. ``(N, T)``.
        mask: same shape as `x`, bool or 0/1.
        unbiased: Bessel correction n/(n-1) as torchtune/TRL; False = population variance (OpenRLHF).
            With a single valid element the unbiased variance is reported as 0 instead of inf.
    """
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean).pow(2), mask)
    if unbiased:
        count = mask.bool().sum()
        var = torch.where(count > 1, var * count / (count - 1).clamp(min=1), torch.zeros_like(var))
    return var


def whiten(x: Tensor, mask: Tensor | None = None, shift_mean: bool = True, *, unbiased: bool = True,
           scale: bool = True) -> Tensor:
    """Normalise `x` to unit variance over the valid positions (torchtune/TRL `whiten`).

    ``(x - mean) * rsqrt(max(var, 1e-8))``; the variance floor is OpenRLHF's
    (`var.clamp(min=1e-8).rsqrt()` in `_normalize_advantages`).

    Args:
        x: ``(N, T)`` (any shape works).
        mask: same shape as `x`; None = all valid. Masked-out positions come back as 0.
        shift_mean: True = result has zero mean (TRL's meaning); False = the mean is added back, only
            the scale changes. NOTE: torchtune's copy adds the mean back when shift_mean=True, the
            opposite of TRL; we keep TRL's meaning, which matches the flag's name.
        unbiased: see `masked_var`; OpenRLHF's advantage normalisation uses the population variance.
        scale: False = centre only, no division by the std (OpenRLHF `--algo.advantage.no_std_norm`).
    """
    if mask is None:
        mask = torch.ones_like(x, dtype=torch.bool)
    m = mask.bool()
    mean = masked_mean(x, m)
    var = masked_var(x, m, unbiased=unbiased)
    out = (x - mean) * var.clamp(min=1e-8).rsqrt() if scale else x - mean
    if not shift_mean:
        out = out + mean
    return torch.where(m, out, torch.zeros_like(out))
