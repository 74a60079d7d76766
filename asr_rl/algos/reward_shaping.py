"""Reward shaping before the advantage estimator, in one place (`shape_rewards`): how multi-term
rewards combine (a registry, `algo.reward_aggregation`: their weighted sum, or each term normalised
within its group, GDPO), then the length penalties (DAPO's overlong, ProRL's stop-properly). Clipping
(`groups.clip_rewards`) happens inside the estimators, after their group baseline, as OpenRLHF's
`compute_reward`. Pure torch.

Shapes: N samples, rows of a group contiguous (group_size n); K reward terms.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from asr_rl.algos.groups import grouped
from asr_rl.registry import Registry


@dataclass(frozen=True)
class AggregationSpec:
    """What a reward aggregation declares.

    Attributes:
        per_term: it combines the built-in reward terms one by one, so it needs each sample's
            value of every `reward.terms` entry; a reward that gives one score (remote, file,
            reward model) cannot feed it.
    """

    per_term: bool = False


# `fn(rewards, terms, weights, group_size, eps) -> (N,)`: rewards ``(N,)`` the reward's own weighted
# sum; terms ``(K, N)`` and weights ``(K,)``, given only to a `per_term` entry (None otherwise).
REWARD_AGGREGATIONS: Registry[Callable[..., Tensor]] = Registry("reward_aggregation", AggregationSpec)


@REWARD_AGGREGATIONS.register("sum")
def _sum(rewards: Tensor, terms: Tensor | None, weights: Tensor | None, group_size: int, eps: float) -> Tensor:
    return rewards


@REWARD_AGGREGATIONS.register("normalize_then_sum", per_term=True)
def _normalize_then_sum(rewards: Tensor, terms: Tensor, weights: Tensor, group_size: int, eps: float) -> Tensor:
    return normalize_then_sum(terms, weights, group_size, eps)


def normalize_then_sum(terms: Tensor, weights: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """Multi-term rewards normalised per term within each group, then summed by weight (GDPO; TRL
    `multi_objective_aggregation="normalize_then_sum"`): sum_k w_k (t_k - mean_group) / (std_group + eps).
    A term whose values barely vary in a group (a language term at ~1) then still ranks the samples
    on its own scale instead of vanishing under the larger terms' spread; a term that ties gives 0.

    Args:
        terms: ``(K, N)`` per-term values of the N samples (rows of a group contiguous).
        weights: ``(K,)`` term weights.
        group_size: n samples per prompt.
        eps: added to each term's group std (unbiased, as "group_norm").

    Returns:
        ``(N,)`` the combined reward the estimator then takes.
    """
    K, N = terms.shape
    if weights.shape != (K,):
        raise ValueError(f"weights must be ({K},) for {K} terms, got {tuple(weights.shape)}")
    g = grouped(terms.reshape(-1).float(), group_size, "normalize_then_sum").view(K, N // group_size, group_size)
    z = (g - g.mean(dim=-1, keepdim=True)) / (g.std(dim=-1, keepdim=True) + eps)
    return (weights.float().view(K, 1, 1) * z).sum(dim=0).reshape(N)


def overlong_penalty(lengths: Tensor, max_new_tokens: int, buffer_len: float, factor: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476; OpenRLHF 0.11.2
    `apply_overlong_penalty`): -min(L - (max_new_tokens - buffer_len), buffer_len) / buffer_len * factor
    for a response of L > max_new_tokens - buffer_len tokens, 0 otherwise; added to its reward. An
    ASR output that loops until `max_new_tokens` loses the whole `factor`.

    Args:
        lengths: ``(N,)`` response lengths in tokens (EOS included when emitted).
        max_new_tokens: the rollout's length limit.
        buffer_len: the penalty ramps over the last `buffer_len` tokens before the limit.
        factor: the largest penalty.

    Returns:
        ``(N,)`` the penalty, <= 0.
    """
    if not 0 < buffer_len <= max_new_tokens:
        raise ValueError(f"overlong_buffer_len must be in (0, max_new_tokens={max_new_tokens}], got {buffer_len}")
    exceed = (lengths.float() - (max_new_tokens - buffer_len)).clamp(max=buffer_len)
    return torch.where(exceed > 0, -exceed / buffer_len * factor, torch.zeros_like(exceed))


