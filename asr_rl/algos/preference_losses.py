"""Preference losses on sequence log-probabilities: DPO and its variants (a registry), and KTO.

Every input is a `(B,)` tensor of a response's summed token log-probabilities under the policy
(`pi_*`) or the frozen reference (`ref_*`). Pure functions, no model code.

DPO (Rafailov et al. 2023, "Direct Preference Optimization", arXiv:2305.18290, eq. 7), with
h = (pi_c - ref_c) - (pi_r - ref_r), the implicit reward margin:
    sigmoid: -(1 - eps) log sigma(beta h) - eps log sigma(-beta h)
             (eps = label_smoothing: conservative DPO, the labels are flipped with probability eps)
    ipo:     (h - 1 / (2 beta))^2   (Azar et al. 2023, "A General Theoretical Paradigm to Understand
             Learning from Human Preferences", arXiv:2310.12036, eq. 17)
    hinge:   max(0, 1 - beta h)     (SLiC, Zhao et al. 2023, arXiv:2305.10425)
as OpenRLHF's `DPOLoss` and TRL's `loss_type` compute them on summed log-probs.

KTO (Ethayarajh et al. 2024, "KTO: Model Alignment as Prospect Theoretic Optimization",
arXiv:2402.01306, eq. 8) on unpaired responses labelled desirable or not.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from asr_rl.registry import Registry


@dataclass
class PreferenceLoss:
    """`loss`: the batch mean; `metrics`: floats for the logs."""

    loss: torch.Tensor
    metrics: dict[str, float]


PREFERENCE_LOSSES: Registry[Callable[..., torch.Tensor]] = Registry("preference loss")


def register_preference_loss(name: str):
    """`fn(h, beta, label_smoothing) -> (B,) losses`, h the implicit reward margin."""
    return PREFERENCE_LOSSES.register(name)


@register_preference_loss("sigmoid")
def _sigmoid(h: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    return -F.logsigmoid(beta * h) * (1 - label_smoothing) - F.logsigmoid(-beta * h) * label_smoothing


@register_preference_loss("ipo")
def _ipo(h: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    return (h - 1 / (2 * beta)) ** 2


@register_preference_loss("hinge")
def _hinge(h: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    return torch.relu(1 - beta * h)


def dpo_loss(pi_chosen: torch.Tensor, pi_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float, loss_type: str = "sigmoid",
             label_smoothing: float = 0.0) -> PreferenceLoss:
    """The DPO-family loss of B pairs (all inputs `(B,)`), and the implicit rewards
    beta (pi - ref) of the chosen and rejected responses."""
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    chosen = pi_chosen - ref_chosen
    rejected = pi_rejected - ref_rejected
    losses = PREFERENCE_LOSSES.get(loss_type)(chosen - rejected, beta, label_smoothing)
    r_c, r_r = (beta * chosen).detach(), (beta * rejected).detach()
    return PreferenceLoss(losses.mean(), {
        "dpo/loss": float(losses.mean().detach()), "dpo/chosen_reward": float(r_c.mean()),
        "dpo/rejected_reward": float(r_r.mean()), "dpo/reward_margin": float((r_c - r_r).mean()),
        "dpo/reward_accuracy": float((r_c > r_r).float().mean())})


def kto_loss(pi: torch.Tensor, ref: torch.Tensor, desirable: torch.Tensor, pi_mismatched: torch.Tensor,
             ref_mismatched: torch.Tensor, beta: float, desirable_weight: float = 1.0,
             undesirable_weight: float = 1.0) -> PreferenceLoss:
    """KTO on B responses. `desirable`: `(B,)` bool. The reference point z0 = max(0, mean KL) is
    estimated from mismatched pairs (each prompt with another example's response), without
    gradient, as the paper and OpenRLHF do. Per response, with r = pi - ref:
        desirable:   w_d (1 - sigma(beta (r - z0)))
        undesirable: w_u (1 - sigma(beta (z0 - r)))"""
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    z0 = (pi_mismatched - ref_mismatched).mean().clamp(min=0).detach()
    r = pi - ref
    good = desirable_weight * (1 - torch.sigmoid(beta * (r - z0)))
    bad = undesirable_weight * (1 - torch.sigmoid(beta * (z0 - r)))
    losses = torch.where(desirable, good, bad)
    rewards = (beta * r).detach()
    metrics = {"kto/loss": float(losses.mean().detach()), "kto/kl": float(z0)}
    if desirable.any():
        metrics["kto/desirable_reward"] = float(rewards[desirable].mean())
    if (~desirable).any():
        metrics["kto/undesirable_reward"] = float(rewards[~desirable].mean())
    return PreferenceLoss(losses.mean(), metrics)


__all__ = ["PreferenceLoss", "PREFERENCE_LOSSES", "register_preference_loss", "dpo_loss", "kto_loss"]
