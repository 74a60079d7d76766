"""Policy/KL/value losses against numbers worked out by hand (style of torchtune
tests/torchtune/rlhf/test_rewards.py and test_loss.py)."""
from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch

import asr_rl.algos.losses as loss_mod
from asr_rl.algos.losses import (
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    AdaptiveKLController,
    FixedKLController,
    LossOutput,
    aggregate_loss,
    compute_policy_loss,
    entropy_loss,
    get_policy_loss_fn,
    kl_estimate,
    kl_loss,
    reward_kl_penalty,
    register_policy_loss,
    value_loss,
)

NAN, INF = float("nan"), float("inf")
LN = math.log


def _t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def _close(actual, expected, atol: float = 1e-5) -> None:
    if isinstance(actual, torch.Tensor):
        torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)
    else:
        assert actual == pytest.approx(expected, abs=atol)


# --------------------------------------------------------------------------- aggregation


def test_aggregation_modes_lengths_one_and_three():
    # row 0 has 1 token (4), row 1 has 3 tokens (1, 2, 3); NaN at padding must be ignored
    loss_mat = _t([[4.0, NAN, NAN], [1.0, 2.0, 3.0]])
    mask = _t([[1, 0, 0], [1, 1, 1]])
    _close(aggregate_loss(loss_mat, mask, "token-mean"), (4 + 1 + 2 + 3) / 4)  # 2.5
    _close(aggregate_loss(loss_mat, mask, "seq-mean-token-mean"), (4 / 1 + 6 / 3) / 2)  # 3.0
    _close(aggregate_loss(loss_mat, mask, "seq-mean-token-sum"), (4 + 6) / 2)  # 5.0


def test_aggregation_with_an_empty_row():
    # A third row with no tokens: token-mean unchanged (2.5); seq-mean-token-mean leaves it out (3.0);
    # seq-mean-token-sum divides by all N = 3 rows: 10 / 3.
    loss_mat = _t([[4.0, NAN, NAN], [1.0, 2.0, 3.0], [NAN, NAN, NAN]])
    mask = _t([[1, 0, 0], [1, 1, 1], [0, 0, 0]])
    _close(aggregate_loss(loss_mat, mask, "token-mean"), 2.5)
    _close(aggregate_loss(loss_mat, mask, "seq-mean-token-mean"), 3.0)
    _close(aggregate_loss(loss_mat, mask, "seq-mean-token-sum"), 10 / 3)
    for mode in LOSS_AGG_MODES:  # no valid token at all -> 0, not NaN
        _close(aggregate_loss(loss_mat, torch.zeros_like(mask), mode), 0.0)


def test_aggregation_unknown_mode_lists_modes():
    with pytest.raises(ValueError) as e:
        aggregate_loss(_t([[1.0]]), _t([[1]]), "seq-sum")
    assert all(m in str(e.value) for m in LOSS_AGG_MODES)


# --------------------------------------------------------------------------- ppo


def _ppo_case():
    """Four tokens in a (2, 3) batch, with -inf log-probs and NaN advantages at padding.

    token  ratio  A    unclipped -A*r   clipped -A*clip(r, 0.8, 1.2)   loss = max   clipped?
    a      1.1    2    -2.2             -2.2                            -2.2         no (inside)
    b      1.5    1    -1.5             -1.2                            -1.2         yes (A>0, above)
    c      0.5   -1     0.5              0.8                             0.8         yes (A<0, below)
    d      1.5   -1     1.5              1.2                             1.5         no (pessimistic min)
    """
    old = _t([[-1.0, -1.0, -1.0], [-2.0, -INF, -INF]])
    logp = old.clone()
    logp[0, 0] += LN(1.1)
    logp[0, 1] += LN(1.5)
    logp[0, 2] += LN(0.5)
    logp[1, 0] += LN(1.5)
    logp[1, 1:] = -INF
    adv = _t([[2.0, 1.0, -1.0], [-1.0, NAN, NAN]])
    mask = _t([[1, 1, 1], [1, 0, 0]])
    return logp.requires_grad_(), old, adv, mask


