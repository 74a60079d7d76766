"""Our math against OpenRLHF's own functions, run side by side on the same random inputs.

Usage:
    python scripts/check_openrlhf_parity.py --openrlhf PATH/TO/OpenRLHF [--seed 0]

PATH is a checkout of OpenRLHF (0.11: `version.txt`). Its functions are read from their files
(`openrlhf/models/loss.py`, `models/utils.py`, `trainer/ppo_utils/experience_maker.py`) and run as
they are, without importing the package (which needs flash-attn and a GPU stack). Each case maps
OpenRLHF's settings to ours (README "Coming from OpenRLHF") and prints the largest absolute
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
from asr_rl.algos.losses import compute_policy_loss, value_loss  # noqa: E402
from asr_rl.algos.rollout_correction import rollout_correction  # noqa: E402

TOL = 1e-5


def load_defs(path: Path, names: set[str], namespace: dict) -> dict:
    """Execute the top-level functions/classes `names` of a Python file in `namespace`."""
    tree = ast.parse(path.read_text())
    keep = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names]
    missing = names - {n.name for n in keep}
    if missing:
        raise SystemExit(f"{path}: no {sorted(missing)} (is this OpenRLHF 0.11?)")
    exec(compile(ast.Module(keep, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


def openrlhf(root: Path) -> types.SimpleNamespace:
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from typing import List, Optional, Tuple, Union

    ns = dict(torch=torch, nn=nn, F=F, dist=dist, Optional=Optional, Tuple=Tuple, Union=Union, List=List)
    load_defs(root / "openrlhf/models/utils.py", {"masked_mean", "compute_approx_kl", "compute_reward"}, ns)
    load_defs(root / "openrlhf/models/loss.py", {"aggregate_loss", "PolicyLoss", "ValueLoss"}, ns)
    maker = load_defs(root / "openrlhf/trainer/ppo_utils/experience_maker.py",
                      {"RemoteExperienceMaker"}, dict(ns, itertools=__import__("itertools"),
                                                      apply_length_penalties=lambda exps, args: None,
                                                      logger=types.SimpleNamespace(warning=lambda *a: None)))
    ns["RemoteExperienceMaker"] = maker["RemoteExperienceMaker"]
    return types.SimpleNamespace(**ns)


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
    return dict(mask=mask, logp=logp, old=old, ref=ref, rollout=rollout, adv=adv, values=values, rewards=rewards)


def diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    if mask is not None:
        a, b = a * mask, b * mask
    return float((a.detach().double() - b.detach().double()).abs().max())


def loss_case(o, x, name, *, ours: dict, theirs: dict, agg: str, correction: str | None = None):
    """(value diff, grad diff) of one policy-loss setting."""
    mask = x["mask"]
    lp_a = x["logp"].clone().requires_grad_()
    lp_b = x["logp"].clone().requires_grad_()
    weights = rollout_logp = None
    if correction:
        corr = rollout_correction(correction, x["old"], x["rollout"], mask, (0.5, 5.0))
        weights, rollout_logp = corr.weights, x["rollout"]
    a = compute_policy_loss(name, lp_a, x["old"], x["adv"], mask, loss_agg_mode=agg, rollout_weights=weights,
                            rollout_logp=rollout_logp, **ours).loss
    b = o.PolicyLoss(**theirs)(lp_b, x["old"], x["adv"], mask, rollout_log_probs=x["rollout"])[0]
    a.backward(), b.backward()
    return diff(a, b), diff(lp_a.grad, lp_b.grad, mask)


def policy_cases(o, x):
    corr = {"tis": "tis", "icepop": "icepop", "seq-mask-tis": "seq_mask_tis"}
    rows = []
    for label, ours, theirs in (
        ("ppo", {}, {}),
        ("ppo clip 0.2/0.28", dict(eps_clip_low=0.2, eps_clip_high=0.28), dict(clip_eps_low=0.2, clip_eps_high=0.28)),
        ("ppo dual_clip 3", dict(dual_clip=3.0), dict(dual_clip=3.0)),
    ):
        rows.append((f"PolicyLoss {label}", *loss_case(o, x, "ppo", ours=ours, theirs=theirs, agg="token-mean")))
    for theirs_name, ours_name in corr.items():
        theirs = dict(enable_vllm_is_correction=True, vllm_is_truncated_threshold=[0.5, 5.0],
                      vllm_is_correction_type=theirs_name)
        rows.append((f"PolicyLoss ppo + {theirs_name}", *loss_case(o, x, "ppo", ours={}, theirs=theirs,
                                                                    agg="token-mean", correction=ours_name)))
    gspo = dict(policy_loss_type="gspo", clip_eps_low=3e-4, clip_eps_high=4e-4)
    rows.append(("PolicyLoss gspo", *loss_case(o, x, "gspo", ours=dict(eps_clip_low=3e-4, eps_clip_high=4e-4),
                                               theirs=gspo, agg="seq-mean-token-mean")))
    rows.append(("PolicyLoss gspo + tis", *loss_case(
        o, x, "gspo", ours=dict(eps_clip_low=3e-4, eps_clip_high=4e-4), agg="seq-mean-token-mean", correction="tis",
        theirs=dict(gspo, enable_vllm_is_correction=True, vllm_is_truncated_threshold=[0.5, 5.0]))))
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
    for est in ("k1", "k2", "k3"):
        ours = kl_estimate(x["logp"], x["ref"], est, clamp=10.0)
        rows.append((f"compute_approx_kl {est}", diff(ours, o.compute_approx_kl(x["logp"], x["ref"], est), mask), None))
    return rows


def advantage_cases(o, x, n: int = 4):
    """RemoteExperienceMaker.compute_advantages_and_returns with OpenRLHF's settings; ours with
    group_std_eps=1e-9, the same KL coefficient (KL in the reward) and reward clip."""
    mask, N = x["mask"], x["mask"].shape[0]
    rows = []
    for est in ("group_norm", "dr_grpo", "rloo", "reinforce_baseline", "reinforce", "gae"):
        for no_std_norm in ((False, True) if est in ("reinforce", "reinforce_baseline", "gae") else (False,)):
            kl = o.compute_approx_kl(x["old"], x["ref"], "k3") * mask
            args = types.SimpleNamespace(
                rollout=types.SimpleNamespace(n_samples_per_prompt=n), reward=types.SimpleNamespace(clip_range=[-10, 10]),
                algo=types.SimpleNamespace(advantage=types.SimpleNamespace(estimator=est, gamma=1.0, lambd=0.95,
                                                                           no_std_norm=no_std_norm)))
            maker = types.SimpleNamespace(strategy=types.SimpleNamespace(args=args), advantage_estimator=est,
                                          kl_ctl=types.SimpleNamespace(value=0.05))
            for m in ("get_advantages_and_returns", "get_cumulative_returns"):
                setattr(maker, m, getattr(o.RemoteExperienceMaker, m).__get__(maker))
            exp = types.SimpleNamespace(index=list(range(N)), rewards=x["rewards"].clone(), action_mask=mask, kl=kl,
                                        values=x["values"] * mask, info={})
            o.RemoteExperienceMaker.compute_advantages_and_returns(maker, [exp])
            penalty, _ = reward_kl_penalty(x["old"], x["ref"], mask, "k3", 10.0, coef=0.05)
            ours = compute_advantages(est, AdvantageInputs(
                x["rewards"], mask, n, values=x["values"], kl_penalty=penalty, gamma=1.0, lambd=0.95, eps=1e-9,
                std_norm=not no_std_norm, whiten_gae=True, reward_clip=(-10.0, 10.0)))
            label = f"advantages {est}" + (" no_std_norm" if no_std_norm else "")
            rows.append((label, diff(ours.advantages, exp.advantages, mask), None))
            rows.append((label.replace("advantages", "returns"), diff(ours.returns, exp.returns, mask), None))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--openrlhf", type=Path, required=True, help="an OpenRLHF checkout (0.11)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    version = (args.openrlhf / "version.txt").read_text().strip() if (args.openrlhf / "version.txt").exists() else "?"
    o, x = openrlhf(args.openrlhf), inputs(args.seed)
    rows = policy_cases(o, x) + value_and_kl_cases(o, x) + advantage_cases(o, x)
    print(f"OpenRLHF {version} vs asr-rl, seed {args.seed}, tolerance {TOL:g}\n")
    print(f"| {'case':<44} | max abs diff (value) | max abs diff (grad) | |")
    print(f"|{'-' * 46}|---------------------:|--------------------:|---|")
    bad = 0
    for name, v, g in rows:
        ok = v <= TOL and (g is None or g <= TOL)
        bad += not ok
        print(f"| {name:<44} | {v:20.2e} | {'' if g is None else f'{g:.2e}':>19} | {'ok' if ok else 'DIFFERS'} |")
    print(f"\n{len(rows) - bad} of {len(rows)} cases agree")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
