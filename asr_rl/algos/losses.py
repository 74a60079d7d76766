"""Losses of the update step: clipped policy surrogates (a registry), the KL-to-reference loss term,
value and entropy terms, and loss aggregation (the KL estimators, the reward penalty and the
coefficient controllers are in `trainer/kl.py`, re-exported here).

Pure functions of tensors and numbers. Every function is NaN-safe at masked positions: padding may hold
anything (-inf log-probs included), so inputs are replaced with 0 there by `torch.where` before any
arithmetic, which also gives exactly zero gradient at padding (multiplying -inf by a 0 mask would not).

Shapes: N sequences, T response tokens; `mask` ``(N, T)`` is 1 on response tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from asr_rl.registry import Registry
from asr_rl.algos.kl import (KL_ESTIMATORS, AdaptiveKLController, FixedKLController,  # noqa: F401 (re-exported)
                               kl_estimate, reward_kl_penalty)
from asr_rl.algos.aggregation import LOSS_AGG_MODES, AggSpec, agg_count, aggregate_loss  # noqa: F401 (re-exported)
from asr_rl.algos.masked import masked_mean
from asr_rl.algos.masked import zero_outside as _where
from asr_rl.algos.mwer import mwer_group_loss
from asr_rl.algos.off_policy import LUFFY_GAMMA, mix_off_policy, on_policy_mask

__all__ = [
    "LossOutput", "PolicyLossInputs", "AggSpec", "LOSS_AGG_MODES", "aggregate_loss", "agg_count", "masked_mean", "register_policy_loss", "get_policy_loss_fn",
    "compute_policy_loss", "ppo_policy_loss", "gspo_policy_loss", "gspo_token_policy_loss", "mwer_policy_loss",
    "POLICY_LOSSES", "PolicyLossSpec", "KL_ESTIMATORS", "kl_estimate",
    "kl_loss", "reward_kl_penalty", "value_loss", "entropy_loss", "FixedKLController", "AdaptiveKLController",
]


@dataclass
class LossOutput:
    """Attributes:
        loss: scalar tensor (with grad), aggregated over the micro-batch by its `loss_agg_mode`.
        metrics: python floats, keys namespaced like "policy/clip_frac".
        aux: a further scalar term that is a plain mean per micro-batch whatever the mode (e.g. the
            cross-entropy on references); the update averages it over micro-batches. None = none.
        parts: `loss` split by the `loss_agg_mode` each part was aggregated with (the parts sum to
            `loss`), so that the update weighs each by its mode's count over the optimiser step
            (`agg_count`); None = all of `loss` by the update's `loss_agg_mode`.
    """

    loss: Tensor
    metrics: dict[str, float]
    aux: Tensor | None = None
    parts: dict[str, Tensor] | None = None


# ---------------------------------------------------------------------------------------------------
# Policy losses (registry)
# ---------------------------------------------------------------------------------------------------

@dataclass
class PolicyLossInputs:
    """What a policy loss gets (one typed input, as prime-rl's loss inputs).

    Attributes:
        logp: ``(N, T)`` log-probs of the sampled tokens under the current policy (with grad).
        old_logp: ``(N, T)`` log-probs under the policy that sampled them (the trainer's, at rollout).
        advantages: ``(N, T)``.
        mask: ``(N, T)`` response mask; any value (-inf, NaN) is allowed in the inputs at padding.
        eps_clip_low, eps_clip_high: clip range [1 - low, 1 + high].
        dual_clip: c > 1 bounds the loss of negative-advantage tokens at -c*A; None = off.
        loss_agg_mode: one of `LOSS_AGG_MODES`.
        rollout_weights: ``(N, T)`` detached per-token weights of a rollout/trainer mismatch
            correction (trainer/rollout_correction.py), multiplying each token's loss; None = off.
        rollout_logp: ``(N, T)`` the rollout engine's log-probs, given when a correction is on;
            the sequence-ratio losses use it as the behaviour policy instead of the weights.
        group_index: ``(N,)`` long, rows with the same value are one prompt's group (grouped losses).
        ended: ``(N,)`` bool, the response ended with EOS (not cut at max_new_tokens); None = all.
        off_policy: ``(N,)`` bool, the rows the policy did not sample (a reference transcript in
            its group); their loss is LUFFY's shaped -A * pi / (pi + gamma), unclipped
            (algos/off_policy.py), and the ratio metrics leave them out. None = all on-policy.
        off_policy_gamma: gamma of that shaping (LUFFY: 0.1).
    """

    logp: Tensor
    old_logp: Tensor
    advantages: Tensor
    mask: Tensor
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.2
    dual_clip: float | None = None
    loss_agg_mode: str = "token-mean"
    rollout_weights: Tensor | None = None
    rollout_logp: Tensor | None = None
    group_index: Tensor | None = None
    ended: Tensor | None = None
    off_policy: Tensor | None = None
    off_policy_gamma: float = LUFFY_GAMMA


@dataclass(frozen=True)
class PolicyLossSpec:
    """What a policy loss declares; the config (at load) and the update read only this.

    Attributes:
        grouped: a loss over each prompt's whole group (reads `group_index`): micro-batches hold whole
            groups and weigh equally (a seq-mean `loss_agg_mode`).
        ratio: an importance-ratio surrogate: eps_clip, dual_clip and `algo.rollout_correction` apply.
        max_sft_coef: the largest `algo.sft_coef` (cross-entropy interpolation) it takes; None = any.
    """

    grouped: bool = False
    ratio: bool = True
    max_sft_coef: float | None = None


PolicyLossFn = Callable[[PolicyLossInputs], LossOutput]
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss", PolicyLossSpec)

# exp() of a log-ratio above this overflows quickly; verl clamps the log-ratio to +-20 the same way.
_MAX_LOG_RATIO = 20.0


def register_policy_loss(name: str, **spec) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator that registers `fn(x: PolicyLossInputs) -> LossOutput` under `name` with its
    `PolicyLossSpec` fields (verl `@register_policy_loss`)."""
    return POLICY_LOSSES.register(name, **spec)


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """The policy loss registered as `name`; ValueError listing the valid names otherwise."""
    return POLICY_LOSSES.get(name)


def compute_policy_loss(name: str, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
                        **options) -> LossOutput:
    """Run policy loss `name` on `PolicyLossInputs(logp, old_logp, advantages, mask, **options)`; the
    entry point trainers use."""
    return get_policy_loss_fn(name)(PolicyLossInputs(logp, old_logp, advantages, mask, **options))


def _clipped_surrogate(ratio: Tensor, log_ratio: Tensor, x: PolicyLossInputs, weights: Tensor | None) -> LossOutput:
    """Clipped surrogate shared by "ppo" and "gspo" (Schulman et al. 2017, arXiv:1707.06347, eq. 7).

    loss = max(-A*r, -A*clip(r, 1-eps_low, 1+eps_high)); with dual clip (Ye et al. 2019,
    arXiv:1912.09729, eq. 5) for A < 0: loss = min(that, -c*A), which bounds the loss when r >> 1;
    then times the per-token `weights` of a rollout correction, if any; off-policy rows, if any, then
    take LUFFY's shaped loss instead (`mix_off_policy`), and the metrics are over the on-policy tokens.

    Args:
        ratio: ``(N, T)`` importance ratio (with grad), finite.
        log_ratio: ``(N, T)`` token log(new/old) for the approx-KL metric, 0 at padding.
        x: the inputs (advantages and options are read from it).
        weights: ``(N, T)`` detached correction weights, or None.
    """
    if x.eps_clip_low < 0 or x.eps_clip_high < 0:
        raise ValueError(f"eps_clip_low/high must be >= 0, got {x.eps_clip_low}, {x.eps_clip_high}")
    if x.dual_clip is not None and not x.dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1 (Ye et al. 2019 use 3), got {x.dual_clip}")
    mask = x.mask.bool()
    advantages = _where(mask, x.advantages)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - x.eps_clip_low, 1.0 + x.eps_clip_high)
    loss_mat = torch.maximum(unclipped, clipped)
    on = on_policy_mask(mask, x.off_policy)
    metrics = {"policy/clip_frac": masked_mean((clipped > unclipped).float(), on).item()}
    if x.dual_clip is not None:
        bound = -x.dual_clip * advantages
        dual_active = (advantages < 0) & (loss_mat > bound)
        loss_mat = torch.where(advantages < 0, torch.minimum(loss_mat, bound), loss_mat)
        metrics["policy/dual_clip_frac"] = masked_mean(dual_active.float(), on).item()
    if weights is not None:
        loss_mat = loss_mat * _where(mask, weights.detach())
    if x.off_policy is not None:
        loss_mat, off_metrics = mix_off_policy(loss_mat, x.logp, advantages, mask, x.off_policy, x.off_policy_gamma)
        metrics.update(off_metrics)
    loss = aggregate_loss(loss_mat, mask, x.loss_agg_mode)
    with torch.no_grad():
        # k3 with samples from the OLD policy: (r - 1) - log r estimates KL(old || new)
        # (Schulman, http://joschu.net/blog/kl-approx.html); non-negative, low variance.
        lr = log_ratio.detach().clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        metrics["policy/approx_kl"] = masked_mean(torch.expm1(lr) - lr, on).item()
        valid = ratio.detach()[on]
        metrics["policy/ratio_mean"] = valid.mean().item() if valid.numel() else 1.0
        metrics["policy/ratio_max"] = valid.max().item() if valid.numel() else 1.0
        metrics["policy/ratio_min"] = valid.min().item() if valid.numel() else 1.0
    return LossOutput(loss=loss, metrics=metrics)


@register_policy_loss("ppo")
def ppo_policy_loss(x: PolicyLossInputs) -> LossOutput:
    """PPO clipped surrogate with token ratios r_t = exp(logp - old_logp) (Schulman et al. 2017,
    arXiv:1707.06347), asymmetric clip range [1-eps_low, 1+eps_high] (DAPO clip-higher,
    arXiv:2503.14476), optional dual clip (Ye et al. 2019, arXiv:1912.09729), each token's loss
    times its rollout-correction weight when one is given (OpenRLHF `PolicyLoss`).

    Returns:
        `LossOutput`; metrics "policy/clip_frac" (share of valid tokens where the clipped term is
        the active one), "policy/approx_kl" (k3 of old vs new), "policy/ratio_mean|max|min", and
        "policy/dual_clip_frac" when dual clip is on.
    """
    m = x.mask.bool()
    log_ratio = _where(m, x.logp) - _where(m, x.old_logp)
    ratio = torch.exp(log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    return _clipped_surrogate(ratio, log_ratio, x, x.rollout_weights)


@register_policy_loss("gspo")
def gspo_policy_loss(x: PolicyLossInputs) -> LossOutput:
    """GSPO (Zheng et al. 2025, arXiv:2507.18071, eq. 5-7): one ratio per sequence,
    s_i = exp(mean_t (logp_t - old_logp_t)) over the valid tokens, clipped like PPO; its gradient is
    s_i * mean_t grad(logp_t) (the paper's sequence-level gradient, OpenRLHF's `gspo`). The ratio is
    broadcast over the tokens; with loss_agg_mode="seq-mean-token-mean" the loss is the paper's
    mean over sequences. The paper's clip range is much smaller than PPO's (eps ~ 3e-4 / 4e-4).
    With a rollout correction on, the ratio is taken against the engine's log-probs (`rollout_logp`:
    the sequence ratio then corrects the mismatch itself) and no token weights apply, as OpenRLHF.
    Advantages are taken as given (sequence-level advantages broadcast over tokens).

    Returns:
        `LossOutput` with the same metrics as "ppo" (ratios are the sequence ratios, per token).
    """
    return _gspo(x, token_gradient=False)


@register_policy_loss("gspo_token")
def gspo_token_policy_loss(x: PolicyLossInputs) -> LossOutput:
    """GSPO-token (Zheng et al. 2025, arXiv:2507.18071, eq. 13-14): s_i,t = sg[s_i] * exp(logp_t -
    sg[logp_t]), the value s_i at every token and the gradient s_i * grad(logp_t) per token, so that
    token-level advantages (a KL penalty in the reward, GAE) weigh their own tokens. With one advantage
    per sequence its gradient equals "gspo"'s. Rollout correction as "gspo".
    """
    return _gspo(x, token_gradient=True)


def _gspo(x: PolicyLossInputs, token_gradient: bool) -> LossOutput:
    m = x.mask.bool()
    lp = _where(m, x.logp)
    behaviour = x.rollout_logp if x.rollout_logp is not None else x.old_logp
    log_ratio = lp - _where(m, behaviour)
    seq_log_ratio = (log_ratio.sum(dim=-1) / m.sum(dim=-1).clamp(min=1)).unsqueeze(-1)  # (N, 1) log s_i
    if token_gradient:
        log_s = seq_log_ratio.detach() + lp - lp.detach()  # value log s_i, gradient of logp_t
    else:
        log_s = seq_log_ratio.expand_as(lp)  # value and gradient of log s_i at every token
    ratio = torch.exp(log_s.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    return _clipped_surrogate(ratio, log_ratio, x, None)


@register_policy_loss("mwer", grouped=True, ratio=False, max_sft_coef=0.1)
def mwer_policy_loss(x: PolicyLossInputs) -> LossOutput:
    """MWER over each group's N-best (Prabhavalkar et al. 2018, arXiv:1712.01818): asr_rl/algos/mwer.py."""
    return LossOutput(*mwer_group_loss(x))


# ---------------------------------------------------------------------------------------------------
# KL to the reference policy
# ---------------------------------------------------------------------------------------------------

def kl_loss(logp: Tensor, ref_logp: Tensor, mask: Tensor, estimator: str = "k3",
            loss_agg_mode: str = "token-mean", clamp: float | None = 10.0, old_logp: Tensor | None = None,
            unbiased_gradient: bool = False) -> LossOutput:
    """KL-to-reference term added to the loss (GRPO's `use_kl_loss`, Shao et al. 2024, arXiv:2402.03300,
    which uses k3); the caller multiplies by the KL coefficient.

    With `unbiased_gradient` (OpenRLHF 0.11.2 `--algo.kl.unbiased_gradient`) the value stays the
    estimator's, and the gradient becomes that of w * k1^2 / 2, i.e. w * k1 * grad(logp) with
    w = min(pi / pi_old, 10) detached: the score-function gradient of KL(pi || ref), importance-weighted
    for tokens sampled by the old policy (Schulman, http://joschu.net/blog/kl-approx.html: k2's
    pathwise gradient is k1's score-function one). Every estimator then has this same gradient.

    Args:
        logp: ``(N, T)`` policy log-probs (with grad).
        ref_logp: ``(N, T)`` reference log-probs.
        mask: ``(N, T)`` response mask; anything allowed at padding.
        estimator: one of `KL_ESTIMATORS`.
        loss_agg_mode: one of `LOSS_AGG_MODES`.
        clamp: bound on the per-token estimate (see `kl_estimate`).
        old_logp: ``(N, T)`` log-probs of the policy that sampled (for w); None = w = 1.
        unbiased_gradient: see above.

    Returns:
        `LossOutput` with metric "kl/loss" (the aggregated estimate, before the coefficient).
    """
    m = mask.bool()
    lp, ref = _where(m, logp), _where(m, ref_logp)
    kl = kl_estimate(lp, ref, estimator, clamp)
    if unbiased_gradient:
        w = 1.0 if old_logp is None else torch.exp(
            (lp.float() - _where(m, old_logp).float()).clamp(max=_MAX_LOG_RATIO)).clamp(max=KL_IS_WEIGHT_CLIP).detach()
        surrogate = w * (lp.float() - ref.float()).pow(2) / 2
        kl = kl.detach() + surrogate - surrogate.detach()  # straight-through: value kl, gradient surrogate's
    loss = aggregate_loss(kl, m, loss_agg_mode)
    return LossOutput(loss=loss, metrics={"kl/loss": loss.item()})


# the bound on w = pi / pi_old of the unbiased KL gradient (OpenRLHF 0.11.2 `KL_IS_WEIGHT_CLIP`)
KL_IS_WEIGHT_CLIP = 10.0


# ---------------------------------------------------------------------------------------------------
# Critic and entropy
# ---------------------------------------------------------------------------------------------------


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, value_clip: float | None = 0.2,
               loss_agg_mode: str = "token-mean") -> LossOutput:
    """PPO clipped value loss, 0.5 * max((v - R)^2, (clip(v, v_old - c, v_old + c) - R)^2)
    (OpenAI baselines ppo2; OpenRLHF `ValueLoss`; Engstrom et al. 2020, arXiv:2005.12729, discuss it).

    Args:
        values: ``(N, T)`` current critic values (with grad).
        old_values: ``(N, T)`` values at rollout time.
        returns: ``(N, T)`` targets.
        mask: ``(N, T)`` response mask.
        value_clip: c; None = plain 0.5 * (v - R)^2.
        loss_agg_mode: one of `LOSS_AGG_MODES`.

    Returns:
        `LossOutput`; metrics "critic/value_clip_frac" (share of valid tokens where the clipped term
        is the larger one) and "critic/vf_explained_var" (1 - Var[R - v] / Var[R]).
    """
    m = mask.bool()
    v, v_old, ret = _where(m, values), _where(m, old_values), _where(m, returns)
    unclipped = (v - ret).pow(2)
    if value_clip is None:
        loss_mat, clip_frac = unclipped, 0.0
    else:
        v_clipped = v_old + (v - v_old).clamp(-value_clip, value_clip)
        clipped = (v_clipped - ret).pow(2)
        loss_mat = torch.maximum(unclipped, clipped)
        clip_frac = masked_mean((clipped > unclipped).float(), m).item()
    loss = 0.5 * aggregate_loss(loss_mat, m, loss_agg_mode)
    with torch.no_grad():
        var_ret = masked_mean((ret - masked_mean(ret, m)).pow(2), m)
        err = ret - v.detach()
        var_err = masked_mean((err - masked_mean(err, m)).pow(2), m)
        explained = (1.0 - var_err / (var_ret + 1e-8)).item()
    return LossOutput(loss=loss, metrics={"critic/value_clip_frac": clip_frac, "critic/vf_explained_var": explained})


def entropy_loss(entropy: Tensor, mask: Tensor, loss_agg_mode: str = "token-mean") -> Tensor:
    """Aggregated per-token entropy; the caller subtracts coef * this (an entropy bonus, Williams & Peng
    1991; PPO eq. 9, arXiv:1707.06347).

    Args:
        entropy: ``(N, T)`` per-token entropy of the policy.
        mask: ``(N, T)`` response mask.
        loss_agg_mode: one of `LOSS_AGG_MODES`.

    Returns:
        Scalar.
    """
    return aggregate_loss(entropy, mask, loss_agg_mode)


def pairwise_loss(chosen: Tensor, rejected: Tensor, margin: float = 0.0) -> LossOutput:
    """Bradley-Terry reward-model loss, -log sigmoid(r_chosen - r_rejected - margin), mean over pairs
    (Ouyang et al. 2022, InstructGPT, arXiv:2203.02155, eq. 1).

    Args:
        chosen: ``(B,)`` scores of the preferred responses.
        rejected: ``(B,)`` scores of the other responses.
    """
    diff = chosen.float() - rejected.float() - margin
    loss = -torch.nn.functional.logsigmoid(diff).mean()
    return LossOutput(loss, {"rm/loss": float(loss.detach()), "rm/accuracy": float((diff > 0).float().mean()),
                             "rm/margin": float(diff.detach().mean())})