def test_ppo_clip_cases_by_hand():
    logp, old, adv, mask = _ppo_case()
    out = compute_policy_loss("ppo", logp, old, adv, mask)
    assert isinstance(out, LossOutput)
    # token-mean: (-2.2 - 1.2 + 0.8 + 1.5) / 4 = -1.1 / 4 = -0.275
    _close(out.loss, -0.275)
    _close(out.metrics["policy/clip_frac"], 2 / 4)  # tokens b and c
    _close(out.metrics["policy/ratio_mean"], (1.1 + 1.5 + 0.5 + 1.5) / 4)  # 1.15
    _close(out.metrics["policy/ratio_max"], 1.5)
    _close(out.metrics["policy/ratio_min"], 0.5)
    # approx_kl = mean of k3(old||new) = (r - 1) - ln r over the 4 tokens
    k3 = [r - 1 - LN(r) for r in (1.1, 1.5, 0.5, 1.5)]
    _close(out.metrics["policy/approx_kl"], sum(k3) / 4)
    assert "policy/dual_clip_frac" not in out.metrics
    assert all(isinstance(v, float) for v in out.metrics.values())
    out.loss.backward()
    # d(-A r)/d logp = -A r, / 4 tokens: a: -2 * 1.1 / 4 = -0.55; b, c clipped: 0; d: 1.5 / 4 = 0.375
    _close(logp.grad, [[-0.55, 0.0, 0.0], [0.375, 0.0, 0.0]])


def test_ppo_asymmetric_clip_higher():
    # eps_low 0.2, eps_high 0.28 -> range [0.8, 1.28]
    #   r 1.5,  A  1: max(-1.5, -1.28) = -1.28  clipped
    #   r 1.25, A  1: inside [0.8, 1.28]: -1.25 (symmetric 0.2 would clip to -1.2)
    #   r 0.5,  A -1: max(0.5, 0.8) = 0.8       clipped
    # token-mean: (-1.28 - 1.25 + 0.8) / 3 = -0.576667; clip_frac 2/3
    old = torch.zeros(1, 3)
    logp = _t([[LN(1.5), LN(1.25), LN(0.5)]])
    adv = _t([[1.0, 1.0, -1.0]])
    out = compute_policy_loss("ppo", logp, old, adv, torch.ones(1, 3), eps_clip_low=0.2, eps_clip_high=0.28)
    _close(out.loss, (-1.28 - 1.25 + 0.8) / 3)
    _close(out.metrics["policy/clip_frac"], 2 / 3)
    sym = compute_policy_loss("ppo", logp, old, adv, torch.ones(1, 3))
    _close(sym.loss, (-1.2 - 1.2 + 0.8) / 3)


def test_ppo_dual_clip_negative_advantage():
    # c = 3
    #   r 5, A -1: standard max(5, 1.2) = 5; dual min(5, -c*A = 3) = 3     dual active
    #   r 2, A -1: standard max(2, 1.2) = 2; dual min(2, 3) = 2            not active
    #   r 5, A  1: standard max(-5, -1.2) = -1.2 (clipped); A > 0: no dual
    # token-mean (3 + 2 - 1.2) / 3 = 1.266667; clip_frac 1/3 (third token); dual_clip_frac 1/3
    logp = _t([[LN(5.0), LN(2.0), LN(5.0)]]).requires_grad_()
    adv = _t([[-1.0, -1.0, 1.0]])
    out = compute_policy_loss("ppo", logp, torch.zeros(1, 3), adv, torch.ones(1, 3), dual_clip=3.0)
    _close(out.loss, 3.8 / 3)
    _close(out.metrics["policy/dual_clip_frac"], 1 / 3)
    _close(out.metrics["policy/clip_frac"], 1 / 3)
    out.loss.backward()
    # dual-clipped token: loss is the constant 3 -> grad 0; token 2: d(-A r)/dlogp = r = 2, / 3
    _close(logp.grad, [[0.0, 2 / 3, 0.0]])


@pytest.mark.parametrize("c", [1.0, 0.5])
def test_dual_clip_must_exceed_one(c):
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        compute_policy_loss("ppo", torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1),
                            dual_clip=c)


def test_ppo_loss_agg_mode_passes_through():
    # per-token losses: row 0 [-2.2, -1.2, 0.8] (sum -2.6, mean -0.866667), row 1 [1.5]
    # seq-mean-token-mean: (-0.866667 + 1.5) / 2 = 0.316667; seq-mean-token-sum: (-2.6 + 1.5) / 2 = -0.55
    logp, old, adv, mask = _ppo_case()
    _close(compute_policy_loss("ppo", logp, old, adv, mask, loss_agg_mode="seq-mean-token-mean").loss,
           (-2.6 / 3 + 1.5) / 2)
    _close(compute_policy_loss("ppo", logp, old, adv, mask, loss_agg_mode="seq-mean-token-sum").loss, -0.55)


