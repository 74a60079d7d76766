"""KL to the reference policy: the per-token estimators, the penalty in the reward, and the
coefficient controllers (OpenRLHF `compute_approx_kl`, `kl_controller.py`). The KL term in the loss is
`losses.kl_loss`. Pure torch.

Shapes: N sequences, T response tokens; `mask` ``(N, T)`` is 1 on response tokens.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from asr_rl.algos.masked import masked_mean
from asr_rl.algos.masked import zero_outside as _where
from asr_rl.registry import Registry

# `fn(log_ratio, clamp) -> (N, T) estimate`; `algo.kl_estimator` names one, checked at config load.
KL_ESTIMATORS: Registry[Callable[[Tensor, float | None], Tensor]] = Registry("kl_estimator")


@KL_ESTIMATORS.register("k1")
def _k1(log_ratio: Tensor, clamp: float | None) -> Tensor:
    return log_ratio


@KL_ESTIMATORS.register("k2")
def _k2(log_ratio: Tensor, clamp: float | None) -> Tensor:
    return log_ratio.pow(2) / 2.0


@KL_ESTIMATORS.register("k3")
def _k3(log_ratio: Tensor, clamp: float | None) -> Tensor:
    if clamp is not None:  # so exp() stays finite under the final clamp (see `kl_estimate`)
        log_ratio = log_ratio.clamp(-(clamp + 10.0), clamp + 10.0)
    return torch.expm1(-log_ratio) + log_ratio


def kl_estimate(logp: Tensor, ref_logp: Tensor, estimator: str = "k3", clamp: float | None = 10.0) -> Tensor:
    """Per-token estimate of KL(pi || ref) from tokens sampled by pi (Schulman, "Approximating KL
    divergence", http://joschu.net/blog/kl-approx.html), as OpenRLHF `compute_approx_kl`.

    With log_ratio = logp - ref_logp: k1 = log_ratio (unbiased, can be negative),
    k2 = log_ratio^2 / 2, k3 = exp(-log_ratio) - 1 + log_ratio (unbiased, >= 0, low variance).
    The estimate is clamped to [-clamp, clamp] (OpenRLHF: [-10, 10]), so that one token whose
    ratio went astray (k3 at a log-ratio of -9 is 8,093) cannot dominate a loss; a clamped token
    has zero gradient. For k3 the log-ratio itself is also bounded (to +-(clamp + 10)) first, so
    exp() stays finite and the zero gradient is not 0 * inf = NaN; below the bound k3 is exact.

    Args:
        logp: ``(N, T)`` policy log-probs of the sampled tokens.
        ref_logp: ``(N, T)`` reference log-probs of the same tokens.
        estimator: a name in `KL_ESTIMATORS`.
        clamp: bound on |estimate| (`algo.kl_clamp`); None = unbounded (k3 may overflow to inf).

    Returns:
        ``(N, T)`` float32; padding is NOT zeroed (callers mask, and should pass finite values there).
    """
    fn = KL_ESTIMATORS.get(estimator)
    if clamp is not None and clamp <= 0:
        raise ValueError(f"kl clamp must be > 0 or None, got {clamp}")
    # float32 as OpenRLHF: bf16 log-ratios of near-equal log-probs lose all precision.
    kl = fn(logp.float() - ref_logp.float(), clamp)
    return kl if clamp is None else kl.clamp(-clamp, clamp)


def reward_kl_penalty(old_logp: Tensor | None, ref_logp: Tensor | None, mask: Tensor, estimator: str = "k3",
                      clamp: float | None = 10.0, coef: float = 0.0) -> tuple[Tensor | None, dict[str, float]]:
    """The per-token KL penalty subtracted from the token rewards (PPO's KL in the reward, Ziegler
    et al. 2019, arXiv:1909.08593) and the measured KL, from the rollout's log-probs.

    Args:
        old_logp: ``(N, T)`` log-probs of the policy that sampled, or None (not computed).
        ref_logp: ``(N, T)`` reference log-probs, or None (no reference).
        mask: ``(N, T)`` response mask.
        estimator, clamp: as `kl_estimate`.
        coef: KL coefficient of the penalty; 0 = KL measured only (it is in the loss instead).

    Returns:
        (``(N, T)`` coef * kl zero at padding, or None when coef is 0 or nothing to measure;
        {"kl/mean": masked mean KL} when measured, else {}).
    """
    if old_logp is None or ref_logp is None:
        return None, {}
    m = mask.bool()
    kl = _where(m, kl_estimate(_where(m, old_logp), _where(m, ref_logp), estimator, clamp))
    return (coef * kl if coef else None), {"kl/mean": float(masked_mean(kl, m))}




class FixedKLController:
    """Constant KL coefficient; `update` is a no-op."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


class AdaptiveKLController:
    """Proportional controller that steers the measured KL towards `target` (Ziegler et al. 2019,
    arXiv:1909.08593, section 2.2):

        e = clip(current_kl / target - 1, -0.2, 0.2);  value *= 1 + e * n_steps / horizon
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: int):
        if target <= 0 or horizon <= 0:
            raise ValueError(f"AdaptiveKLController needs target > 0 and horizon > 0, got {target}, {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
