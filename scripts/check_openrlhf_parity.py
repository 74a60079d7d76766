"""Our math against OpenRLHF's own functions, run side by side on the same random inputs.

Usage:
    pip download openrlhf==0.11.2 --no-deps -d /tmp/orl && unzip -q /tmp/orl/openrlhf-0.11.2*.whl -d /tmp/orl/src
    python scripts/check_openrlhf_parity.py --openrlhf /tmp/orl/src/openrlhf-0.11.2.data/purelib [--seed 0]

PATH is the folder holding `openrlhf/` (a checkout, or the wheel's purelib); its version is read
from `version.txt` or the wheel's `*.dist-info/METADATA`. Its functions are read from their files
(`openrlhf/models/loss.py`, `models/utils.py`, `utils/loss_utils.py`, `trainer/ppo_utils/
experience_maker.py`, `length_penalty.py`) and run as they are, without importing the package (which
needs flash-attn and a GPU stack). Each case maps
OpenRLHF's settings to ours (docs/from-openrlhf.md) and prints the largest absolute
difference of the values (and of the gradient w.r.t. the log-probs, for losses). Exit 1 when any
case differs by more than the tolerance. Padding holds arbitrary finite values; OpenRLHF's inputs
are masked the way its trainer masks them.
"""
from __future__ import annotations

import argparse
import ast
import sys
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asr_rl.algos.advantages import AdvantageInputs, compute_advantages  # noqa: E402
from asr_rl.algos.kl import kl_estimate, reward_kl_penalty  # noqa: E402
from asr_rl.algos.losses import compute_policy_loss, entropy_loss, kl_loss, value_loss  # noqa: E402
from asr_rl.algos.reward_shaping import overlong_penalty, stop_properly  # noqa: E402
from asr_rl.algos.rollout_correction import rollout_correction  # noqa: E402
from asr_rl.trainer.update.ppo import micro_weights  # noqa: E402

TOL = 2e-6
# OpenRLHF 0.11.2 `is_correction_level/mode/gating` -> our `algo.rollout_correction` (docs/from-openrlhf.md)
IS_MODES = {("token", "clip", "ratio"): "tis", ("token", "mask", "ratio"): "icepop",
            ("seq", "mask", "ratio"): "seq_mask_tis", ("token", "mask", "binary_kl"): "token_binary_kl",
            ("seq", "mask", "binary_kl"): "seq_binary_kl", ("token", "mask", "tv"): "token_tv",
            ("seq", "mask", "tv"): "seq_tv"}


