"""Rollout/trainer mismatch correction: weights worked out by hand for every entry, the loss they
weigh, the gradient they leave, and the metrics."""
import math

import pytest
import torch

from asr_rl.algos.losses import compute_policy_loss
from asr_rl.algos.rollout_correction import ROLLOUT_CORRECTIONS, mismatch_metrics, rollout_correction

LOG = math.log
INF = float("inf")
# token ratios rho = exp(old - rollout): row 0 is [0.25, 1, 8] (product 2, geometric mean 2^(1/3));
# row 1 is [2, 4, pad] (product 8, geometric mean sqrt(8) = 2.83)
OLD = torch.tensor([[LOG(0.25), 0.0, LOG(8.0)], [LOG(2.0), LOG(4.0), -INF]])
ROLLOUT = torch.zeros(2, 3).masked_fill(torch.tensor([[False, False, False], [False, False, True]]), -INF)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


@pytest.mark.parametrize("name, expected", [
    ("tis", [[0.5, 1.0, 5.0], [2.0, 4.0, 0.0]]),            # clamp to [0.5, 5]
    ("icepop", [[0.0, 1.0, 0.0], [2.0, 4.0, 0.0]]),         # rho outside [0.5, 5] -> 0
    ("token_mis", [[0.25, 1.0, 0.0], [2.0, 4.0, 0.0]]),     # only rho > 5 -> 0
    ("seq_mis", [[2.0, 2.0, 2.0], [0.0, 0.0, 0.0]]),        # product 2 kept, 8 > 5 dropped
    ("seq_mask_tis", [[0.25, 1.0, 8.0], [2.0, 4.0, 0.0]]),  # both geometric means in [0.5, 5]
])
def test_weights_by_hand(name, expected):
    out = rollout_correction(name, OLD, ROLLOUT, MASK, (0.5, 5.0))
    assert torch.allclose(out.weights, torch.tensor(expected), atol=1e-6)
    zeros = sum(v == 0 for row, m in zip(expected, MASK.tolist()) for v, k in zip(row, m) if k)
    assert out.metrics["rollout_corr/masked_frac"] == pytest.approx(zeros / 5)
    assert out.metrics["rollout_corr/weight_mean"] == pytest.approx(sum(map(sum, expected)) / 5, rel=1e-6)


def test_seq_mask_tis_filters_on_the_geometric_mean():
    # a threshold of [0.5, 2.5]: row 0's geometric mean 1.26 is kept, row 1's 2.83 is dropped
    out = rollout_correction("seq_mask_tis", OLD, ROLLOUT, MASK, (0.5, 2.5))
    assert torch.allclose(out.weights, torch.tensor([[0.25, 1.0, 8.0], [0.0, 0.0, 0.0]]))


