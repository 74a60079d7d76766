"""Off-policy members of a group: LUFFY's policy shaping (Yan et al. 2025, "Learning to Reason under
Off-Policy Guidance", arXiv:2504.14945).

A group may hold sequences the policy did not sample (the reference transcript, with its reward:
`rollout.reference_in_group`). Their behaviour probability is unknown, so LUFFY sets it to 1: the
importance ratio of an off-policy token is pi_theta itself, and it is not clipped. Policy shaping
replaces that ratio with f(pi) = pi / (pi + gamma), gamma = 0.1 (LUFFY's default). Its gradient is
d f(pi) = gamma / (pi + gamma)^2 d pi = [gamma pi / (pi + gamma)^2] d log pi: against the unshaped
ratio's pi d log pi, a token weighs gamma / (pi + gamma)^2 times as much, up to 1/gamma = 10 times
for the tokens the policy finds unlikely (those the guidance teaches), less than once above
pi = sqrt(gamma) - gamma (~0.22): LUFFY's remedy for the vanishing gradient of unlikely tokens.
The advantage of an off-policy member comes from the same group normalisation as the others (its
reward counts in the group's mean and std: LUFFY normalises over the union of the on- and
off-policy members). The KL estimators and the rollout correction only hold for sampled tokens: the
trainer leaves the off-policy rows out of them.

Pure functions; shapes: N sequences, T tokens, `off_policy` ``(N,)`` bool.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from asr_rl.algos.masked import masked_mean

# LUFFY's gamma (arXiv:2504.14945; its code's `off_policy_reshape="p_div_p_0.1"`)
LUFFY_GAMMA = 0.1


def luffy_shaping(logp: Tensor, gamma: float = LUFFY_GAMMA) -> Tensor:
    """f(pi) = pi / (pi + gamma) of the token probabilities pi = exp(logp), computed as
    sigmoid(logp - log gamma) (the same value, without overflow for any logp).

    Args:
        logp: ``(N, T)`` log-probs under the current policy (with grad), finite.
        gamma: the shaping constant, > 0.

    Returns:
        ``(N, T)`` in (0, 1).
    """
    if not gamma > 0:
        raise ValueError(f"the policy-shaping gamma must be > 0 (LUFFY uses 0.1), got {gamma}")
    return torch.sigmoid(logp - math.log(gamma))


def mix_off_policy(loss_mat: Tensor, logp: Tensor, advantages: Tensor, mask: Tensor, off_policy: Tensor,
                   gamma: float = LUFFY_GAMMA) -> tuple[Tensor, dict[str, float]]:
    """LUFFY's mixed objective per token: the on-policy rows keep their (clipped) surrogate loss,
    the off-policy rows get -A * f(pi_theta), unclipped and without an importance ratio.

    Args:
        loss_mat: ``(N, T)`` per-token loss of the on-policy surrogate (anything at padding).
        logp: ``(N, T)`` current log-probs (with grad; anything at padding).
        advantages: ``(N, T)``.
        mask: ``(N, T)`` response mask.
        off_policy: ``(N,)`` bool, True for the rows the policy did not sample.
        gamma: the shaping constant.

    Returns:
        (``(N, T)`` the mixed per-token loss, metrics "policy/off_policy_prob" (mean pi over the
        off-policy tokens) and "policy/off_policy_shaped" (mean f(pi)); both 0 without such tokens).
    """
    m = mask.bool()
    off = off_policy.bool().to(m.device)[:, None] & m
    lp = torch.where(m, logp, torch.zeros((), dtype=logp.dtype, device=logp.device))
    shaped = luffy_shaping(lp, gamma)
    adv = torch.where(m, advantages, torch.zeros((), dtype=advantages.dtype, device=advantages.device))
    mixed = torch.where(off, -adv * shaped, loss_mat)
    with torch.no_grad():
        metrics = {"policy/off_policy_prob": float(masked_mean(lp.exp(), off)),
                   "policy/off_policy_shaped": float(masked_mean(shaped, off))}
    return mixed, metrics


def on_policy_mask(mask: Tensor, off_policy: Tensor | None) -> Tensor:
    """``(N, T)`` bool: the response tokens of the rows the policy sampled (all of them when
    `off_policy` is None)."""
    m = mask.bool()
    return m if off_policy is None else m & ~off_policy.bool().to(m.device)[:, None]


__all__ = ["LUFFY_GAMMA", "luffy_shaping", "mix_off_policy", "on_policy_mask"]