# --------------------------------------------------------------------------- gspo


@pytest.mark.parametrize("name", ["gspo", "gspo_token"])
def test_gspo_sequence_ratio_by_hand(name):
    # row 0 log-ratios [0.2, 0.4, pad] -> s0 = exp(0.3) = 1.349859; row 1 [-0.1, pad, pad] -> s1 = exp(-0.1) = 0.904837
    # A row 0 = +1: s0 > 1.2 -> clipped, loss -1.2 at both tokens, grad 0
    # A row 1 = -1: s1 inside [0.8, 1.2] -> loss 0.904837
    # token-mean: (-1.2 * 2 + 0.904837) / 3 = -0.498388
    old = _t([[-1.0, -2.0, -INF], [-1.0, -INF, -INF]])
    logp = _t([[-0.8, -1.6, -INF], [-1.1, -INF, -INF]]).requires_grad_()
    adv = _t([[1.0, 1.0, NAN], [-1.0, NAN, NAN]])
    mask = _t([[1, 1, 0], [1, 0, 0]])
    out = compute_policy_loss(name, logp, old, adv, mask)
    s0, s1 = math.exp(0.3), math.exp(-0.1)
    _close(out.loss, (-2.4 + s1) / 3)
    _close(out.metrics["policy/ratio_max"], s0)
    _close(out.metrics["policy/ratio_min"], s1)
    _close(out.metrics["policy/ratio_mean"], (2 * s0 + s1) / 3)
    _close(out.metrics["policy/clip_frac"], 2 / 3)
    out.loss.backward()
    # row 1 token: d(-A * sg[s1] * exp(lp - sg[lp]))/dlp = s1, / 3 tokens
    assert torch.isfinite(logp.grad).all()
    _close(logp.grad, [[0.0, 0.0, 0.0], [s1 / 3, 0.0, 0.0]])


@pytest.mark.parametrize("name", ["gspo", "gspo_token"])
def test_gspo_gradient_equals_the_sequence_objective_with_sequence_advantages(name):
    # Unclipped, seq-mean-token-mean: grad of GSPO-token == grad of -mean_i A_i * exp(mean_t log-ratio).
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 4, generator=g, dtype=torch.float64)
    base = old + 0.1 * torch.randn(3, 4, generator=g, dtype=torch.float64)
    mask = _t([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]]).double()
    seq_adv = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    adv = seq_adv[:, None].expand(3, 4)
    lp = base.clone().requires_grad_()
    compute_policy_loss(name, lp, old, adv, mask, eps_clip_low=10.0, eps_clip_high=10.0,
                        loss_agg_mode="seq-mean-token-mean").loss.backward()
    ref = base.clone().requires_grad_()
    s = torch.exp(((ref - old) * mask).sum(-1) / mask.sum(-1))
    (-(seq_adv * s).mean()).backward()
    torch.testing.assert_close(lp.grad, ref.grad * mask)


def test_gspo_sequence_and_token_gradients_differ_with_token_advantages():
    # one sequence, 2 tokens, logp = old (s = 1), token advantages [1, 3], token-mean, unclipped:
    #   gspo (sequence): loss = -(1 * s + 3 * s) / 2, ds/dlp_t = s / 2 -> grad = -(4 / 2) / 2 = -1 per token
    #   gspo_token:      token t's loss -A_t * s_t with ds_t/dlp_t = 1 -> grad = -A_t / 2 = [-0.5, -1.5]
    old, adv, mask = _t([[-1.0, -2.0]]), _t([[1.0, 3.0]]), _t([[1, 1]])
    grads = {}
    for name in ("gspo", "gspo_token"):
        lp = old.clone().requires_grad_()
        compute_policy_loss(name, lp, old, adv, mask).loss.backward()
        grads[name] = lp.grad
    _close(grads["gspo"], [[-1.0, -1.0]])
    _close(grads["gspo_token"], [[-0.5, -1.5]])


# --------------------------------------------------------------------------- nan safety