def test_extreme_ratios_give_finite_weights_and_zero_at_padding():
    old = torch.tensor([[0.0, -1000.0, 1000.0, -INF]])
    rollout = torch.tensor([[-1000.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    for name in ROLLOUT_CORRECTIONS:
        w = rollout_correction(name, old, rollout, mask, (0.5, 5.0)).weights
        assert torch.isfinite(w).all() and w[0, 3] == 0, name
    assert rollout_correction("tis", old, rollout, mask, (0.5, 5.0)).weights.tolist() == [[5.0, 0.5, 5.0, 0.0]]


def test_bad_threshold_and_name_are_named():
    with pytest.raises(ValueError, match="0 <= low < high"):
        rollout_correction("tis", OLD, ROLLOUT, MASK, (5.0, 0.5))
    with pytest.raises(ValueError, match="unknown rollout correction 'tiss'; valid: icepop, seq_binary_kl, seq_mask_tis, seq_mis"):
        rollout_correction("tiss", OLD, ROLLOUT, MASK, (0.5, 5.0))


def test_ppo_loss_weighs_each_token_and_the_gradient_by_its_weight():
    # ratio 1 everywhere (logp = old), A = 1: per-token loss -w; token-mean over 3 tokens
    logp = torch.zeros(1, 3, requires_grad=True)
    w = torch.tensor([[0.5, 1.0, 0.0]])
    out = compute_policy_loss("ppo", logp, torch.zeros(1, 3), torch.ones(1, 3), torch.ones(1, 3), rollout_weights=w)
    assert out.loss.item() == pytest.approx(-1.5 / 3)
    out.loss.backward()
    # d(-w * exp(logp - old) * A)/d logp = -w / 3 at ratio 1: a masked token (w = 0) gets no gradient
    assert torch.allclose(logp.grad, torch.tensor([[-0.5 / 3, -1.0 / 3, 0.0]]))


def test_gspo_takes_its_ratio_against_the_engine_when_correcting():
    # OpenRLHF's gspo with is_correction: s = exp(mean(logp - rollout_logp)), no token weights
    logp = torch.tensor([[LOG(0.5), LOG(0.5)]], requires_grad=True)
    old, rollout = torch.tensor([[LOG(0.5), LOG(0.5)]]), torch.tensor([[LOG(0.25), LOG(0.5)]])
    adv, mask = torch.ones(1, 2), torch.ones(1, 2)
    plain = compute_policy_loss("gspo", logp, old, adv, mask, eps_clip_low=1.0, eps_clip_high=1.0)
    corrected = compute_policy_loss("gspo", logp, old, adv, mask, eps_clip_low=1.0, eps_clip_high=1.0,
                                    rollout_weights=torch.zeros(1, 2), rollout_logp=rollout)
    assert plain.loss.item() == pytest.approx(-1.0)
    assert corrected.loss.item() == pytest.approx(-math.sqrt(2.0))  # s = exp(log 2 / 2)


def test_mismatch_metrics_by_hand():
    # log(rollout / old) = [-1, 0.5] on the valid tokens: k1 mean -0.25, k3 = mean(e^{-x} - 1 + x)
    old = torch.tensor([[0.0, -1.0, 7.0]])
    rollout = torch.tensor([[-1.0, -0.5, -INF]])
    m = mismatch_metrics(old, rollout, torch.tensor([[1, 1, 0]]))
    assert m["rollout_corr/kl"] == pytest.approx(-0.25)
    k3 = ((math.e - 1 - 1) + (math.exp(-0.5) - 1 + 0.5)) / 2
    assert m["rollout_corr/k3_kl"] == pytest.approx(k3, rel=1e-6)
    assert m["rollout_corr/max_abs_log_ratio"] == pytest.approx(1.0)


# engine probability p = 0.5 on both tokens, trainer q = 0.6 and 0.5 (rho = q / p = 1.2, 1):
# binary KL of token 0 = 0.5 ln(0.5/0.6) + 0.5 ln(0.5/0.4) = 0.5 (-0.18232 + 0.22314) = 0.020411,
# token 1: 0; TV |p - q| = 0.1 and 0. Per sequence: binary KL 0.010206, TV 0.05.
P_OLD = torch.tensor([[LOG(0.6), LOG(0.5)]])
P_ROLLOUT = torch.tensor([[LOG(0.5), LOG(0.5)]])


@pytest.mark.parametrize("name, high, expected", [
    ("token_binary_kl", 0.03, [1.2, 1.0]), ("token_binary_kl", 0.02, [0.0, 1.0]),
    ("token_tv", 0.11, [1.2, 1.0]), ("token_tv", 0.09, [0.0, 1.0]),
    ("seq_binary_kl", 0.0103, [1.2, 1.0]), ("seq_binary_kl", 0.0101, [0.0, 0.0]),
    ("seq_tv", 0.051, [1.2, 1.0]), ("seq_tv", 0.049, [0.0, 0.0]),
])
def test_divergence_gates_by_hand(name, high, expected):
    w = rollout_correction(name, P_OLD, P_ROLLOUT, torch.ones(1, 2), (0.0, high)).weights
    assert w[0].tolist() == pytest.approx(expected, abs=1e-6)
    assert ROLLOUT_CORRECTIONS.spec(name).upper_only and not ROLLOUT_CORRECTIONS.spec("icepop").upper_only


def test_a_divergence_gate_refuses_a_lower_bound_at_load():
    from asr_rl.trainer.configs.rl import AlgoConfig

    with pytest.raises(ValueError, match=r"bounds a divergence from above only: set "
                                         r"algo.rollout_correction_threshold=\[0, 5.0\]"):
        AlgoConfig(rollout_correction="seq_binary_kl")
    assert AlgoConfig(rollout_correction="seq_binary_kl", rollout_correction_threshold=(0.0, 0.01))
