"""Policy gradient on the high-entropy tokens only (Wang et al. 2025, "Beyond the 80/20 Rule:
High-Entropy Minority Tokens Drive Effective Reinforcement Learning for LLM Reasoning",
arXiv:2506.01939).

The paper keeps the gradient of the top-rho share of tokens by entropy in each batch (rho = 0.2, the
"forking" tokens) and drops it for the others:

    J = 1 / sum_i |o_i| * sum_i sum_t 1[H_i,t >= tau_rho] * min(r_i,t A_i,t, clip(r_i,t) A_i,t)

where tau_rho is the entropy above which the top rho of the batch's tokens lie. The normaliser
still counts every token. Zeroing the advantage of the other tokens is the same thing for a clipped
surrogate (its loss and gradient are then exactly 0 at those tokens), so that is how the trainer
applies it, whatever the policy loss. Pure torch.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor


def high_entropy_tokens(entropy: Tensor, mask: Tensor, top_ratio: float) -> Tensor:
    """The valid tokens whose entropy is among the top ceil(top_ratio * n) of the n valid tokens
    (ties at the threshold are all kept).

    Args:
        entropy: ``(N, T)`` per-token entropy of the policy (anything at padding).
        mask: ``(N, T)`` response mask.
        top_ratio: rho in (0, 1]; 1 keeps every valid token.

    Returns:
        ``(N, T)`` bool, False at padding.
    """
    if not 0 < top_ratio <= 1:
        raise ValueError(f"entropy_token_top_ratio must be in (0, 1] (the paper uses 0.2), got {top_ratio}")
    m = mask.bool()
    valid = entropy.detach()[m]
    if top_ratio >= 1 or valid.numel() == 0:
        return m
    k = max(1, math.ceil(top_ratio * valid.numel() - 1e-9))  # 0.3 * 10 is 3.0000000000000004 in floats
    tau = torch.topk(valid, k).values[-1]
    return m & (entropy.detach() >= tau)


__all__ = ["high_entropy_tokens"]