def load_defs(path: Path, names: set[str], namespace: dict) -> dict:
    """Execute the top-level functions/classes `names` of a Python file in `namespace`."""
    tree = ast.parse(path.read_text())

    def name(n):
        if isinstance(n, (ast.FunctionDef, ast.ClassDef)):
            return n.name
        return n.targets[0].id if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name) else None

    keep = [n for n in tree.body if name(n) in names]
    missing = names - {name(n) for n in keep}
    if missing:
        raise SystemExit(f"{path}: no {sorted(missing)} (is this OpenRLHF 0.11.2?)")
    exec(compile(ast.Module(keep, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


def openrlhf(root: Path) -> types.SimpleNamespace:
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from typing import List, Optional, Tuple, Union

    quiet = types.SimpleNamespace(warning=lambda *a: None, info=lambda *a: None)
    ns = dict(torch=torch, nn=nn, F=F, dist=dist, Optional=Optional, Tuple=Tuple, Union=Union, List=List, logger=quiet)
    load_defs(root / "openrlhf/models/utils.py",
              {"KL_IS_WEIGHT_CLIP", "masked_mean", "compute_approx_kl", "compute_reward"}, ns)
    load_defs(root / "openrlhf/models/loss.py", {"aggregate_loss", "PolicyLoss", "ValueLoss"}, ns)
    load_defs(root / "openrlhf/utils/loss_utils.py", {"_optimizer_step_loss_norm"}, ns)
    load_defs(root / "openrlhf/trainer/ppo_utils/length_penalty.py",
              {"apply_overlong_penalty", "apply_stop_properly_penalty", "apply_length_penalties"}, ns)
    maker = load_defs(root / "openrlhf/trainer/ppo_utils/experience_maker.py", {"RemoteExperienceMaker"},
                      dict(ns, itertools=__import__("itertools")))
    ns["RemoteExperienceMaker"] = maker["RemoteExperienceMaker"]
    return types.SimpleNamespace(**ns)


def version_of(root: Path) -> str:
    """`version.txt` of a checkout, or the `Version:` of the wheel's dist-info beside its purelib."""
    if (root / "version.txt").exists():
        return (root / "version.txt").read_text().strip()
    for meta in [*root.glob("*.dist-info/METADATA"), *root.parent.parent.glob("openrlhf-*.dist-info/METADATA")]:
        for line in meta.read_text().splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def inputs(seed: int, n_seq: int = 8, T: int = 7):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (n_seq,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    logp = -torch.rand(n_seq, T, generator=g) * 3
    old = logp + torch.randn(n_seq, T, generator=g) * 0.3
    ref = logp + torch.randn(n_seq, T, generator=g) * 2.0  # some far-off tokens: the clamps act
    rollout = old + torch.randn(n_seq, T, generator=g) * 0.6
    adv = torch.randn(n_seq, T, generator=g) * mask
    values = torch.randn(n_seq, T, generator=g)
    rewards = torch.randn(n_seq, generator=g) * 8  # some outside [-10, 10] after shaping
    entropy = torch.rand(n_seq, T, generator=g) * 2
    ended = torch.rand(n_seq, generator=g) < 0.5  # of the responses at the length limit: ended with EOS
    # float64, so that the comparison is of the math rather than of float32 rounding (|rewards| ~ 10
    # rounds at 1e-6); the KL estimators of both compute in float32 as they do in training
    out = dict(mask=mask, logp=logp, old=old, ref=ref, rollout=rollout, adv=adv, values=values, rewards=rewards,
               entropy=entropy)
    return {**{k: v.double() for k, v in out.items()}, "truncated": (lengths == T) & ~ended}


def diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    if mask is not None:
        a, b = a * mask, b * mask
    return float((a.detach().double() - b.detach().double()).abs().max())


def loss_case(o, x, name, *, ours: dict, theirs: dict, agg: str, correction: str | None = None,
              threshold: tuple[float, float] = (0.5, 5.0)):
    """(value diff, grad diff) of one policy-loss setting on one micro-batch."""
    mask = x["mask"]
    lp_a = x["logp"].clone().requires_grad_()
    lp_b = x["logp"].clone().requires_grad_()
    weights = rollout_logp = None
    if correction:
        corr = rollout_correction(correction, x["old"], x["rollout"], mask, threshold)
        weights, rollout_logp = corr.weights, x["rollout"]
    a = compute_policy_loss(name, lp_a, x["old"], x["adv"], mask, loss_agg_mode=agg, rollout_weights=weights,
                            rollout_logp=rollout_logp, **ours).loss
    b = o.PolicyLoss(token_level_loss=agg == "token-mean", **theirs)(lp_b, x["old"], x["adv"], mask,
                                                                     rollout_log_probs=x["rollout"])[0]
    a.backward(), b.backward()
    return diff(a, b), diff(lp_a.grad, lp_b.grad, mask)


def policy_cases(o, x):
    rows = []
    for agg in ("token-mean", "seq-mean-token-mean"):
        for label, ours, theirs in (
            ("ppo", {}, {}),
            ("ppo clip 0.2/0.28", dict(eps_clip_low=0.2, eps_clip_high=0.28), dict(clip_eps_low=0.2, clip_eps_high=0.28)),
            ("ppo dual_clip 3", dict(dual_clip=3.0), dict(dual_clip=3.0)),
        ):
            rows.append((f"PolicyLoss {label}, {agg}", *loss_case(o, x, "ppo", ours=ours, theirs=theirs, agg=agg)))
    for (level, mode, gating), ours_name in IS_MODES.items():
        threshold = (0.5, 5.0) if gating == "ratio" else (0.0, 0.05 if gating == "binary_kl" else 0.2)
        theirs = dict(is_correction_level=level, is_correction_mode=mode, is_correction_gating=gating,
                      is_correction_threshold=list(threshold))
        rows.append((f"PolicyLoss ppo + IS {level}/{mode}/{gating}", *loss_case(
            o, x, "ppo", ours={}, theirs=theirs, agg="token-mean", correction=ours_name, threshold=threshold)))
    gspo = dict(policy_loss_type="gspo", clip_eps_low=3e-4, clip_eps_high=4e-4)
    ours = dict(eps_clip_low=3e-4, eps_clip_high=4e-4)
    rows.append(("PolicyLoss gspo", *loss_case(o, x, "gspo", ours=ours, theirs=gspo, agg="seq-mean-token-mean")))
    rows.append(("PolicyLoss gspo + IS token/clip/ratio", *loss_case(
        o, x, "gspo", ours=ours, agg="seq-mean-token-mean", correction="tis",
        theirs=dict(gspo, is_correction_level="token", is_correction_mode="clip", is_correction_threshold=[0.5, 5.0]))))
    return rows


class _Ranks:
    """The all-reduce of 2 data-parallel ranks, seen from one: the mean of its value and the other's."""

    def __init__(self, other: float):
        self.other = other

    def mean_over_ranks(self, v: float) -> float:
        return (v + self.other) / 2


# rank 0 and rank 1 of one optimiser step, each with 2 micro-batches of uneven sizes; row 2 empty
RANKS = [[[0, 1, 2], [3]], [[4], [5, 6, 7]]]


def step_case(o, x, name: str, agg: str, kl: str | None = None, unbiased: bool = False, entropy_coef: float = 0.0,
              kl_coef: float = 0.05):
    """(value diff, grad diff) of a whole optimiser step on 2 ranks x 2 uneven micro-batches: policy
    loss by `agg`, KL in the loss and entropy (token means, OpenRLHF's). Theirs: each micro-batch with
    `_optimizer_step_loss_norm`'s step normalisers, scaled as DeepSpeed does (1/gas, then the mean of
    the 2 ranks); ours: each micro-batch's parts times `micro_weights`, then the mean of the ranks."""
    from asr_rl.algos.aggregation import agg_count

    mask = x["mask"].clone()
    mask[2] = 0
    lp_a, lp_b = x["logp"].clone().requires_grad_(), x["logp"].clone().requires_grad_()
    theirs = dict(policy_loss_type=name, token_level_loss=agg == "token-mean")
    ours = {}
    if name == "gspo":
        theirs.update(clip_eps_low=3e-4, clip_eps_high=4e-4)
        ours.update(eps_clip_low=3e-4, eps_clip_high=4e-4)
    policy = o.PolicyLoss(**theirs)
    info = o._optimizer_step_loss_norm([mask[idx] for micros in RANKS for idx in micros], None, 2, 2)
    total_a = total_b = 0.0
    for r, micros in enumerate(RANKS):
        other = RANKS[1 - r]
        w = {m: micro_weights([mask[idx] for idx in micros], m, _Ranks(sum(agg_count(m, mask[i]) for i in other)))
             for m in (agg, "token-mean")}
        for k, idx in enumerate(micros):
            lp, old, ref, ent, m = lp_b[idx], x["old"][idx], x["ref"][idx], x["entropy"][idx], mask[idx]
            b = policy(lp, old, x["adv"][idx], m, **info)[0]
            a = compute_policy_loss(name, lp_a[idx], old, x["adv"][idx], m, loss_agg_mode=agg, **ours).loss * w[agg][k]
            terms = 0.0
            if kl:
                est = o.compute_approx_kl(lp, ref, log_probs_old=old, kl_estimator=kl, unbiased_gradient=unbiased)
                b = b + kl_coef * o.aggregate_loss(est, m, **info)
                terms = terms + kl_coef * kl_loss(lp_a[idx], ref, m, kl, "token-mean", 10.0, old_logp=old,
                                                  unbiased_gradient=unbiased).loss
            if entropy_coef:
                b = b - entropy_coef * o.aggregate_loss(ent, m, **info)
                terms = terms - entropy_coef * entropy_loss(ent, m, "token-mean")
            total_b = total_b + b / len(micros) / 2
            total_a = total_a + (a + terms * w["token-mean"][k]) / 2
    total_a.backward(), total_b.backward()
    return diff(total_a, total_b), diff(lp_a.grad, lp_b.grad, mask)


def step_cases(o, x):
    rows = []
    for agg in ("token-mean", "seq-mean-token-mean"):
        rows.append((f"step ppo, {agg}", *step_case(o, x, "ppo", agg)))
        rows.append((f"step ppo + KL k3 + entropy, {agg}", *step_case(o, x, "ppo", agg, kl="k3", entropy_coef=0.01)))
        for est in ("k1", "k2", "k3"):
            rows.append((f"step ppo + KL {est} unbiased_gradient, {agg}",
                         *step_case(o, x, "ppo", agg, kl=est, unbiased=True)))
    rows.append(("step gspo + KL k3 + entropy, seq-mean-token-mean",
                 *step_case(o, x, "gspo", "seq-mean-token-mean", kl="k3", entropy_coef=0.01)))
    return rows


def value_and_kl_cases(o, x):
    mask = x["mask"]
    rows = []
    for clip in (0.5, None):
        va = x["values"].clone().requires_grad_()
        vb = x["values"].clone().requires_grad_()
        ret = x["values"] + x["adv"]
        old_v = x["values"] + 0.3 * x["adv"].flip(0)
        a = value_loss(va, old_v, ret, mask, value_clip=clip).loss
        b = o.ValueLoss(clip_eps=clip)(vb, old_v, ret, mask)
        a.backward(), b.backward()
        rows.append((f"ValueLoss clip {clip}", diff(a, b), diff(va.grad, vb.grad, mask)))
    for est in ("k1", "k2", "k3"):  # 0.11.2's third positional argument is log_probs_old: by keyword
        ours = kl_estimate(x["logp"], x["ref"], est, clamp=10.0)
        theirs = o.compute_approx_kl(x["logp"], x["ref"], kl_estimator=est)
        rows.append((f"compute_approx_kl {est}", diff(ours, theirs, mask), None))
    return rows


def advantage_case(o, x, est: str, no_std_norm: bool = False, penalties: dict | None = None, n: int = 4):
    """(advantages diff, returns diff) of RemoteExperienceMaker.compute_advantages_and_returns with
    OpenRLHF's settings (KL in the reward, k3, coefficient 0.05; reward clip [-10, 10]; `penalties`
    its `reward.overlong_*` / `stop_properly_penalty_coef`, max_new_tokens T) against ours with
    group_std_eps=1e-9, the same KL penalty and clip, and the length penalties before the estimator."""
    mask, N, T = x["mask"], x["mask"].shape[0], x["mask"].shape[1]
    penalties = penalties or {}
    kl = o.compute_approx_kl(x["old"], x["ref"], kl_estimator="k3") * mask
    args = types.SimpleNamespace(
        rollout=types.SimpleNamespace(n_samples_per_prompt=n, max_new_tokens=T),
        reward=types.SimpleNamespace(clip_range=[-10, 10], **penalties),
        algo=types.SimpleNamespace(advantage=types.SimpleNamespace(estimator=est, gamma=1.0, lambd=0.95,
                                                                   no_std_norm=no_std_norm)))
    maker = types.SimpleNamespace(strategy=types.SimpleNamespace(args=args), advantage_estimator=est,
                                  kl_ctl=types.SimpleNamespace(value=0.05))
    for m in ("get_advantages_and_returns", "get_cumulative_returns"):
        setattr(maker, m, getattr(o.RemoteExperienceMaker, m).__get__(maker))
    exp = types.SimpleNamespace(index=list(range(N)), rewards=x["rewards"].clone(), action_mask=mask, kl=kl,
                                values=x["values"] * mask, info={}, response_length=mask.sum(-1),
                                truncated=x["truncated"])
    o.RemoteExperienceMaker.compute_advantages_and_returns(maker, [exp])
    rewards = x["rewards"].clone()
    if "overlong_buffer_len" in penalties:
        rewards = rewards + overlong_penalty(mask.sum(-1), T, penalties["overlong_buffer_len"],
                                             penalties["overlong_penalty_factor"])
    if "stop_properly_penalty_coef" in penalties:
        rewards = stop_properly(rewards, x["truncated"], penalties["stop_properly_penalty_coef"])
    penalty, _ = reward_kl_penalty(x["old"], x["ref"], mask, "k3", 10.0, coef=0.05)
    ours = compute_advantages(est, AdvantageInputs(
        rewards, mask, n, values=x["values"], kl_penalty=penalty, gamma=1.0, lambd=0.95, eps=1e-9,
        std_norm=not no_std_norm, whiten_gae=True, reward_clip=(-10.0, 10.0)))
    return diff(ours.advantages, exp.advantages, mask), diff(ours.returns, exp.returns, mask)


def advantage_cases(o, x):
    rows = []
    for est in ("group_norm", "dr_grpo", "rloo", "reinforce_baseline", "reinforce", "gae", "flash_reinforce"):
        for no_std_norm in ((False, True) if est in ("reinforce", "reinforce_baseline", "gae") else (False,)):
            label = f"advantages {est}" + (" no_std_norm" if no_std_norm else "")
            adv, ret = advantage_case(o, x, est, no_std_norm)
            rows += [(label, adv, None), (label.replace("advantages", "returns"), ret, None)]
    for label, pen in (("overlong 3 x 0.5", dict(overlong_buffer_len=3.0, overlong_penalty_factor=0.5)),
                       ("stop_properly 0.5", dict(stop_properly_penalty_coef=0.5)),
                       ("stop_properly -0.5 + overlong 2 x 1", dict(stop_properly_penalty_coef=-0.5,
                                                                   overlong_buffer_len=2.0, overlong_penalty_factor=1.0))):
        adv, ret = advantage_case(o, x, "group_norm", penalties=pen)
        rows += [(f"advantages group_norm + {label}", adv, None), (f"returns group_norm + {label}", ret, None)]
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--openrlhf", type=Path, required=True, help="the folder holding openrlhf/ (0.11.2)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    version = version_of(args.openrlhf)
    o, x = openrlhf(args.openrlhf), inputs(args.seed)
    rows = policy_cases(o, x) + step_cases(o, x) + value_and_kl_cases(o, x) + advantage_cases(o, x)
    print(f"OpenRLHF {version} vs asr-rl, seed {args.seed}, tolerance {TOL:g}\n")
    print(f"| {'case':<44} | max abs diff (value) | max abs diff (grad) | |")
    print(f"|{'-' * 46}|---------------------:|--------------------:|---|")
    bad = 0
    for name, v, g in rows:
        ok = v <= TOL and (g is None or g <= TOL)
        bad += not ok
        print(f"| {name:<44} | {v:20.2e} | {'' if g is None else f'{g:.2e}':>19} | {'ok' if ok else 'DIFFERS'} |")
    worst_v = max(v for _, v, _ in rows)
    worst_g = max((g for _, _, g in rows if g is not None), default=0.0)
    print(f"\nOpenRLHF {version}: {len(rows) - bad} of {len(rows)} cases agree within {TOL:g} "
          f"(max diff {worst_v:.2e} in value, {worst_g:.2e} in gradient)")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
