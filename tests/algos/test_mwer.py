"""MWER over N-best groups (Prabhavalkar et al. 2018, arXiv:1712.01818) against numbers worked out by
hand: the renormalised probabilities, the mean-risk baseline, the gradient through the
renormalisation, unterminated hypotheses left out, and the "mwer" estimator that passes rewards."""
from __future__ import annotations

import math

import pytest
import torch

from asr_rl.algos.advantages import AdvantageInputs, advantage_spec, compute_advantages
from asr_rl.algos.losses import POLICY_LOSSES, compute_policy_loss
from asr_rl.algos.groups import ended_with_eos
from asr_rl.algos.mwer import mwer_loss, sequence_risk

LN = math.log
EOS = 9


def _close(actual, expected, atol=1e-6):
    assert torch.allclose(actual.detach().float(), torch.as_tensor(expected, dtype=torch.float32), atol=atol), \
        (actual, expected)


def _batch():
    """Group A: three ended hypotheses with p = 0.5*0.4 = 0.2, 0.2 and 0.8*0.5 = 0.4, rewards 1.0,
    0.0, 0.2, and a looping one (no EOS) with p = 0.9 and reward -5. Group B: one ended, one looping.
    Rows interleaved (A0 B0 A1 A2 B1 A3): a group is its id, not a block of rows."""
    logp = torch.tensor([[LN(0.5), LN(0.4)], [LN(0.6), 0.0], [LN(0.2), 0.0],
                         [LN(0.8), LN(0.5)], [LN(0.7), LN(0.7)], [LN(0.9), 0.0]])
    mask = torch.tensor([[1, 1], [1, 0], [1, 0], [1, 1], [1, 1], [1, 0]])
    ids = torch.tensor([[3, EOS], [EOS, 0], [EOS, 0], [4, EOS], [5, 5], [6, 0]])
    rewards = torch.tensor([1.0, 0.3, 0.0, 0.2, 0.9, -5.0])
    group = torch.tensor([0, 1, 0, 0, 1, 0])
    return logp, mask, ids, rewards, group


def test_ended_with_eos_by_hand():
    _, mask, ids, _, _ = _batch()
    assert ended_with_eos(ids, mask, EOS).tolist() == [True, True, True, True, False, False]
    # a row with no valid token did not end; left padding reads the last valid token too
    assert ended_with_eos(torch.tensor([[EOS, EOS], [0, EOS]]), torch.tensor([[0, 0], [0, 1]]), EOS).tolist() == \
        [False, True]


def test_mwer_loss_and_gradient_by_hand():
    logp, mask, ids, rewards, group = _batch()
    logp.requires_grad_()
    adv = rewards[:, None] * mask  # what the "mwer" estimator passes (W = -reward)
    out = compute_policy_loss("mwer", logp, logp.detach(), adv, mask, group_index=group,
                              ended=ended_with_eos(ids, mask, EOS))
    # group A, ended rows only: p = 0.2, 0.2, 0.4 -> P^ = 0.25, 0.25, 0.5 (the looping p = 0.9 is not
    # in the sum); W = -1, 0, -0.2; W_bar = -0.4 (the looping W = 5 not in it either);
    # sum P^ W = -0.25 + 0 - 0.1 = -0.35; L_A = -0.35 + 0.4 = 0.05.
    # group B has one ended hypothesis: L_B = 0. Loss = mean over the 2 groups = 0.025.
    _close(out.loss, 0.025)
    out.loss.backward()
    # dL/dlog p_i = P^_i (W_i - sum_j P^_j W_j) / 2 groups:
    #   A0: 0.25 (-1 + 0.35) / 2 = -0.08125; A1: 0.25 (0 + 0.35) / 2 = 0.04375; A2: 0.5 (-0.2 + 0.35) / 2 = 0.0375
    # every valid token of a hypothesis gets its sequence's gradient; looping rows and group B: 0
    _close(logp.grad, [[-0.08125, -0.08125], [0.0, 0.0], [0.04375, 0.0], [0.0375, 0.0375], [0.0, 0.0], [0.0, 0.0]])
    assert out.metrics == pytest.approx({
        "mwer/risk": (-0.35 - 0.3) / 2,       # sum P^ W per group with an ended hypothesis (B: -0.3)
        "mwer/mean_risk": (-0.4 - 0.3) / 2,   # W_bar per group
        "mwer/top_prob": (0.5 + 1.0) / 2,
        "mwer/unterminated": 2 / 6, "mwer/groups_without_signal": 1 / 2})


