"""Advantage estimators against numbers worked out by hand (style of torchtune
tests/torchtune/rlhf/test_rewards.py), plus a loop-vs-vectorised check (verl
test_grpo_and_vectorized_equivalence)."""
from __future__ import annotations

import ast
import math
import statistics
from pathlib import Path

import pytest
import torch

import asr_rl.algos.advantages as adv_mod
from asr_rl.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    GROUP_ESTIMATORS,
    AdvantageInputs,
    AdvantageOutput,
    compute_advantages,
    get_advantage_fn,
    masked_mean,
    masked_var,
    register_advantage,
    whiten,
)

NAN = float("nan")


def _mask(lengths: list[int], T: int) -> torch.Tensor:
    return (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()


def _close(actual: torch.Tensor, expected: list, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# --------------------------------------------------------------------------- group_norm (GRPO)


def test_group_norm_one_group_unequal_lengths():
    # rewards [1, 0, 0, 1]: mean 0.5, deviations +-0.5,
    # unbiased var = 4 * 0.25 / (4 - 1) = 1/3, std = sqrt(1/3) = 0.57735
    # r' = +-0.5 / 0.57735 = +-sqrt(3)/2 = +-0.8660254 (eps=0)
    # gamma=1, no KL: the return at every valid token is the final reward r'.
    a = math.sqrt(3) / 2
    out = compute_advantages("group_norm", AdvantageInputs(
        rewards=torch.tensor([1.0, 0.0, 0.0, 1.0]), response_mask=_mask([3, 2, 1, 3], 3), group_size=4, eps=0.0))
    expected = [[a, a, a], [-a, -a, 0.0], [-a, 0.0, 0.0], [a, a, a]]
    _close(out.advantages, expected)
    _close(out.returns, expected)
    _close(out.shaped_rewards, [a, -a, -a, a])


def test_group_norm_two_groups_and_degenerate_group():
    # group 1 [1, 0]: mean 0.5, unbiased std = sqrt((0.25 + 0.25) / 1) = 0.70711 -> r' = +-0.70711
    # group 2 [3, 3]: std 0 -> r' = 0 / (0 + eps) = 0, not NaN
    out = compute_advantages("group_norm", AdvantageInputs(
        rewards=torch.tensor([1.0, 0.0, 3.0, 3.0]), response_mask=_mask([1, 1, 1, 1], 1), group_size=2))
    s = 0.5 / (math.sqrt(0.5) + 1e-6)
    _close(out.shaped_rewards, [s, -s, 0.0, 0.0])
    _close(out.advantages, [[s], [-s], [0.0], [0.0]])


def test_group_norm_uses_unbiased_std_like_openrlhf():
    # OpenRLHF: (r - mean) / (r.std(-1) + 1e-9); torch.std is the unbiased (n-1) std.
    # rewards [0, 0, 0, 4]: mean 1, unbiased var = (1 + 1 + 1 + 9) / 3 = 4, std 2
    # -> r' = [-0.5, -0.5, -0.5, 1.5] (a biased std sqrt(3) would give 1.5/sqrt(3) = 0.866 at the end)
    out = compute_advantages("group_norm", AdvantageInputs(
        rewards=torch.tensor([0.0, 0.0, 0.0, 4.0]), response_mask=_mask([1] * 4, 1), group_size=4, eps=0.0))
    _close(out.shaped_rewards, [-0.5, -0.5, -0.5, 1.5])


def test_group_std_eps_decides_a_near_tied_group():
    # rewards [1, 1 + 2e-7]: deviations +-1e-7, unbiased std = sqrt(2e-14) = 1.41421e-7
    #   eps 1e-9 (OpenRLHF): r' = 1e-7 / (1.41421e-7 + 1e-9) = +-0.70214
    #   eps 1e-6 (ours, verl): r' = 1e-7 / (1.41421e-7 + 1e-6) = +-0.087610
    rewards = torch.tensor([1.0, 1.0 + 2e-7], dtype=torch.float64)
    for eps, expected in ((1e-9, 1e-7 / (math.sqrt(2e-14) + 1e-9)), (1e-6, 1e-7 / (math.sqrt(2e-14) + 1e-6))):
        out = compute_advantages("group_norm", AdvantageInputs(rewards=rewards, response_mask=_mask([1, 1], 1),
                                                               group_size=2, eps=eps))
        _close(out.shaped_rewards, [-expected, expected], atol=1e-9)


def test_reward_clipping_and_the_settings_reach_the_loop():
    from asr_rl.config import load_config
    from asr_rl.algos.groups import clip_rewards
    from asr_rl.trainer.configs.rl import RLConfig
    from asr_rl.trainer.driver.loop import RLTrainer
    from asr_rl.trainer.rollout.experience import Group, build_experience

    _close(clip_rewards(torch.tensor([-30.0, 0.5, 12.0]), (-10.0, 10.0)), [-10.0, 0.5, 10.0])
    _close(clip_rewards(torch.tensor([-30.0, 12.0]), None), [-30.0, 12.0])
    # As OpenRLHF's compute_reward, the clip applies to the reward after the group baseline.
    # group_norm of [30, 0] with eps 0.5: (+-15) / (std 21.2132 + 0.5) = +-0.69080, inside [-1, 1];
    # rloo of [30, 0]: [30 - 0, 0 - 30] = [30, -30], clipped to [-1, 1]
    for estimator, expected in (("group_norm", 15 / (math.sqrt(450) + 0.5)), ("rloo", 1.0)):
        cfg = load_config(RLConfig, None, ["n_samples_per_prompt=2", "rollout_batch_size=1", "init_kl_coef=0",
                                           "micro_train_batch_size=2", f"advantage_estimator={estimator}",
                                           "algo.reward_clip_range=[-1,1]", "algo.group_std_eps=0.5"])
        exp = build_experience([Group("u", None, [[5], [6]], ["a", "b"], rewards=[30.0, 0.0])], 2, pad_id=0)
        RLTrainer(cfg, None, None, None, None, None).compute_advantages(exp)
        _close(exp.advantages, [[expected], [-expected]])


@pytest.mark.parametrize("override, message", [
    ("algo.reward_clip_range=[1,-1]", "algo.reward_clip_range must be \\[low, high\\] with low < high"),
    ("algo.reward_clip_range=[1]", "algo.reward_clip_range must be"),
    ("algo.group_std_eps=0", "`algo.group_std_eps` must be > 0, got 0"),
])
def test_bad_reward_clip_and_std_eps_are_refused(override, message):
    from asr_rl.config import ConfigError, load_config
    from asr_rl.trainer.configs.rl import RLConfig

    with pytest.raises((ConfigError, ValueError), match=message):
        load_config(RLConfig, None, [override])


def test_normalize_then_sum_by_hand():
    # one group of 2; cer [1.0, 0.5], keyword [0, 1], language [1, 1] (ties); weights 1, 0.3, 1
    #   unbiased std of 2 values = |a - b| / sqrt(2): cer 0.353553 -> (+-0.25) / 0.353553 = +-0.707107
    #   keyword 0.707107 -> (-+0.5) / 0.707107 = -+0.707107;  language std 0 -> 0 / eps = 0
    #   sum: 0.707107 - 0.3 * 0.707107 = 0.494975, and its negative
    from asr_rl.algos.reward_shaping import normalize_then_sum

    terms = torch.tensor([[1.0, 0.5], [0.0, 1.0], [1.0, 1.0]])
    out = normalize_then_sum(terms, torch.tensor([1.0, 0.3, 1.0]), group_size=2, eps=0.0 + 1e-12)
    _close(out, [0.7 * math.sqrt(0.5), -0.7 * math.sqrt(0.5)])
    # summing first then normalising: totals [2.0, 1.8] -> +-0.707107: the keyword term is lost
    with pytest.raises(ValueError, match="weights must be \\(3,\\)"):
        normalize_then_sum(terms, torch.tensor([1.0]), group_size=2)


def test_normalize_then_sum_reaches_the_loop_and_refuses_a_single_score_reward():
    from asr_rl.config import ConfigError, load_config
    from asr_rl.trainer.configs.rl import RLConfig
    from asr_rl.trainer.driver.loop import RLTrainer
    from asr_rl.trainer.rollout.experience import Group, build_experience

    cfg = load_config(RLConfig, None, ["n_samples_per_prompt=2", "rollout_batch_size=1", "init_kl_coef=0",
                                       "micro_train_batch_size=2", "algo.reward_aggregation=normalize_then_sum",
                                       "reward.terms={cer: 1.0, keyword: 0.3}"])
    group = Group("u", None, [[5], [6]], ["a", "b"], rewards=[1.0, 0.8],
                  terms={"cer": [1.0, 0.5], "keyword": [0.0, 1.0]})
    exp = build_experience([group], 2, pad_id=0)
    RLTrainer(cfg, None, None, None, None, None).compute_advantages(exp)
    # combined [0.494975, -0.494975], then group_norm: +-0.494975 / (0.7 + 1e-6) = +-0.707106
    a = 0.7 * math.sqrt(0.5) / (0.7 + 1e-6)
    _close(exp.advantages, [[a], [-a]])
    with pytest.raises(ConfigError, match="normalize_then_sum combines the built-in terms"):
        load_config(RLConfig, None, ["algo.reward_aggregation=normalize_then_sum", "reward.remote_url=http://x:1"])
    with pytest.raises(ConfigError, match="unknown reward_aggregation 'mean'"):
        load_config(RLConfig, None, ["algo.reward_aggregation=mean"])


# --------------------------------------------------------------------------- dr_grpo, rloo


def test_dr_grpo_with_kl_penalty_and_gamma():
    # rewards [1, 0] -> r' = r - mean = [0.5, -0.5] (no std division)
    # row 0 (3 tokens), kl_penalty [0.1, 0.2, 0.3]: token rewards [-0.1, -0.2, 0.5 - 0.3] = [-0.1, -0.2, 0.2]
    #   gamma 0.5: G2 = 0.2; G1 = -0.2 + 0.5 * 0.2 = -0.1; G0 = -0.1 + 0.5 * (-0.1) = -0.15
    # row 1 (2 tokens), kl_penalty [0, 0, 7 (padding, ignored)]: token rewards [0, -0.5]
    #   G1 = -0.5; G0 = 0 + 0.5 * (-0.5) = -0.25; padding 0
    out = compute_advantages("dr_grpo", AdvantageInputs(
        rewards=torch.tensor([1.0, 0.0]), response_mask=_mask([3, 2], 3), group_size=2,
        kl_penalty=torch.tensor([[0.1, 0.2, 0.3], [0.0, 0.0, 7.0]]), gamma=0.5))
    _close(out.shaped_rewards, [0.5, -0.5])
    _close(out.returns, [[-0.15, -0.1, 0.2], [-0.25, -0.5, 0.0]])
    _close(out.advantages, [[-0.15, -0.1, 0.2], [-0.25, -0.5, 0.0]])


def test_group_norm_kl_penalty_in_returns_gamma_one():
    # rewards [1, 0], group 2: r' = +-0.5 / sqrt(0.5) = +-0.70711 (eps=0)
    # row 0 kl [0.1, 0.2, 0.3]: token rewards [-0.1, -0.2, 0.70711 - 0.3 = 0.40711]
    #   reward-to-go: G2 = 0.40711, G1 = 0.20711, G0 = 0.10711
    # row 1 kl [0, 0.1, 0]: token rewards [0, -0.1, -0.70711]: G2 = -0.70711, G1 = -0.80711, G0 = -0.80711
    s = math.sqrt(0.5)
    out = compute_advantages("group_norm", AdvantageInputs(
        rewards=torch.tensor([1.0, 0.0]), response_mask=_mask([3, 3], 3), group_size=2, eps=0.0,
        kl_penalty=torch.tensor([[0.1, 0.2, 0.3], [0.0, 0.1, 0.0]])))
    _close(out.returns, [[s - 0.6, s - 0.5, s - 0.3], [-s - 0.1, -s - 0.1, -s]])


def test_rloo_leave_one_out_baseline():
    # group [1, 0, 2], n = 3, sum = 3; baseline_j = (sum - r_j) / (n - 1):
    #   j0: (3 - 1) / 2 = 1.0 -> r' = 0.0
    #   j1: (3 - 0) / 2 = 1.5 -> r' = -1.5
    #   j2: (3 - 2) / 2 = 0.5 -> r' = 1.5
    out = compute_advantages("rloo", AdvantageInputs(
        rewards=torch.tensor([1.0, 0.0, 2.0]), response_mask=_mask([2, 1, 2], 2), group_size=3))
    _close(out.shaped_rewards, [0.0, -1.5, 1.5])
    _close(out.advantages, [[0.0, 0.0], [-1.5, 0.0], [1.5, 1.5]])


# --------------------------------------------------------------------------- reinforce, reinforce_baseline


def test_reinforce_whitens_over_valid_tokens():
    # rewards [1, 0], lengths [2, 1]: returns [[1, 1], [0, pad]]
    # valid tokens {1, 1, 0}: mean 2/3; population var = ((1/3)^2 * 2 + (2/3)^2) / 3 = 2/9; std = sqrt(2)/3
    # adv: (1 - 2/3) / (sqrt(2)/3) = 1/sqrt(2) = 0.70711; (0 - 2/3) / (sqrt(2)/3) = -sqrt(2) = -1.41421
    out = compute_advantages("reinforce", AdvantageInputs(
        rewards=torch.tensor([1.0, 0.0]), response_mask=_mask([2, 1], 2), group_size=1))
    _close(out.returns, [[1.0, 1.0], [0.0, 0.0]])
    _close(out.advantages, [[1 / math.sqrt(2), 1 / math.sqrt(2)], [-math.sqrt(2), 0.0]])
    _close(out.shaped_rewards, [1.0, 0.0])


def test_reinforce_baseline_subtracts_group_mean_then_batch_mean_and_std():
    # group [1, 0] -> r' = [0.5, -0.5]; lengths [3, 1]: returns [[0.5, 0.5, 0.5], [-0.5, pad, pad]]
    # OpenRLHF then whitens over the valid tokens AND subtracts the batch mean again:
    #   mean = (0.5 * 3 - 0.5) / 4 = 0.25; deviations [0.25 x3, -0.75]
    #   population var = (3 * 0.0625 + 0.5625) / 4 = 0.1875; std = 0.4330127
    #   adv = 0.25 / 0.4330127 = 1/sqrt(3) = 0.57735; -0.75 / 0.4330127 = -sqrt(3) = -1.73205
    out = compute_advantages("reinforce_baseline", AdvantageInputs(
        rewards=torch.tensor([1.0, 0.0]), response_mask=_mask([3, 1], 3), group_size=2))
    a, b = 1 / math.sqrt(3), -math.sqrt(3)
    _close(out.shaped_rewards, [0.5, -0.5])
    _close(out.returns, [[0.5, 0.5, 0.5], [-0.5, 0.0, 0.0]])
    _close(out.advantages, [[a, a, a], [b, 0.0, 0.0]])


def test_mean_only_baseline_centres_without_dividing_by_the_std():
    # as test_reinforce_baseline...: mean 0.25 over the valid tokens -> adv = returns - 0.25:
    #   [0.25, 0.25, 0.25], [-0.75, pad, pad]   (OpenRLHF --algo.advantage.no_std_norm)
    out = compute_advantages("reinforce_baseline", AdvantageInputs(
        rewards=torch.tensor([1.0, 0.0]), response_mask=_mask([3, 1], 3), group_size=2, std_norm=False))
    _close(out.advantages, [[0.25, 0.25, 0.25], [-0.75, 0.0, 0.0]])
    _close(whiten(torch.tensor([[1.0, 3.0]]), scale=False), [[-1.0, 1.0]])


# --------------------------------------------------------------------------- gae


def test_gae_three_tokens_by_hand():
    # gamma 0.9, lambd 0.8 (gamma * lambd = 0.72)
    # row 0: reward 1, values [0.5, 0.4, 0.3], kl_penalty [0.1, 0, 0.2] -> token rewards [-0.1, 0, 0.8]
    #   d2 = 0.8 + 0.9 * 0 - 0.3 = 0.5;          A2 = 0.5
    #   d1 = 0 + 0.9 * 0.3 - 0.4 = -0.13;        A1 = -0.13 + 0.72 * 0.5 = 0.23
    #   d0 = -0.1 + 0.9 * 0.4 - 0.5 = -0.24;     A0 = -0.24 + 0.72 * 0.23 = -0.0744
    #   returns = A + V = [0.4256, 0.63, 0.8]
    # row 1: reward 0, length 2, values [0.2, 0.1, 99 (padding)], kl [0, 0, 5 (padding)]
    #   d1 = 0 + 0.9 * 0 - 0.1 = -0.1;           A1 = -0.1   (V after the last token counts as 0)
    #   d0 = 0 + 0.9 * 0.1 - 0.2 = -0.11;        A0 = -0.11 + 0.72 * (-0.1) = -0.182
    #   returns = [0.018, 0.0, 0 (padding)]
    out = compute_advantages("gae", AdvantageInputs(
        rewards=torch.tensor([1.0, 0.0]), response_mask=_mask([3, 2], 3), group_size=1,
        values=torch.tensor([[0.5, 0.4, 0.3], [0.2, 0.1, 99.0]]),
        kl_penalty=torch.tensor([[0.1, 0.0, 0.2], [0.0, 0.0, 5.0]]), gamma=0.9, lambd=0.8))
    _close(out.advantages, [[-0.0744, 0.23, 0.5], [-0.182, -0.1, 0.0]])
    _close(out.returns, [[0.4256, 0.63, 0.8], [0.018, 0.0, 0.0]])
    _close(out.shaped_rewards, [1.0, 0.0])


def test_gae_lambda_one_gamma_one_is_return_minus_value():
    # gamma = lambd = 1: A_t = sum of future rewards - V_t; reward 2 at the last of 2 tokens:
    # A = [2 - 0.5, 2 - 1.0] = [1.5, 1.0]; returns = [2, 2]
    out = compute_advantages("gae", AdvantageInputs(
        rewards=torch.tensor([2.0]), response_mask=_mask([2], 2), group_size=1, values=torch.tensor([[0.5, 1.0]])))
    _close(out.advantages, [[1.5, 1.0]])
    _close(out.returns, [[2.0, 2.0]])


# --------------------------------------------------------------------------- every estimator: shapes, padding


@pytest.mark.parametrize("name", ADVANTAGE_ESTIMATORS)
def test_every_estimator_shapes_zero_padding_and_nan_padding_inputs(name):
    torch.manual_seed(0)
    N, T = 6, 5
    mask = _mask([5, 3, 1, 4, 2, 5], T)
    # Garbage (NaN) at padding in values and kl_penalty must not leak anywhere.
    values = torch.randn(N, T).masked_fill(mask == 0, NAN)
    kl = (0.01 * torch.rand(N, T)).masked_fill(mask == 0, NAN)
    out = compute_advantages(name, AdvantageInputs(
        rewards=torch.randn(N), response_mask=mask, group_size=3, values=values, kl_penalty=kl, gamma=0.9))
    assert isinstance(out, AdvantageOutput)
    assert out.advantages.shape == out.returns.shape == (N, T)
    assert out.shaped_rewards.shape == (N,)
    for t in (out.advantages, out.returns, out.shaped_rewards):
        assert torch.isfinite(t).all()
    assert (out.advantages[mask == 0] == 0).all() and (out.returns[mask == 0] == 0).all()


def test_group_estimators_listed():
    assert set(GROUP_ESTIMATORS) == {"group_norm", "dr_grpo", "rloo", "reinforce_baseline", "mwer"}
    assert set(ADVANTAGE_ESTIMATORS) == {"gae", "reinforce", "flash_reinforce", *GROUP_ESTIMATORS}


# --------------------------------------------------------------------------- errors


def test_unknown_estimator_lists_valid_names_sorted():
    with pytest.raises(ValueError) as e:
        get_advantage_fn("grpo")
    assert "'grpo'" in str(e.value)
    assert ", ".join(sorted(ADVANTAGE_ESTIMATORS)) in str(e.value)


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
def test_group_estimator_needs_group_size_two(name):
    x = AdvantageInputs(rewards=torch.tensor([1.0, 0.0]), response_mask=_mask([1, 1], 1), group_size=1)
    with pytest.raises(ValueError, match=f"{name}.*group_size >= 2"):
        compute_advantages(name, x)


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
def test_group_estimator_needs_whole_groups(name):
    x = AdvantageInputs(rewards=torch.tensor([1.0, 0.0, 1.0]), response_mask=_mask([1, 1, 1], 1), group_size=2)
    with pytest.raises(ValueError, match=f"{name}.*not a multiple of group_size 2"):
        compute_advantages(name, x)


def test_gae_without_values():
    x = AdvantageInputs(rewards=torch.tensor([1.0]), response_mask=_mask([1], 1), group_size=1)
    with pytest.raises(ValueError, match="gae needs a critic: values is None"):
        compute_advantages("gae", x)


def test_bad_shapes_and_nan_rewards():
    with pytest.raises(ValueError, match="response_mask must be"):
        compute_advantages("reinforce", AdvantageInputs(torch.zeros(2), _mask([1], 1), 1))
    with pytest.raises(ValueError, match="values must match"):
        compute_advantages("gae", AdvantageInputs(torch.zeros(1), _mask([1], 2), 1, values=torch.zeros(1, 3)))
    with pytest.raises(ValueError, match=r"NaN/inf at rows \[1\]"):
        compute_advantages("reinforce", AdvantageInputs(torch.tensor([0.0, NAN]), _mask([1, 1], 1), 1))


def test_a_new_estimator_is_one_registry_entry_that_the_config_and_loop_see(monkeypatch):
    from asr_rl.config import ConfigError, load_config
    from asr_rl.trainer.configs.rl import RLConfig

    monkeypatch.setattr(ADVANTAGE_ESTIMATORS, "_entries", dict(ADVANTAGE_ESTIMATORS._entries))

    @register_advantage("group_sign", grouped=True)
    def group_sign(x: AdvantageInputs) -> AdvantageOutput:
        """+1 above the group mean, -1 below, 0 at it."""
        g = x.rewards.view(-1, x.group_size)
        shaped = torch.sign(g - g.mean(dim=1, keepdim=True)).flatten()
        adv = shaped[:, None] * x.response_mask
        return AdvantageOutput(adv, adv, shaped)

    # rewards [3, 1] (mean 2) -> [+1, -1] at every valid token
    out = compute_advantages("group_sign", AdvantageInputs(torch.tensor([3.0, 1.0]), _mask([2, 1], 2), 2))
    _close(out.advantages, [[1.0, 1.0], [-1.0, 0.0]])
    assert "group_sign" in GROUP_ESTIMATORS or adv_mod.ADVANTAGE_ESTIMATORS.where(grouped=True)[-1] == "group_sign"
    cfg = load_config(RLConfig, None, ["advantage_estimator=group_sign", "micro_train_batch_size=8"])
    assert cfg.algo.spec.grouped and cfg.dynamic_filtering  # what the spec declares, the config reads
    with pytest.raises(ConfigError, match="group_sign normalises within a group"):
        load_config(RLConfig, None, ["advantage_estimator=group_sign", "n_samples_per_prompt=1"])
    with pytest.raises(ConfigError, match="unknown advantage_estimator 'group_sgn'; valid: .*group_sign"):
        load_config(RLConfig, None, ["advantage_estimator=group_sgn"])
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("group_sign")(lambda x: x)


# --------------------------------------------------------------------------- masked statistics, whiten


def test_masked_mean_and_var_ignore_nan_padding():
    x = torch.tensor([[2.0, 4.0], [6.0, NAN]])
    m = torch.tensor([[1, 1], [1, 0]])
    # mean (2 + 4 + 6) / 3 = 4; squared deviations 4, 0, 4
    _close(masked_mean(x, m), 4.0)
    _close(masked_mean(x, m, dim=1), [3.0, 6.0])
    _close(masked_var(x, m), 4.0)  # unbiased: 8 / 2
    _close(masked_var(x, m, unbiased=False), 8.0 / 3)  # population: 8 / 3
    _close(masked_mean(x, torch.zeros_like(m)), 0.0)  # empty mask -> 0, not NaN


def test_whiten_by_hand():
    x = torch.tensor([[2.0, 4.0, 6.0, NAN]])
    m = torch.tensor([[1, 1, 1, 0]])
    # mean 4; unbiased var (4 + 0 + 4) / 2 = 4, std 2 -> [-1, 0, 1]; padding -> 0
    _close(whiten(x, m), [[-1.0, 0.0, 1.0, 0.0]])
    # shift_mean=False keeps the mean: [-1, 0, 1] + 4
    _close(whiten(x, m, shift_mean=False), [[3.0, 4.0, 5.0, 0.0]])
    # population var 8/3, std 1.63299 -> +-2 / 1.63299 = +-1.22474
    _close(whiten(x, m, unbiased=False), [[-1.224745, 0.0, 1.224745, 0.0]])
    _close(whiten(torch.tensor([1.0, 3.0])), [-0.707107, 0.707107])  # no mask: std sqrt(2)


# --------------------------------------------------------------------------- vectorised vs loop


def _group_norm_loop(rewards, lengths, kl, n, gamma, eps):
    """Slow reference: per group statistics in Python, per row reward-to-go token by token."""
    T = kl.size(1)
    out = torch.zeros(len(rewards), T, dtype=torch.float64)
    for b in range(0, len(rewards), n):
        group = [float(r) for r in rewards[b:b + n]]
        mu, sd = statistics.mean(group), statistics.stdev(group)  # stdev = unbiased, like torch.std
        for j in range(n):
            i = b + j
            shaped = (group[j] - mu) / (sd + eps)
            running = 0.0
            for t in reversed(range(lengths[i])):
                r_t = -float(kl[i, t]) + (shaped if t == lengths[i] - 1 else 0.0)
                running = r_t + gamma * running
                out[i, t] = running
    return out


def test_group_norm_vectorised_matches_loop():
    g = torch.Generator().manual_seed(1234)
    n, groups, T = 4, 5, 7
    rewards = torch.randint(0, 3, (n * groups,), generator=g).double()
    rewards = rewards + torch.rand(n * groups, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, T + 1, (n * groups,), generator=g).tolist()
    kl = 0.05 * torch.rand(n * groups, T, generator=g, dtype=torch.float64)
    out = compute_advantages("group_norm", AdvantageInputs(
        rewards=rewards, response_mask=_mask(lengths, T), group_size=n, kl_penalty=kl, gamma=0.95))
    expected = _group_norm_loop(rewards, lengths, kl, n, gamma=0.95, eps=1e-6)
    torch.testing.assert_close(out.advantages, expected, atol=1e-10, rtol=0)
    torch.testing.assert_close(out.returns, expected, atol=1e-10, rtol=0)


def _imports(path) -> set[str]:
    tree = ast.parse(Path(path).read_text())
    return {(a.name if isinstance(n, ast.Import) else n.module)
            for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}


def test_module_imports_only_torch_stdlib_and_the_registry():
    import asr_rl.registry

    mods = _imports(adv_mod.__file__)
    ours = {"asr_rl.registry", "asr_rl.algos.masked", "asr_rl.algos.groups", "asr_rl.algos.returns"}
    assert {m.split(".")[0] for m in mods - ours} <= {"__future__", "dataclasses", "typing", "torch"}, mods
    assert _imports(asr_rl.registry.__file__) <= {"__future__", "collections.abc", "dataclasses", "typing"}


def test_flash_reinforce_subtracts_the_batch_mean_and_does_not_whiten():
    # rewards 1, 2, 3, 6 (mean 3): r' = -2, -1, 0, 3 at every valid token (gamma 1, no KL), group_size
    # ignored (1: FlashREINFORCE's single-sample regime); no whitening, so the scale stays
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]])
    out = compute_advantages("flash_reinforce", AdvantageInputs(torch.tensor([1.0, 2.0, 3.0, 6.0]), mask, 1))
    assert out.advantages.tolist() == [[-2, -2, 0], [-1, 0, 0], [0, 0, 0], [3, 0, 0]]
    assert out.returns.tolist() == out.advantages.tolist() and out.shaped_rewards.tolist() == [-2, -1, 0, 3]
    assert not ADVANTAGE_ESTIMATORS.spec("flash_reinforce").grouped  # no group: n_samples_per_prompt=1 is fine