@pytest.mark.parametrize("name", POLICY_LOSSES)
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_neg_inf_padding_gives_finite_loss_and_zero_grad(name, mode):
    torch.manual_seed(0)
    mask = _t([[1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]])
    pad = mask == 0
    logp = (-torch.rand(3, 4)).masked_fill(pad, -INF).requires_grad_()
    old = (-torch.rand(3, 4)).masked_fill(pad, -INF)
    ref = (-torch.rand(3, 4)).masked_fill(pad, -INF)
    adv = torch.randn(3, 4).masked_fill(pad, NAN)
    out = compute_policy_loss(name, logp, old, adv, mask, dual_clip=3.0, loss_agg_mode=mode,
                              group_index=torch.zeros(3, dtype=torch.long))  # one group (grouped losses)
    total = out.loss + kl_loss(logp, ref, mask, loss_agg_mode=mode).loss
    total = total + entropy_loss(torch.rand(3, 4).masked_fill(pad, NAN), mask, mode)
    total.backward()
    assert torch.isfinite(total)
    assert all(math.isfinite(v) for v in out.metrics.values())
    assert torch.isfinite(logp.grad).all()
    assert (logp.grad[pad] == 0).all() and (logp.grad[~pad] != 0).any()


def test_policy_registry(monkeypatch):
    assert set(POLICY_LOSSES) == {"ppo", "gspo", "gspo_token", "mwer"}
    assert POLICY_LOSSES.where(grouped=True) == ("mwer",) and POLICY_LOSSES.where(ratio=False) == ("mwer",)
    with pytest.raises(ValueError, match="unknown policy loss 'vanilla'; valid: gspo, gspo_token, mwer, ppo"):
        get_policy_loss_fn("vanilla")
    monkeypatch.setattr(POLICY_LOSSES, "_entries", dict(POLICY_LOSSES._entries))

    @register_policy_loss("zero")
    def zero(x):  # one typed input: PolicyLossInputs
        return LossOutput(x.logp.sum() * 0, {"eps_high": x.eps_clip_high})

    assert compute_policy_loss("zero", torch.ones(1, 1), None, None, None, eps_clip_high=0.28).metrics == \
        {"eps_high": 0.28}
    with pytest.raises(TypeError, match="eps_clip_hi"):  # a misspelt option is an error, not ignored
        compute_policy_loss("zero", torch.ones(1, 1), None, None, None, eps_clip_hi=0.28)


# --------------------------------------------------------------------------- kl


def test_kl_estimators_at_known_log_ratio():
    # log_ratio = logp - ref = +0.5 and -0.5
    #   k1 = log_ratio                          = 0.5, -0.5
    #   k2 = log_ratio^2 / 2                    = 0.125, 0.125
    #   k3 = exp(-lr) - 1 + lr: exp(-0.5) - 0.5 = 0.606531 - 0.5 = 0.106531
    #                           exp(0.5) - 1.5  = 1.648721 - 1.5 = 0.148721
    logp, ref = _t([[-1.0, -2.0]]), _t([[-1.5, -1.5]])
    _close(kl_estimate(logp, ref, "k1"), [[0.5, -0.5]])
    _close(kl_estimate(logp, ref, "k2"), [[0.125, 0.125]])
    _close(kl_estimate(logp, ref, "k3"), [[0.106531, 0.148721]])
    assert kl_estimate(logp.bfloat16(), ref.bfloat16()).dtype == torch.float32


def test_kl_estimates_are_clamped_to_10_at_extreme_ratios():
    # log_ratio -9: k3 = exp(9) - 1 - 9 = 8103.08 - 10 = 8093.08 -> 10;  log_ratio -40 and -1000: -> 10
    # k2 at log_ratio 5: 25 / 2 = 12.5 -> 10;  k1 at -40: -40 -> -10;  at -0.5 nothing is clamped
    logp, ref = _t([[-9.0, -40.0, -1000.0, -0.5]]), _t([[0.0, 0.0, 0.0, 0.0]])
    _close(kl_estimate(logp, ref, "k3"), [[10.0, 10.0, 10.0, math.exp(0.5) - 1.5]])
    _close(kl_estimate(_t([[5.0, -40.0]]), _t([[0.0, 0.0]]), "k2"), [[10.0, 10.0]])
    _close(kl_estimate(_t([[5.0, -40.0]]), _t([[0.0, 0.0]]), "k1"), [[5.0, -10.0]])
    _close(kl_estimate(logp[:, :1], ref[:, :1], "k3", clamp=None), [[math.exp(9) - 10]], atol=1e-2)
    _close(kl_estimate(logp[:, :1], ref[:, :1], "k3", clamp=100.0), [[100.0]])  # the bound is a setting
    assert torch.isinf(kl_estimate(logp[:, 2:3], ref[:, 2:3], "k3", clamp=None)).all()  # why a bound exists
    with pytest.raises(ValueError, match="kl clamp must be > 0"):
        kl_estimate(logp, ref, "k3", clamp=0.0)


