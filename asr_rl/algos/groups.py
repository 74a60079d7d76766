"""Small pieces the estimators, the reward shaping and the losses share: the group layout of a batch
(`grouped`), reward clipping, and whether a response ended with EOS. Pure torch.

Layout: N = num_prompts * group_size rows, the rows of one prompt contiguous (row b*n + j is sample j of
prompt b); T response tokens.
"""
from __future__ import annotations

from torch import Tensor


def grouped(rewards: Tensor, n: int, name: str) -> Tensor:
    """``(N,)`` -> ``(N // n, n)``, with a ValueError naming the estimator when the layout is wrong."""
    N = rewards.numel()
    if n < 2:
        raise ValueError(f"advantage_estimator {name!r} needs group_size >= 2 (n_samples_per_prompt), got {n}")
    if N % n != 0:
        raise ValueError(f"advantage_estimator {name!r}: {N} rewards are not a multiple of group_size {n}")
    return rewards.view(N // n, n)


def clip_rewards(rewards: Tensor, clip_range: tuple[float, ...] | None) -> Tensor:
    """``(N,)`` sequence rewards clipped to [low, high] (OpenRLHF `reward_clip_range`); None = as given."""
    if clip_range is None:
        return rewards
    low, high = clip_range
    return rewards.clamp(min=low, max=high)


def ended_with_eos(ids: Tensor, mask: Tensor, eos_id: int) -> Tensor:
    """Whether each response ended: its last valid token is `eos_id` (else it was cut at
    max_new_tokens).

    Args:
        ids: ``(N, T)`` response ids.
        mask: ``(N, T)`` response mask (any padding layout).
        eos_id: the end-of-sequence id.

    Returns:
        ``(N,)`` bool; False for a row with no valid token.
    """
    m = mask.bool()
    last = m.size(1) - 1 - m.long().flip(1).argmax(dim=1)
    return m.any(dim=1) & (ids.gather(1, last[:, None]).squeeze(1) == eos_id)


__all__ = ["grouped", "clip_rewards", "ended_with_eos"]