def stop_properly(rewards: Tensor, truncated: Tensor, coef: float) -> Tensor:
    """ProRL's stop-properly penalty (Liu et al. 2025, arXiv:2505.24864; OpenRLHF 0.11.2
    `apply_stop_properly_penalty`): the reward of a response cut at the length limit without EOS is
    multiplied by `coef` in [0, 1], or replaced by `coef` when it is negative.

    Args:
        rewards: ``(N,)``.
        truncated: ``(N,)`` bool, the response hit the length limit without ending.
        coef: as above.

    Returns:
        ``(N,)`` the rewards, the truncated ones penalised.
    """
    if coef > 1:
        raise ValueError(f"stop_properly_penalty_coef must be in [0, 1] (a scale) or < 0 (a reward), got {coef}")
    penalised = torch.full_like(rewards, coef) if coef < 0 else rewards * coef
    return torch.where(truncated.bool(), penalised, rewards)


@dataclass(frozen=True)
class LengthPenalties:
    """The length penalties on sampled rows (None: off).

    Attributes:
        max_new_tokens: the rollout's length limit.
        overlong_buffer_len, overlong_penalty_factor: DAPO's soft overlong punishment (`overlong_penalty`).
        stop_properly_penalty_coef: ProRL's factor on the reward of a row cut at the limit (`stop_properly`).
    """

    max_new_tokens: int
    overlong_buffer_len: float | None = None
    overlong_penalty_factor: float = 1.0
    stop_properly_penalty_coef: float | None = None


def shape_rewards(rewards: Tensor, terms: Tensor | None, weights: Tensor | None, group_size: int, aggregation: str,
                  eps: float, lengths: Tensor, sampled: Tensor, ended: Tensor | None,
                  penalties: LengthPenalties) -> Tensor:
    """The sequence rewards the estimator takes: the terms combined by `aggregation` (a
    `REWARD_AGGREGATIONS` name), then the length penalties on the sampled rows (before the
    estimator, as OpenRLHF 0.11.2 `apply_length_penalties`); a row the policy did not sample (a
    group's reference transcript) keeps its reward.

    Args:
        rewards: ``(N,)`` the reward's combined rewards.
        terms: ``(K, N)`` per-term rewards, or None (a `per_term` aggregation needs them).
        weights: ``(K,)`` the terms' weights, or None.
        lengths: ``(N,)`` response lengths.
        sampled: ``(N,)`` bool, the rows the policy sampled.
        ended: ``(N,)`` bool, the rows whose last token is EOS (`groups.ended_with_eos`); needed only
            with the stop-properly penalty.

    Returns:
        ``(N,)``.
    """
    out = REWARD_AGGREGATIONS.get(aggregation)(rewards, terms, weights, group_size, eps)
    p = penalties
    if p.overlong_buffer_len is not None:
        penalty = overlong_penalty(lengths, p.max_new_tokens, p.overlong_buffer_len, p.overlong_penalty_factor)
        out = out + torch.where(sampled, penalty, torch.zeros_like(penalty))
    if p.stop_properly_penalty_coef is not None:
        # cut at the limit: as long as it may be, and its last token is not EOS (vLLM's finish_reason "length")
        out = stop_properly(out, sampled & (lengths >= p.max_new_tokens) & ~ended, p.stop_properly_penalty_coef)
    return out


def in_band(mean_reward: float, band: tuple[float, ...] | None) -> bool:
    """Whether a group's mean reward lies strictly inside `band` = (low, high) (OpenRLHF 0.11.2
    `--algo.dynamic_filtering_range`: `min_r < avg_reward < max_r`); None = any."""
    return band is None or band[0] < mean_reward < band[1]
