"""Advantage estimators: sequence rewards (+ per-token KL penalty) -> per-token advantages and returns.

A registry of pure functions selected by OpenRLHF's `advantage_estimator` names. Each estimator takes an
`AdvantageInputs` and returns an `AdvantageOutput`; nothing here reads a config object or touches a
device other than the inputs'. The definitions follow OpenRLHF
(`openrlhf/trainer/ppo_utils/experience_maker.py`: `_apply_reward_shaping`,
`_compute_per_experience_advantages`, `_normalize_advantages`, `get_advantages_and_returns`,
`get_cumulative_returns`; `openrlhf/models/utils.py::compute_reward`) and the papers cited per function.

Layout: N = num_prompts * group_size rows, the rows of one prompt contiguous (row b*n + j is sample j of
prompt b); T response tokens, right-padded, `response_mask` 1 on response tokens (EOS included).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from asr_rl.registry import Registry
from asr_rl.algos.groups import grouped
from asr_rl.algos.masked import masked_mean, masked_var, whiten  # noqa: F401  (re-exported)
from asr_rl.algos.returns import discounted_returns, gae_advantages, token_rewards


@dataclass
class AdvantageInputs:
    """Everything an estimator may use.

    Attributes:
        rewards: ``(N,)`` sequence-level reward per sample.
        response_mask: ``(N, T)`` 1 for response tokens (EOS included), 0 for padding; right-padded.
        group_size: n samples per prompt (rows of a group are contiguous).
        values: ``(N, T)`` critic values; needed by "gae" only.
        kl_penalty: ``(N, T)`` per-token penalty already multiplied by the KL coefficient
            (kl_coef * kl); subtracted from the token rewards. None = no penalty.
        gamma: discount factor.
        lambd: GAE lambda (OpenRLHF's spelling).
        eps: added to the group std in "group_norm".
        std_norm: the batch whitening of "gae" / "reinforce" / "reinforce_baseline" divides by the
            std; False = it only subtracts the mean (a mean-only baseline).
        whiten_gae: "gae" whitens its advantages over the batch (OpenRLHF does; off by default so
            that the function alone is plain GAE).
        reward_clip: [low, high] the sequence reward is clipped to after the estimator's group
            baseline, before it becomes the last token's reward (OpenRLHF `compute_reward`'s
            `reward_clip_range`); None = no clipping.
    """

    rewards: Tensor
    response_mask: Tensor
    group_size: int
    values: Tensor | None = None
    kl_penalty: Tensor | None = None
    gamma: float = 1.0
    lambd: float = 1.0
    eps: float = 1e-6
    std_norm: bool = True
    whiten_gae: bool = False
    reward_clip: tuple[float, ...] | None = None


@dataclass
class AdvantageOutput:
    """Attributes:
        advantages: ``(N, T)``, zero at padding.
        returns: ``(N, T)``, zero at padding (critic targets for "gae").
        shaped_rewards: ``(N,)`` the sequence reward after the estimator's baseline (for logging).
    """

    advantages: Tensor
    returns: Tensor
    shaped_rewards: Tensor


AdvantageFn = Callable[[AdvantageInputs], AdvantageOutput]


@dataclass(frozen=True)
class AdvantageSpec:
    """What an estimator needs and how it behaves; the config and the trainer read only this.

    Attributes:
        needs_critic: it reads `values` (the trainer builds a critic and runs PPO's value update).
        grouped: its baseline is over the n samples of a prompt (needs n_samples_per_prompt >= 2;
            ties carry no signal, so dynamic filtering is on by default).
        batch_whitened: its advantages are whitened over the batch's valid tokens.
        baseline_in_loss: it passes the rewards through, and the policy loss subtracts the group's
            baseline (a grouped policy loss, `PolicyLossSpec.grouped`; checked at load).
        gamma: how `gamma` is used (documentation).
    """

    needs_critic: bool = False
    grouped: bool = False
    batch_whitened: bool = False
    baseline_in_loss: bool = False
    gamma: str = "discounts the token rewards' reward-to-go (default 1.0: the sequence reward everywhere)"


ADVANTAGE_ESTIMATORS: Registry[AdvantageFn] = Registry("advantage_estimator", AdvantageSpec)


def register_advantage(name: str, **spec) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator that registers an estimator under `name` with its `AdvantageSpec` fields."""
    return ADVANTAGE_ESTIMATORS.register(name, **spec)


def get_advantage_fn(name: str) -> AdvantageFn:
    """The estimator registered as `name`; ValueError listing the valid names otherwise."""
    return ADVANTAGE_ESTIMATORS.get(name)


def advantage_spec(name: str) -> AdvantageSpec:
    return ADVANTAGE_ESTIMATORS.spec(name)


def compute_advantages(name: str, inputs: AdvantageInputs) -> AdvantageOutput:
    """Run estimator `name` on `inputs` after checking shapes; the only entry point trainers should use."""
    fn = get_advantage_fn(name)
    _check_inputs(inputs)
    return fn(inputs)


def _reinforce_style(x: AdvantageInputs, shaped: Tensor, whiten_adv: bool) -> AdvantageOutput:
    """Token rewards -> discounted returns; advantages = returns, or returns whitened over the batch.

    gamma is used as given (default 1.0); OpenRLHF instead overrides gamma to 1.0 for the group
    estimators with a warning, which a pure function should not do behind the caller's back.
    """
    tok = token_rewards(shaped, x.response_mask, x.kl_penalty, x.reward_clip)
    ret = discounted_returns(tok, x.response_mask, x.gamma)
    # OpenRLHF `_normalize_advantages` subtracts the masked batch mean and divides by the population
    # std (var.clamp(min=1e-8).rsqrt()) over all valid tokens, for reinforce AND reinforce_baseline.
    adv = (whiten(ret, x.response_mask, shift_mean=True, unbiased=False, scale=x.std_norm) if whiten_adv
           else ret.clone())
    return AdvantageOutput(advantages=adv, returns=ret, shaped_rewards=shaped)


def _float_rewards(x: AdvantageInputs) -> Tensor:
    # Advantages are computed in at least float32 even when rewards arrive in bf16.
    return x.rewards.to(torch.promote_types(x.rewards.dtype, torch.float32))


def _check_inputs(x: AdvantageInputs) -> None:
    if x.rewards.dim() != 1:
        raise ValueError(f"rewards must be (N,), got shape {tuple(x.rewards.shape)}")
    if x.response_mask.dim() != 2 or x.response_mask.size(0) != x.rewards.size(0):
        raise ValueError(f"response_mask must be (N, T) with N={x.rewards.size(0)}, got {tuple(x.response_mask.shape)}")
    for field in ("values", "kl_penalty"):
        t = getattr(x, field)
        if t is not None and t.shape != x.response_mask.shape:
            raise ValueError(f"{field} must match response_mask {tuple(x.response_mask.shape)}, got {tuple(t.shape)}")
    bad = (~torch.isfinite(x.rewards)).nonzero().flatten().tolist()
    if bad:
        raise ValueError(f"rewards are NaN/inf at rows {bad[:10]}; fix the reward function, never train on them")


# ---------------------------------------------------------------------------------------------------
# Estimators
# ---------------------------------------------------------------------------------------------------


@register_advantage("gae", needs_critic=True, batch_whitened=True,
                    gamma="discounts the TD errors and returns, with lambd (GAE)")
def gae(x: AdvantageInputs) -> AdvantageOutput:
    """PPO with a critic: GAE (Schulman et al. 2015, arXiv:1506.02438) on token rewards
    (-kl_penalty everywhere, the sequence reward at the last token), returns = advantages + values.

    Whitened over the batch's valid tokens (population variance, as OpenRLHF's trainer does) when
    `x.whiten_gae`; the returns are not.

    Args:
        x: `AdvantageInputs` with `values` ``(N, T)`` set.
    """
    if x.values is None:
        raise ValueError("gae needs a critic: values is None (pass the critic's (N, T) values, "
                         "or pick a critic-free estimator such as group_norm or reinforce)")
    r = _float_rewards(x)
    tok = token_rewards(r, x.response_mask, x.kl_penalty, x.reward_clip)
    adv, ret = gae_advantages(tok, x.values, x.response_mask, x.gamma, x.lambd)
    if x.whiten_gae:
        adv = whiten(adv, x.response_mask, unbiased=False, scale=x.std_norm)
    return AdvantageOutput(advantages=adv, returns=ret, shaped_rewards=r)


@register_advantage("reinforce", batch_whitened=True)
def reinforce(x: AdvantageInputs) -> AdvantageOutput:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): no baseline; returns = discounted reward-to-go of the
    token rewards; advantages = returns whitened over all valid tokens of the batch.

    Args:
        x: `AdvantageInputs`; `group_size` is not used.
    """
    return _reinforce_style(x, _float_rewards(x), whiten_adv=True)


@register_advantage("reinforce_baseline", grouped=True, batch_whitened=True)
def reinforce_baseline(x: AdvantageInputs) -> AdvantageOutput:
    """REINFORCE++-baseline (Hu 2025, arXiv:2501.03262): r' = r - mean_group, then as "reinforce"
    (returns whitened over the batch's valid tokens, mean subtracted again as OpenRLHF does).

    OpenRLHF's reason for dropping GRPO's "/ std" in the group step: it is not needed for variance
    reduction, and the batch-level normalisation already fixes the scale.

    Args:
        x: `AdvantageInputs` with rows grouped by prompt, group_size >= 2.
    """
    g = grouped(_float_rewards(x), x.group_size, "reinforce_baseline")
    shaped = (g - g.mean(dim=1, keepdim=True)).flatten()
    return _reinforce_style(x, shaped, whiten_adv=True)


@register_advantage("flash_reinforce")
def flash_reinforce(x: AdvantageInputs) -> AdvantageOutput:
    """FlashREINFORCE (OpenRLHF 0.11.2 `flash_reinforce`, its estimator for n_samples_per_prompt=1):
    r' = r - mean over the whole rollout batch (there is no prompt group), then as "group_norm":
    advantages = returns = reward-to-go of the token rewards, no whitening. The batch-mean baseline
    is REINFORCE's classic constant baseline (Williams 1992).

    Args:
        x: `AdvantageInputs`; `group_size` is not used.
    """
    r = _float_rewards(x)
    return _reinforce_style(x, r - r.mean(), whiten_adv=False)


@register_advantage("group_norm", grouped=True)
def group_norm(x: AdvantageInputs) -> AdvantageOutput:
    """GRPO (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300): r' = (r - mean_group) / (std_group + eps),
    then advantages = returns = reward-to-go of the token rewards (r' at the last token, minus kl_penalty).

    std is the unbiased sample std (`torch.std`, correction=1), as OpenRLHF `_apply_reward_shaping`
    (`rewards.std(-1, keepdim=True) + 1e-9`); our eps defaults to 1e-6 (verl's GRPO epsilon).

    Args:
        x: `AdvantageInputs` with rows grouped by prompt, group_size >= 2.
    """
    g = grouped(_float_rewards(x), x.group_size, "group_norm")
    shaped = ((g - g.mean(dim=1, keepdim=True)) / (g.std(dim=1, keepdim=True) + x.eps)).flatten()
    return _reinforce_style(x, shaped, whiten_adv=False)


@register_advantage("dr_grpo", grouped=True)
def dr_grpo(x: AdvantageInputs) -> AdvantageOutput:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783):
    r' = r - mean_group, no division by the std (which biases towards easy/hard prompts); then as
    "group_norm". (The paper's other fix, no per-sequence length normalisation, is the loss's
    `loss_agg_mode="seq-mean-token-sum"`.)

    Args:
        x: `AdvantageInputs` with rows grouped by prompt, group_size >= 2.
    """
    g = grouped(_float_rewards(x), x.group_size, "dr_grpo")
    shaped = (g - g.mean(dim=1, keepdim=True)).flatten()
    return _reinforce_style(x, shaped, whiten_adv=False)


@register_advantage("rloo", grouped=True)
def rloo(x: AdvantageInputs) -> AdvantageOutput:
    """RLOO (Ahmadian et al. 2024, arXiv:2402.14740; Kool et al. 2019, "Buy 4 REINFORCE samples, get a
    baseline for free"): r'_j = r_j - (sum_group - r_j) / (n - 1), the mean of the other n-1 samples;
    then as "group_norm".

    Args:
        x: `AdvantageInputs` with rows grouped by prompt, group_size >= 2.
    """
    n = x.group_size
    g = grouped(_float_rewards(x), n, "rloo")
    shaped = (g - (g.sum(dim=1, keepdim=True) - g) / (n - 1)).flatten()
    return _reinforce_style(x, shaped, whiten_adv=False)


@register_advantage("mwer", grouped=True, baseline_in_loss=True)
def mwer(x: AdvantageInputs) -> AdvantageOutput:
    """The rewards passed through to the "mwer" policy loss, whose baseline is the group's mean risk
    over its N-best (Prabhavalkar et al. 2018, arXiv:1712.01818; asr_rl/algos/mwer.py):
    advantages = returns = reward-to-go of the token rewards (the clipped sequence reward at every
    token with gamma 1, minus the KL penalty to go when KL is in the reward). No baseline, no scale.

    Args:
        x: `AdvantageInputs` with rows grouped by prompt, group_size >= 2.
    """
    r = grouped(_float_rewards(x), x.group_size, "mwer").flatten()
    return _reinforce_style(x, r, whiten_adv=False)


# Estimators whose baseline is computed over the n samples of a prompt (the built-ins).
GROUP_ESTIMATORS = ADVANTAGE_ESTIMATORS.where(grouped=True)
