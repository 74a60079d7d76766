"""From sequence rewards to per-token returns and GAE: the building blocks of the advantage
estimators (advantages.py). Pure torch; shapes as there (N rows, T response tokens).
"""
from __future__ import annotations

import torch
from torch import Tensor

from asr_rl.algos.groups import clip_rewards


def token_rewards(seq_rewards: Tensor, mask: Tensor, kl_penalty: Tensor | None = None,
                  clip: tuple[float, ...] | None = None) -> Tensor:
    """Per-token rewards: the sequence reward (clipped to `clip`) at the last response token, minus
    the KL penalty everywhere.

    OpenRLHF `compute_reward`, which clips the reward it is given (the group-shaped one for the
    group estimators); the "score at the final token" convention comes from OpenAI
    lm-human-preferences (Ziegler et al. 2019, arXiv:1909.08593).

    Args:
        seq_rewards: ``(N,)``.
        mask: ``(N, T)`` response mask.
        kl_penalty: ``(N, T)`` kl_coef * kl, or None.
        clip: [low, high] for the sequence reward, or None.

    Returns:
        ``(N, T)``, zero at padding.
    """
    seq_rewards = clip_rewards(seq_rewards, clip)
    m = mask.bool()
    T = m.size(1)
    # Index of the last 1 in each row, valid for any mask (not only right-padded); a row with no
    # response tokens gets T-1, which is masked out below.
    last = T - 1 - m.long().flip(1).argmax(dim=1, keepdim=True)
    out = torch.zeros(m.shape, dtype=seq_rewards.dtype, device=seq_rewards.device)
    out.scatter_(1, last, seq_rewards.unsqueeze(1))
    if kl_penalty is not None:
        out = out - torch.where(m, kl_penalty.to(out.dtype), torch.zeros_like(out))
    return torch.where(m, out, torch.zeros_like(out))


def discounted_returns(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """Reward-to-go G_t = sum_{k>=t} gamma^(k-t) r_k (REINFORCE, Williams 1992; OpenRLHF
    `get_cumulative_returns`).

    Args:
        rewards: ``(N, T)`` per-token rewards.
        mask: ``(N, T)`` response mask.
        gamma: discount factor.

    Returns:
        ``(N, T)``, zero at padding.
    """
    m = mask.bool()
    r = torch.where(m, rewards, torch.zeros_like(rewards))
    if gamma == 1.0:
        # Undiscounted: one reversed cumsum instead of a Python loop over T.
        out = r.flip(1).cumsum(1).flip(1)
    else:
        out = torch.zeros_like(r)
        running = torch.zeros_like(r[:, 0])
        for t in reversed(range(r.size(1))):
            running = r[:, t] + gamma * running
            out[:, t] = running
    return torch.where(m, out, torch.zeros_like(out))


def gae_advantages(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lambd: float) -> tuple[Tensor, Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2015, arXiv:1506.02438), OpenRLHF
    `get_advantages_and_returns`.

    delta_t = r_t + gamma * V_{t+1} - V_t (V after the last token is 0);
    A_t = delta_t + gamma * lambd * A_{t+1}; returns R_t = A_t + V_t.

    Args:
        rewards: ``(N, T)`` per-token rewards.
        values: ``(N, T)`` critic values.
        mask: ``(N, T)`` response mask (right-padded).
        gamma, lambd: discount and GAE lambda.

    Returns:
        (advantages, returns), each ``(N, T)`` and zero at padding. Not whitened.
    """
    m = mask.bool()
    zero = torch.zeros_like(rewards)
    # Masking values makes V_{t+1} = 0 past the last response token, i.e. a terminal state.
    v = torch.where(m, values.to(rewards.dtype), zero)
    r = torch.where(m, rewards, zero)
    adv = torch.zeros_like(r)
    last = torch.zeros_like(r[:, 0])
    T = r.size(1)
    for t in reversed(range(T)):
        next_v = v[:, t + 1] if t + 1 < T else torch.zeros_like(last)
        delta = r[:, t] + gamma * next_v - v[:, t]
        last = delta + gamma * lambd * last
        adv[:, t] = last
    adv = torch.where(m, adv, zero)
    return adv, torch.where(m, adv + v, zero)


__all__ = ["token_rewards", "discounted_returns", "gae_advantages"]
