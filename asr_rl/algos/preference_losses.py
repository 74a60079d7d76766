"""Preference losses on sequence log-probabilities (a registry): DPO and its variants on pairs, and
KTO on unpaired responses; each entry declares which input it takes (`PreferenceSpec.paired`).

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


@dataclass(frozen=True)
class PreferenceSpec:
    """What a preference loss declares.

    Attributes:
        paired: it learns from (chosen, rejected) pairs of one prompt, `fn(h, beta, label_smoothing)
            -> (B,) losses` with h the implicit reward margin (`dpo_loss`); else from unpaired
            responses labelled desirable or not, `fn(m, desirable, beta, desirable_weight,
            undesirable_weight) -> (B,) losses` with m each response's implicit reward above the
            reference point (`kto_loss`).
    """

    paired: bool = True


PREFERENCE_LOSSES: Registry[Callable[..., torch.Tensor]] = Registry("preference loss", PreferenceSpec)


def register_preference_loss(name: str, paired: bool = True):
    """Decorator registering a loss of the input `paired` declares (`PreferenceSpec`)."""
    return PREFERENCE_LOSSES.register(name, paired=paired)


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
    fn = _loss_fn(loss_type, paired=True)
    chosen = pi_chosen - ref_chosen
    rejected = pi_rejected - ref_rejected
    losses = fn(chosen - rejected, beta, label_smoothing)
    r_c, r_r = (beta * chosen).detach(), (beta * rejected).detach()
    return PreferenceLoss(losses.mean(), {
        "dpo/loss": float(losses.mean().detach()), "dpo/chosen_reward": float(r_c.mean()),
        "dpo/rejected_reward": float(r_r.mean()), "dpo/reward_margin": float((r_c - r_r).mean()),
        "dpo/reward_accuracy": float((r_c > r_r).float().mean())})


@register_preference_loss("kto", paired=False)
def _kto(m: torch.Tensor, desirable: torch.Tensor, beta: float, desirable_weight: float,
         undesirable_weight: float) -> torch.Tensor:
    good = desirable_weight * (1 - torch.sigmoid(beta * m))
    bad = undesirable_weight * (1 - torch.sigmoid(-beta * m))
    return torch.where(desirable, good, bad)


def kto_loss(pi: torch.Tensor, ref: torch.Tensor, desirable: torch.Tensor, pi_mismatched: torch.Tensor,
             ref_mismatched: torch.Tensor, beta: float, desirable_weight: float = 1.0,
             undesirable_weight: float = 1.0, loss_type: str = "kto") -> PreferenceLoss:
    """An unpaired loss (KTO) on B responses. `desirable`: `(B,)` bool. The reference point
    z0 = max(0, mean KL) is estimated from mismatched pairs (each prompt with another example's
    response), without gradient, as the paper and OpenRLHF do. Per response, with r = pi - ref, KTO:
        desirable:   w_d (1 - sigma(beta (r - z0)))
        undesirable: w_u (1 - sigma(beta (z0 - r)))"""
    fn = _loss_fn(loss_type, paired=False)
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    z0 = (pi_mismatched - ref_mismatched).mean().clamp(min=0).detach()
    r = pi - ref
    losses = fn(r - z0, desirable, beta, desirable_weight, undesirable_weight)
    rewards = (beta * r).detach()
    metrics = {"kto/loss": float(losses.mean().detach()), "kto/kl": float(z0)}
    if desirable.any():
        metrics["kto/desirable_reward"] = float(rewards[desirable].mean())
    if (~desirable).any():
        metrics["kto/undesirable_reward"] = float(rewards[~desirable].mean())
    return PreferenceLoss(losses.mean(), metrics)


def _loss_fn(loss_type: str, paired: bool):
    """The registered loss `loss_type`, refused when it takes the other input."""
    fn = PREFERENCE_LOSSES.get(loss_type)
    if PREFERENCE_LOSSES.spec(loss_type).paired != paired:
        kind, other = ("unpaired", "kto_loss") if paired else ("paired", "dpo_loss")
        raise ValueError(f"preference loss {loss_type!r} is {kind}: use {other}")
    return fn


__all__ = ["PreferenceLoss", "PreferenceSpec", "PREFERENCE_LOSSES", "register_preference_loss", "dpo_loss",
           "kto_loss"]
