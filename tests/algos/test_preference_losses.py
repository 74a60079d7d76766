"""DPO variants and KTO against numbers worked out by hand."""
import math

import pytest
import torch

from asr_rl.algos.preference_losses import PREFERENCE_LOSSES, dpo_loss, kto_loss, register_preference_loss

T = torch.tensor


def _log_sigmoid(x):
    return -math.log1p(math.exp(-x))


def test_sigmoid_dpo_by_hand():
    # pair 1: chosen moved up 1.0 and rejected down 0.5 from the reference: h = 1.5
    # pair 2: h = (-0.2) - (0.3) = -0.5
    out = dpo_loss(T([-1.0, -2.2]), T([-3.5, -1.7]), T([-2.0, -2.0]), T([-3.0, -2.0]), beta=0.1)
    want = (-_log_sigmoid(0.15) - _log_sigmoid(-0.05)) / 2
    assert float(out.loss) == pytest.approx(want, abs=1e-6)
    assert out.metrics["dpo/chosen_reward"] == pytest.approx((0.1 * 1.0 + 0.1 * -0.2) / 2)
    assert out.metrics["dpo/rejected_reward"] == pytest.approx((0.1 * -0.5 + 0.1 * 0.3) / 2)
    assert out.metrics["dpo/reward_accuracy"] == 0.5


def test_label_smoothing_mixes_in_the_flipped_label():
    # h = 2, beta 0.5: (1 - 0.1) * -log sigma(1) + 0.1 * -log sigma(-1)
    out = dpo_loss(T([0.0]), T([0.0]), T([-1.0]), T([1.0]), beta=0.5, label_smoothing=0.1)
    assert float(out.loss) == pytest.approx(-0.9 * _log_sigmoid(1.0) - 0.1 * _log_sigmoid(-1.0), abs=1e-6)


def test_ipo_and_hinge_by_hand():
    # h = 3, beta 0.25: ipo (3 - 2)^2 = 1; hinge max(0, 1 - 0.75) = 0.25
    args = (T([0.0]), T([0.0]), T([-2.0]), T([1.0]))
    assert float(dpo_loss(*args, beta=0.25, loss_type="ipo").loss) == pytest.approx(1.0)
    assert float(dpo_loss(*args, beta=0.25, loss_type="hinge").loss) == pytest.approx(0.25)


def test_the_gradient_raises_chosen_and_lowers_rejected():
    pi_c, pi_r = T([-2.0], requires_grad=True), T([-2.0], requires_grad=True)
    dpo_loss(pi_c, pi_r, T([-2.0]), T([-2.0]), beta=0.1).loss.backward()
    # d/dh -log sigma(beta h) at h = 0: -beta/2 = -0.05
    assert float(pi_c.grad) == pytest.approx(-0.05) and float(pi_r.grad) == pytest.approx(0.05)


def test_an_unknown_loss_type_names_the_valid_ones():
    with pytest.raises(ValueError, match="sigmoid"):
        dpo_loss(T([0.0]), T([0.0]), T([0.0]), T([0.0]), beta=0.1, loss_type="nope")


def test_a_new_variant_is_one_registry_entry():
    @register_preference_loss("test_square")
    def square(h, beta, label_smoothing):
        return (beta * h) ** 2

    assert float(dpo_loss(T([1.0]), T([0.0]), T([0.0]), T([0.0]), beta=2.0, loss_type="test_square").loss) == 4.0


def test_kto_by_hand():
    # r = pi - ref: 1.0 (desirable), -0.5 (undesirable); mismatched KL mean 0.2 -> z0 = 0.2, beta 1
    out = kto_loss(T([-1.0, -3.0]), T([-2.0, -2.5]), T([True, False]), T([-1.0, -1.4]), T([-1.3, -1.5]),
                   beta=1.0, desirable_weight=1.0, undesirable_weight=2.0)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    want = ((1 - sig(1.0 - 0.2)) + 2.0 * (1 - sig(0.2 + 0.5))) / 2
    assert float(out.loss) == pytest.approx(want, abs=1e-6)
    assert out.metrics["kto/kl"] == pytest.approx(0.2)
    # a negative KL estimate is clamped to 0
    neg = kto_loss(T([0.0]), T([0.0]), T([True]), T([-2.0]), T([-1.0]), beta=1.0)
    assert neg.metrics["kto/kl"] == 0.0 and float(neg.loss) == pytest.approx(0.5)


def test_kto_is_a_registry_entry_that_declares_unpaired_input():
    assert "kto" in PREFERENCE_LOSSES.where(paired=False)
    assert {"sigmoid", "ipo", "hinge"} <= set(PREFERENCE_LOSSES.where(paired=True))
    with pytest.raises(ValueError, match="'kto' is unpaired: use kto_loss"):
        dpo_loss(T([0.0]), T([0.0]), T([0.0]), T([0.0]), beta=0.1, loss_type="kto")
    with pytest.raises(ValueError, match="'sigmoid' is paired: use dpo_loss"):
        kto_loss(T([0.0]), T([0.0]), T([True]), T([0.0]), T([0.0]), beta=0.1, loss_type="sigmoid")
    with pytest.raises(ValueError, match="unknown preference loss 'nope'; valid: .*kto"):
        PREFERENCE_LOSSES.check("nope")


def test_a_new_unpaired_variant_is_one_registry_entry():
    @register_preference_loss("test_unpaired_linear", paired=False)
    def linear(m, desirable, beta, desirable_weight, undesirable_weight):
        return torch.where(desirable, -beta * m, beta * m)

    # r = pi - ref = [1.0, -0.5]; mismatched KL [0.3, 0.1] -> z0 = 0.2; m = r - z0 = [0.8, -0.7]
    # beta 2: desirable -2 * 0.8 = -1.6, undesirable 2 * -0.7 = -1.4; mean -1.5
    out = kto_loss(T([-1.0, -3.0]), T([-2.0, -2.5]), T([True, False]), T([-1.0, -1.4]), T([-1.3, -1.5]),
                   beta=2.0, loss_type="test_unpaired_linear")
    assert float(out.loss) == pytest.approx(-1.5)