def test_kl_gradient_is_zero_where_clamped_and_exact_elsewhere():
    # d k3 / d logp = 1 - exp(-log_ratio): at log_ratio -0.5: 1 - exp(0.5) = -0.648721; token-mean over
    # the 4 tokens divides by 4. The clamped tokens (-9, -40, -1000) get exactly 0, not NaN.
    logp = _t([[-9.0, -40.0, -1000.0, -0.5]]).requires_grad_()
    out = kl_loss(logp, torch.zeros(1, 4), torch.ones(1, 4), "k3")
    out.loss.backward()
    _close(logp.grad, [[0.0, 0.0, 0.0, (1 - math.exp(0.5)) / 4]])
    _close(out.metrics["kl/loss"], (30.0 + math.exp(0.5) - 1.5) / 4)


def test_kl_unknown_estimator_lists_names():
    with pytest.raises(ValueError) as e:
        kl_estimate(torch.zeros(1, 1), torch.zeros(1, 1), "k4")
    assert all(k in str(e.value) for k in KL_ESTIMATORS)


def test_kl_loss_by_hand():
    # log-ratios 0.5 and -0.5 as above, padding -inf: k3 mean = (0.106531 + 0.148721) / 2 = 0.127626
    logp = _t([[-1.0, -2.0, -INF]]).requires_grad_()
    ref = _t([[-1.5, -1.5, -INF]])
    out = kl_loss(logp, ref, _t([[1, 1, 0]]))
    _close(out.loss, 0.127626)
    _close(out.metrics["kl/loss"], 0.127626)
    out.loss.backward()
    # d k3 / d logp = 1 - exp(-lr): lr 0.5: 1 - 0.606531 = 0.393469; lr -0.5: 1 - 1.648721 = -0.648721; / 2
    _close(logp.grad, [[0.196735, -0.324361, 0.0]])


# --------------------------------------------------------------------------- value, entropy


def test_value_loss_clipped_both_branches():
    # c = 0.2, returns 2
    #   token 0: v 1.5, old 1.0 -> clip(v) = 1.2; (1.5-2)^2 = 0.25 < (1.2-2)^2 = 0.64 -> 0.64 (clipped branch)
    #   token 1: v 0.5, old 1.0 -> clip(v) = 0.8; (0.5-2)^2 = 2.25 > (0.8-2)^2 = 1.44 -> 2.25 (unclipped)
    # loss = 0.5 * (0.64 + 2.25) / 2 = 0.7225; clip_frac 1/2
    values = _t([[1.5, 0.5, NAN]]).requires_grad_()
    old, ret, mask = _t([[1.0, 1.0, NAN]]), _t([[2.0, 2.0, NAN]]), _t([[1, 1, 0]])
    out = value_loss(values, old, ret, mask)
    _close(out.loss, 0.7225)
    _close(out.metrics["critic/value_clip_frac"], 0.5)
    out.loss.backward()
    # token 0 sits on the clip boundary -> grad 0; token 1: 0.5 * 2 * (0.5 - 2) / 2 = -0.75; padding 0
    _close(values.grad, [[0.0, -0.75, 0.0]])
    # no clipping: 0.5 * (0.25 + 2.25) / 2 = 0.625
    _close(value_loss(values, old, ret, mask, value_clip=None).loss, 0.625)


def test_value_explained_variance():
    ret, mask = _t([[1.0, 2.0, 3.0]]), torch.ones(1, 3)
    _close(value_loss(ret, ret, ret, mask).metrics["critic/vf_explained_var"], 1.0)  # perfect critic
    flat = torch.full((1, 3), 2.0)  # predicts the mean: Var[R - v] = Var[R] -> 0
    _close(value_loss(flat, flat, ret, mask).metrics["critic/vf_explained_var"], 0.0)


def test_entropy_loss_aggregates():
    ent, mask = _t([[1.0, 2.0], [3.0, NAN]]), _t([[1, 1], [1, 0]])
    _close(entropy_loss(ent, mask), 2.0)  # (1 + 2 + 3) / 3
    _close(entropy_loss(ent, mask, "seq-mean-token-mean"), (1.5 + 3.0) / 2)


# --------------------------------------------------------------------------- kl controllers


