"""Reward shaping before the advantage estimator: combining multi-term rewards by normalising each
term within its group (GDPO). Clipping (`clip_rewards`) happens inside the estimators, after their
group baseline, as OpenRLHF's `compute_reward`. Pure torch.

Shapes: N samples, rows of a group contiguous (group_size n); K reward terms.
"""
from __future__ import annotations

from torch import Tensor

from asr_rl.algos.advantages import _grouped, clip_rewards  # noqa: F401 (re-exported)


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
    g = _grouped(terms.reshape(-1).float(), group_size, "normalize_then_sum").view(K, N // group_size, group_size)
    z = (g - g.mean(dim=-1, keepdim=True)) / (g.std(dim=-1, keepdim=True) + eps)
    return (weights.float().view(K, 1, 1) * z).sum(dim=0).reshape(N)
