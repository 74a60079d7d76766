"""LUFFY's off-policy member (arXiv:2504.14945): the shaped, unclipped loss and its gradient, against
numbers worked out by hand."""
from __future__ import annotations

import math

import pytest
import torch

from asr_rl.algos.losses import compute_policy_loss
from asr_rl.algos.off_policy import luffy_shaping, mix_off_policy, on_policy_mask

LN, INF = math.log, float("inf")


def _t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def test_shaping_is_p_over_p_plus_gamma():
    # f(0.4) = 0.4 / 0.5 = 0.8; f(0.2) = 0.2 / 0.3 = 2/3; f(1) = 1 / 1.1; gamma 0.5: f(0.5) = 0.5
    torch.testing.assert_close(luffy_shaping(_t([LN(0.4), LN(0.2), 0.0])), _t([0.8, 2 / 3, 1 / 1.1]))
    torch.testing.assert_close(luffy_shaping(_t([LN(0.5)]), gamma=0.5), _t([0.5]))
    assert torch.isfinite(luffy_shaping(_t([-1e4, 1e4]))).all()  # no overflow at either end
    with pytest.raises(ValueError, match="gamma must be > 0"):
        luffy_shaping(_t([0.0]), gamma=0.0)


@pytest.mark.parametrize("name", ["ppo", "gspo", "gspo_token"])
def test_one_on_and_one_off_policy_sequence_by_hand(name):
    # row 0 on-policy, 1 token (+ padding at -inf): pi = old = 0.5 -> r = 1, A = +1: loss -A r = -1,
    #   d/dlogp = -A r = -1 (one token: the sequence ratio of gspo is the token ratio).
    # row 1 off-policy (the reference), pi = 0.4 and 0.2, A = -0.5. Its old log-probs would give
    #   ratios 4 and 2 (PPO: max(0.5 * 4, 0.5 * 1.2) = 2 and 1); LUFFY ignores them: f = 0.8 and 2/3,
    #   loss -A f = 0.4 and 1/3; d/dlogp = -A * gamma pi / (pi + gamma)^2 = 0.5 * 0.04 / 0.25 = 0.08
    #   and 0.5 * 0.02 / 0.09 = 1/9.
    # token-mean over the 3 tokens: (-1 + 0.4 + 1/3) / 3 = -0.0888889; gradients / 3.
    logp = _t([[LN(0.5), -INF], [LN(0.4), LN(0.2)]]).requires_grad_(True)
    old = _t([[LN(0.5), 0.0], [LN(0.1), LN(0.1)]])
    adv, mask, off = _t([[1.0, 1.0], [-0.5, -0.5]]), _t([[1, 0], [1, 1]]), torch.tensor([False, True])
    out = compute_policy_loss(name, logp, old, adv, mask, off_policy=off)
    out.loss.backward()
    torch.testing.assert_close(out.loss, _t((-1 + 0.4 + 1 / 3) / 3))
    torch.testing.assert_close(logp.grad, _t([[-1 / 3, 0.0], [0.08 / 3, 1 / 27]]))
    # ratio metrics over the sampled tokens only (else the off row's ratios 4 and 2 would show)
    assert out.metrics["policy/ratio_max"] == pytest.approx(1.0) and out.metrics["policy/clip_frac"] == 0.0
    assert out.metrics["policy/off_policy_prob"] == pytest.approx(0.3)  # (0.4 + 0.2) / 2
    assert out.metrics["policy/off_policy_shaped"] == pytest.approx((0.8 + 2 / 3) / 2)


def test_without_the_flag_the_same_rows_are_clipped_ppo():
    # the control: row 1 as an on-policy row is PPO's max(0.5 * 4, 0.5 * 1.2) = 2 and max(1, 0.6) = 1
    logp = _t([[LN(0.5), -INF], [LN(0.4), LN(0.2)]])
    old = _t([[LN(0.5), 0.0], [LN(0.1), LN(0.1)]])
    out = compute_policy_loss("ppo", logp, old, _t([[1.0, 1.0], [-0.5, -0.5]]), _t([[1, 0], [1, 1]]))
    torch.testing.assert_close(out.loss, _t((-1 + 2 + 1) / 3))


def test_mix_keeps_on_policy_rows_and_padding_and_the_mask_helper():
    loss_mat = _t([[7.0, 9.0], [5.0, 3.0]])
    logp, adv = _t([[0.0, -INF], [LN(0.4), -INF]]), _t([[1.0, 1.0], [2.0, 2.0]])
    mask, off = _t([[1, 0], [1, 0]]), torch.tensor([False, True])
    mixed, _ = mix_off_policy(loss_mat, logp, adv, mask, off)
    torch.testing.assert_close(mixed, _t([[7.0, 9.0], [-1.6, 3.0]]))  # -2 * 0.8 on the off token only
    assert on_policy_mask(mask, off).tolist() == [[True, False], [False, False]]
    assert on_policy_mask(mask, None).tolist() == [[True, False], [True, False]]