def test_the_gradient_is_p_hat_times_risk_minus_the_weighted_risk_for_random_groups():
    torch.manual_seed(0)
    seq = torch.randn(12, dtype=torch.float64) * 3
    risk = torch.rand(12, dtype=torch.float64)
    group = torch.arange(4).repeat_interleave(3)[torch.randperm(12)]
    keep = torch.rand(12) > 0.2
    x = seq.clone().requires_grad_()
    loss, _ = mwer_loss(x, risk, group, keep)
    loss.backward()
    expected_loss, expected_grad = 0.0, torch.zeros(12, dtype=torch.float64)
    for g in range(4):  # the slow twin: one group at a time, softmax over its kept rows
        rows = ((group == g) & keep).nonzero().flatten()
        if len(rows) == 0:
            continue
        p = torch.softmax(seq[rows], 0)
        expected_loss += float((p * (risk[rows] - risk[rows].mean())).sum()) / 4
        expected_grad[rows] = p * (risk[rows] - (p * risk[rows]).sum()) / 4
    assert float(loss.detach()) == pytest.approx(expected_loss, abs=1e-12)
    assert torch.allclose(x.grad, expected_grad, atol=1e-12)


def test_a_constant_added_to_every_log_p_of_a_group_changes_nothing():
    logp, mask, ids, rewards, group = _batch()
    ended, adv = ended_with_eos(ids, mask, EOS), rewards[:, None] * mask
    runs = []
    for shift_a, shift_b in ((0.0, 0.0), (-7.0, 3.0), (40.0, -40.0)):
        lp = logp.clone()
        lp[:, 0] += torch.where(group == 0, shift_a, shift_b)  # one token per row: log p(y) + c_group
        lp.requires_grad_()
        out = compute_policy_loss("mwer", lp, lp.detach(), adv, mask, group_index=group, ended=ended)
        out.loss.backward()
        runs.append((out.loss.detach(), lp.grad))
    for loss, grad in runs[1:]:
        _close(loss, runs[0][0], atol=1e-6)
        _close(grad, runs[0][1], atol=1e-6)


def test_groups_without_an_ended_hypothesis_and_inf_padding_give_zero_finite_gradients():
    logp = torch.tensor([[-1.0, -float("inf")], [-2.0, -3.0], [-0.5, -float("inf")]]).requires_grad_()
    mask = torch.tensor([[1, 0], [1, 1], [1, 0]])
    adv = torch.tensor([[1.0, float("nan")], [0.0, 0.0], [0.5, float("nan")]])
    out = compute_policy_loss("mwer", logp, logp.detach(), adv, mask, group_index=torch.tensor([0, 0, 1]),
                              ended=torch.tensor([False, False, False]))
    out.loss.backward()
    assert float(out.loss.detach()) == 0.0 and torch.equal(logp.grad, torch.zeros(3, 2))
    assert out.metrics["mwer/unterminated"] == 1.0 and out.metrics["mwer/groups_without_signal"] == 1.0
    with pytest.raises(ValueError, match="mwer' renormalises over each group: pass group_index"):
        compute_policy_loss("mwer", logp, logp, adv, mask)


def test_sequence_risk_is_minus_the_return_at_the_first_token():
    adv = torch.tensor([[0.2, 0.3], [float("nan"), 0.7], [float("nan"), float("nan")]])
    mask = torch.tensor([[1, 1], [0, 1], [0, 0]])
    _close(sequence_risk(adv, mask), [-0.2, -0.7, 0.0])


def test_the_mwer_estimator_passes_the_rewards_and_the_kl_penalty_to_go():
    mask = torch.tensor([[1, 1], [1, 0]])
    out = compute_advantages("mwer", AdvantageInputs(torch.tensor([0.5, 1.0]), mask, group_size=2))
    _close(out.advantages, [[0.5, 0.5], [1.0, 0.0]])  # no baseline, no scale: the loss has the baseline
    # KL in the reward: returns to go = 0.5 - 0.1 - 0.2 = 0.2, 0.5 - 0.2 = 0.3; 1.0 - 0.3 = 0.7, so the
    # loss's risk (the first token) is minus the KL-regularised sequence reward
    kl = torch.tensor([[0.1, 0.2], [0.3, 0.0]])
    out = compute_advantages("mwer", AdvantageInputs(torch.tensor([0.5, 1.0]), mask, group_size=2, kl_penalty=kl))
    _close(out.advantages, [[0.2, 0.3], [0.7, 0.0]])
    _close(sequence_risk(out.advantages, mask), [-0.2, -0.7])
    assert advantage_spec("mwer").grouped and advantage_spec("mwer").baseline_in_loss


def test_the_mwer_loss_declares_groups_no_ratio_and_the_ce_cap():
    spec = POLICY_LOSSES.spec("mwer")
    assert (spec.grouped, spec.ratio, spec.max_sft_coef) == (True, False, 0.1)
    assert all(POLICY_LOSSES.spec(n).ratio and not POLICY_LOSSES.spec(n).grouped for n in ("ppo", "gspo", "gspo_token"))