def test_adaptive_kl_controller_updates_by_hand():
    ctl = AdaptiveKLController(init_kl_coef=0.1, target=6.0, horizon=10000)
    # current 9: e = clip(9/6 - 1 = 0.5, -0.2, 0.2) = 0.2; mult = 1 + 0.2 * 256 / 10000 = 1.00512
    ctl.update(9.0, 256)
    _close(ctl.value, 0.1 * 1.00512, atol=1e-12)  # 0.100512
    # current 5.4: e = 5.4/6 - 1 = -0.1; mult = 1 - 0.1 * 256 / 10000 = 0.99744
    ctl.update(5.4, 256)
    _close(ctl.value, 0.100512 * 0.99744, atol=1e-12)  # 0.1002546893
    with pytest.raises(ValueError):
        AdaptiveKLController(0.1, target=0.0, horizon=10)


def test_fixed_kl_controller_is_constant():
    ctl = FixedKLController(0.05)
    ctl.update(100.0, 1000)
    assert ctl.value == 0.05


def test_module_imports_only_torch_stdlib_and_advantages():
    tree = ast.parse(Path(loss_mod.__file__).read_text())
    mods = {(a.name if isinstance(n, ast.Import) else n.module)
            for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    assert mods <= {"__future__", "dataclasses", "typing", "torch", "asr_rl.registry", "asr_rl.algos.kl",
                    "asr_rl.algos.masked", "asr_rl.algos.off_policy", "asr_rl.algos.mwer", "asr_rl.algos.aggregation"}, mods
    import asr_rl.algos.aggregation as agg_mod
    import asr_rl.algos.kl as kl_mod
    import asr_rl.algos.masked as masked_mod

    for mod in (kl_mod, masked_mod, agg_mod):
        tree = ast.parse(Path(mod.__file__).read_text())
        imported = {(a.name if isinstance(n, ast.Import) else n.module)
                    for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
        # the registry is stdlib only (the KL estimators are one)
        assert imported <= {"__future__", "collections.abc", "dataclasses", "typing", "torch", "asr_rl.registry",
                            "asr_rl.algos.masked"}, \
            (mod.__name__, imported)


def test_reward_kl_penalty_by_hand():
    # old - ref = [0.5, pad]: k1 = 0.5, mean over the 1 valid token 0.5; penalty = 0.1 * 0.5 = 0.05
    old, ref, mask = _t([[-1.0, -INF]]), _t([[-1.5, 0.0]]), _t([[1, 0]])
    penalty, metrics = reward_kl_penalty(old, ref, mask, "k1", coef=0.1)
    _close(penalty, [[0.05, 0.0]])
    assert metrics == {"kl/mean": pytest.approx(0.5)}
    assert reward_kl_penalty(old, ref, mask, "k1", coef=0.0)[0] is None  # KL in the loss: measured only
    assert reward_kl_penalty(None, ref, mask) == (None, {})


def test_kl_unbiased_gradient_keeps_the_value_and_takes_w_times_k1():
    # token 0: logp -1, ref -2, old -1.5: k1 = 1, w = exp(0.5) = 1.64872; k3 = e^-1 - 1 + 1 = 0.367879
    # token 1: logp -0.1, ref -0.6, old -3: k1 = 0.5, w = exp(2.9) = 18.17 -> clipped to 10;
    #          k3 = e^-0.5 - 1 + 0.5 = 0.106531
    # token-mean over 2 tokens: value (0.367879 + 0.106531) / 2, gradient w * k1 / 2 = 0.824361, 2.5
    logp = torch.tensor([[-1.0, -0.1]], requires_grad=True)
    ref, old, mask = torch.tensor([[-2.0, -0.6]]), torch.tensor([[-1.5, -3.0]]), torch.ones(1, 2)
    out = kl_loss(logp, ref, mask, "k3", old_logp=old, unbiased_gradient=True)
    out.loss.backward()
    assert float(out.loss.detach()) == pytest.approx((0.367879 + 0.106531) / 2, abs=1e-6)
    assert logp.grad[0].tolist() == pytest.approx([0.824361, 2.5], abs=1e-6)
    # every estimator: the same gradient; off (the default), k3's own gradient (1 - e^-k1) / 2
    for est in ("k1", "k2"):
        lp = logp.detach().clone().requires_grad_()
        kl_loss(lp, ref, mask, est, old_logp=old, unbiased_gradient=True).loss.backward()
        assert lp.grad[0].tolist() == pytest.approx([0.824361, 2.5], abs=1e-6)
    lp = logp.detach().clone().requires_grad_()
    kl_loss(lp, ref, mask, "k3").loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([(1 - math.exp(-1)) / 2, (1 - math.exp(-0.5)) / 2], abs=1e-6)
