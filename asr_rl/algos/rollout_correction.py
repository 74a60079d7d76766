"""Rollout/trainer mismatch correction: importance weights between the policy the trainer scores
(`old_logp`) and the engine that sampled the tokens (`rollout_logp`: vLLM or the HF sampler).

The rollout engine and the trainer compute the "same" distribution with different kernels,
precisions, batch shapes (and, asynchronously, different weights), so the tokens are off-policy for
the trainer; left alone the gap can grow until training collapses (Yao et al. 2025, "Your efficient
RL framework secretly brings you off-policy RL training", https://fengyao.notion.site/off-policy-rl;
Liu et al. 2025, "When speed kills stability", https://richardli.xyz/rl-collapse). Each entry maps
the token ratio rho_t = exp(old_logp_t - rollout_logp_t) to a per-token weight, detached, that
multiplies the policy loss of that token (OpenRLHF `PolicyLoss`, `--algo.advantage.is_correction_*`).
A weight of 0 drops the token's gradient; the token still counts in the loss normaliser, as in
OpenRLHF.

Pure torch. Shapes: N sequences, T response tokens; `mask` ``(N, T)`` is 1 on response tokens;
anything (-inf included) is allowed at padding.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from asr_rl.registry import Registry
from asr_rl.algos.masked import masked_mean
from asr_rl.algos.masked import zero_outside as _where

# exp() bound for log-ratios (verl's SAFETY_BOUND): exp(20) ~ 4.9e8 is finite in float32
_SAFETY_BOUND = 20.0


@dataclass
class RolloutCorrection:
    """Attributes:
        weights: ``(N, T)`` detached per-token weights of the policy loss (0 at padding).
        metrics: python floats, "rollout_corr/*": the share of valid tokens whose weight is 0
            (masked) and the mean weight.
    """

    weights: Tensor
    metrics: dict[str, float]


@dataclass(frozen=True)
class CorrectionSpec:
    """What a correction declares.

    Attributes:
        upper_only: it gates a divergence (>= 0), bounded from above only: the threshold is [0, high]
            (OpenRLHF 0.11.2 refuses a low bound with `is_correction_gating` binary_kl / tv).
    """

    upper_only: bool = False


CorrectionFn = Callable[[Tensor, Tensor, Tensor, float, float], Tensor]
ROLLOUT_CORRECTIONS: Registry[CorrectionFn] = Registry("rollout correction", CorrectionSpec)


def register_rollout_correction(name: str, **spec) -> Callable[[CorrectionFn], CorrectionFn]:
    """Register `fn(log_rho, rollout_logp, mask, low, high) -> weights (N, T)`; `log_rho` ``(N, T)`` is
    old_logp - rollout_logp and `rollout_logp` the engine's log-probs, both 0 at padding and
    detached; `mask` is bool."""
    return ROLLOUT_CORRECTIONS.register(name, **spec)


def rollout_correction(name: str, old_logp: Tensor, rollout_logp: Tensor, mask: Tensor,
                       threshold: tuple[float, float]) -> RolloutCorrection:
    """Weights of correction `name` with thresholds [low, high].

    Args:
        old_logp: ``(N, T)`` trainer log-probs of the sampled tokens at rollout time.
        rollout_logp: ``(N, T)`` the engine's log-probs of the same tokens.
        mask: ``(N, T)`` response mask.
        threshold: (low, high), 0 <= low < high.
    """
    low, high = threshold
    if not 0 <= low < high:
        raise ValueError(f"rollout correction threshold must be [low, high] with 0 <= low < high, got {list(threshold)}")
    m = mask.bool()
    engine = _where(m, rollout_logp).float().detach()
    log_rho = _where(m, old_logp).float().detach() - engine
    weights = _where(m, ROLLOUT_CORRECTIONS.get(name)(log_rho, engine, m, low, high))
    return RolloutCorrection(weights, {"rollout_corr/masked_frac": masked_mean((weights == 0).float(), m).item(),
                                       "rollout_corr/weight_mean": masked_mean(weights, m).item()})


def mismatch_metrics(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor) -> dict[str, float]:
    """How far the engine is from the trainer, logged whether or not a correction is on:
    "rollout_corr/kl" = mean(rollout_logp - old_logp), the k1 estimate of KL(engine || trainer) on
    the engine's samples (OpenRLHF's `vllm_kl`), "rollout_corr/k3_kl" its non-negative k3 form, and
    "rollout_corr/max_abs_log_ratio"."""
    m = mask.bool()
    log_r = (_where(m, rollout_logp).float() - _where(m, old_logp).float()).detach()
    k3 = torch.expm1(-log_r.clamp(-_SAFETY_BOUND, _SAFETY_BOUND)) + log_r
    return {"rollout_corr/kl": masked_mean(log_r, m).item(), "rollout_corr/k3_kl": masked_mean(k3, m).item(),
            "rollout_corr/max_abs_log_ratio": float(log_r[m].abs().max()) if m.any() else 0.0}


def _rho(log_rho: Tensor) -> Tensor:
    return torch.exp(log_rho.clamp(-_SAFETY_BOUND, _SAFETY_BOUND))


def _in_range(x: Tensor, low: float, high: float) -> Tensor:
    return (x >= low) & (x <= high)


@register_rollout_correction("tis")
def tis(log_rho: Tensor, rollout_logp: Tensor, mask: Tensor, low: float, high: float) -> Tensor:
    """Truncated IS: w_t = clamp(rho_t, low, high) (Yao et al. 2025 truncate at the top; OpenRLHF
    `tis` clamps both sides; low=0 gives the one-sided form)."""
    return _rho(log_rho).clamp(low, high)


@register_rollout_correction("icepop")
def icepop(log_rho: Tensor, rollout_logp: Tensor, mask: Tensor, low: float, high: float) -> Tensor:
    """IcePop (Ling team 2025, arXiv:2510.18855): w_t = rho_t if low <= rho_t <= high, else 0;
    tokens whose engine and trainer disagree too much in either direction give no gradient
    (OpenRLHF `icepop`)."""
    rho = _rho(log_rho)
    return torch.where(_in_range(rho, low, high), rho, torch.zeros_like(rho))


@register_rollout_correction("token_mis")
def token_mis(log_rho: Tensor, rollout_logp: Tensor, mask: Tensor, low: float, high: float) -> Tensor:
    """Token-level masked IS (Liu et al. 2025): w_t = rho_t if rho_t <= high, else 0 (one-sided:
    IcePop without the lower bound; `low` is not used)."""
    return icepop(log_rho, rollout_logp, mask, 0.0, high)


@register_rollout_correction("seq_mis")
def seq_mis(log_rho: Tensor, rollout_logp: Tensor, mask: Tensor, low: float, high: float) -> Tensor:
    """Sequence-level masked IS (Liu et al. 2025): the sequence ratio rho = prod_t rho_t (the
    unbiased sequence weight) for every token of a sequence with rho <= high; 0 for the whole
    sequence otherwise (`low` is not used)."""
    rho_seq = _rho(log_rho.sum(dim=-1, keepdim=True)).expand_as(log_rho)
    return torch.where(rho_seq <= high, rho_seq, torch.zeros_like(rho_seq))


@register_rollout_correction("seq_mask_tis")
def seq_mask_tis(log_rho: Tensor, rollout_logp: Tensor, mask: Tensor, low: float, high: float) -> Tensor:
    """OpenRLHF `seq-mask-tis`: a sequence is kept when the geometric mean of its ratios,
    exp(mean_t log rho_t), lies in [low, high]; a kept token weighs rho_t. As in OpenRLHF 0.11's
    code, rho_t is not clamped (its help text says TIS-clamped): the sequence filter bounds it."""
    seq_log = log_rho.sum(dim=-1, keepdim=True) / mask.sum(dim=-1, keepdim=True).clamp(min=1)
    keep = _in_range(torch.exp(seq_log), low, high)
    rho = _rho(log_rho)
    return torch.where(keep, rho, torch.zeros_like(rho))


# The divergence gates (OpenRLHF 0.11.2 `is_correction_gating` binary_kl | tv, mask mode): a unit (a
# token, or a sequence by the mean of its tokens' divergences) is kept while the divergence between
# the engine's and the trainer's probability of the sampled token stays within [low, high] (a trust
# region, as FlashREINFORCE's per-sequence binary-KL gate); a kept token weighs rho_t, as "icepop".
# The probabilities p (engine) and q (trainer) are clamped to [1e-6, 1 - 1e-6], so the logs stay finite.


def _binary_kl(log_rho: Tensor, rollout_logp: Tensor) -> Tensor:
    """KL(Bernoulli(p) || Bernoulli(q)) = p log(p/q) + (1-p) log((1-p)/(1-q)) per token."""
    p = rollout_logp.exp().clamp(1e-6, 1 - 1e-6)
    q = (rollout_logp + log_rho).exp().clamp(1e-6, 1 - 1e-6)
    return p * (p / q).log() + (1 - p) * ((1 - p) / (1 - q)).log()


def _tv(log_rho: Tensor, rollout_logp: Tensor) -> Tensor:
    """|p - q| per token: the total variation between Bernoulli(p) and Bernoulli(q)."""
    return (rollout_logp.exp().clamp(1e-6, 1 - 1e-6) - (rollout_logp + log_rho).exp().clamp(1e-6, 1 - 1e-6)).abs()


def _gated(stat: Tensor, log_rho: Tensor, mask: Tensor, low: float, high: float, per_sequence: bool) -> Tensor:
    if per_sequence:
        stat = _where(mask, stat).sum(dim=-1, keepdim=True) / mask.sum(dim=-1, keepdim=True).clamp(min=1)
    rho = _rho(log_rho)
    return torch.where(_in_range(stat, low, high), rho, torch.zeros_like(rho))


@register_rollout_correction("token_binary_kl", upper_only=True)
def token_binary_kl(log_rho: Tensor, rollout_logp: Tensor, mask: Tensor, low: float, high: float) -> Tensor:
    return _gated(_binary_kl(log_rho, rollout_logp), log_rho, mask, low, high, per_sequence=False)


@register_rollout_correction("seq_binary_kl", upper_only=True)
def seq_binary_kl(log_rho: Tensor, rollout_logp: Tensor, mask: Tensor, low: float, high: float) -> Tensor:
    return _gated(_binary_kl(log_rho, rollout_logp), log_rho, mask, low, high, per_sequence=True)


@register_rollout_correction("token_tv", upper_only=True)
def token_tv(log_rho: Tensor, rollout_logp: Tensor, mask: Tensor, low: float, high: float) -> Tensor:
    return _gated(_tv(log_rho, rollout_logp), log_rho, mask, low, high, per_sequence=False)


@register_rollout_correction("seq_tv", upper_only=True)
def seq_tv(log_rho: Tensor, rollout_logp: Tensor, mask: Tensor, low: float, high: float) -> Tensor:
    return _gated(_tv(log_rho, rollout_logp), log_rho, mask, low, high, per_sequence=True)


__all__ = ["ROLLOUT_CORRECTIONS", "CorrectionSpec", "RolloutCorrection", "register_rollout_correction", "rollout_correction",
           "mismatch_metrics", "tis", "icepop", "token_mis", "seq_mis", "seq_mask_tis"]
