"""The spread of one arm over runs: every seed from every start, each run against its own start.

    python scripts/bench_adapt.py --start A/best --work exp/adapt_A --seeds 42,2,7 --arms rl_verifier --pool-set ...
    python scripts/bench_adapt.py --start B/best --work exp/adapt_B --seeds 42,2 --arms rl_verifier --pool-set ...
    python scripts/bench_spread.py --work exp/adapt_A,exp/adapt_B --arm rl_verifier

Reads what bench_adapt.py evaluated (`<work>/eval/start` and `<work>/eval/<arm>_s<seed>`) and prints,
per set, each run's relative CER change with its own paired-bootstrap interval and P(better), and all
runs pooled into one paired bootstrap (the utterance is the block, so an utterance heard by several
runs is not counted as independent: the interval holds the spread between runs too). `--against`
compares the arm with another arm of the same work folder and seed (e.g. `rerank`, once per start)
instead of the start. bench_adapt.py's other analysis tables live here too: CER per voice, each
run's dynamics, the learning curves and the checkpoint each criterion chooses.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench_common import interval

SETS = ("pool", "pool_speech", "target_dev", "target_test", "target_test_en", "target_test_zh", "source_test_clean")


def split_sets(evals: Path) -> None:
    """Sets of their own beside each model's hypotheses in `evals`, which `pooled_compare` then
    compares like any other: `pool_speech`, the pool's speech lines alone (a tenth of the pool is
    nobody speaking, whose words count as insertions in the pool's CER: the silence term's share of
    the gain), and `target_test_<language>`, each language of the target test set."""
    splits = [("pool", "pool_speech", lambda r: bool(r["reference"]))]
    splits += [("target_test", f"target_test_{lang}", lambda r, lang=lang: r["language"] == lang) for lang in ("en", "zh")]
    for folder in evals.iterdir():
        for source, name, keep in splits:
            src, out = folder / f"{source}.hyps.jsonl", folder / f"{name}.hyps.jsonl"
            if src.is_file():  # written again each time: the source may have been decoded again
                lines = [line for line in src.read_text().splitlines() if keep(json.loads(line))]
                out.write_text("".join(line + "\n" for line in lines))


def runs_of(works: list[Path], arm: str, against: str) -> list[tuple[str, Path, Path]]:
    """(label, A folder, B folder) for every evaluated seed of `arm` in each work folder; `against`
    'start', or an arm evaluated once per start (its first seed's folder)."""
    out = []
    for work in works:
        evals = work / "eval"
        if against == "start":
            base = evals / "start"
        else:
            found = sorted(f for f in evals.glob(f"{against}_s*/report.json")
                           if f.parent.name.removeprefix(f"{against}_s").isdigit())
            if not found:
                continue
            base = found[0].parent
        for run in sorted(evals.glob(f"{arm}_s*/report.json")):
            if not run.parent.name.removeprefix(f"{arm}_s").isdigit():  # a checkpoint's (`<run>@<step>`)
                continue
            out.append((f"{work.name}/{run.parent.name}", base, run.parent))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", required=True, help="bench_adapt.py work folders, comma-separated (one per start)")
    p.add_argument("--arm", default="rl_verifier")
    p.add_argument("--against", default="start", help="start, or an arm evaluated from the same start (rerank)")
    args = p.parse_args()
    from asr_rl.evaluation.compare import pooled_compare

    works = [Path(w) for w in args.work.split(",")]
    for work in works:
        split_sets(work / "eval")
    runs = runs_of(works, args.arm, args.against)
    if not runs:
        raise SystemExit(f"no evaluated runs of {args.arm} (and {args.against}) in {args.work}")
    each = [pooled_compare([(a, b)]) for _, a, b in runs]
    pooled = pooled_compare([(a, b) for _, a, b in runs])
    print(f"\n{args.arm} against {args.against}: {len(runs)} runs ({', '.join(r[0] for r in runs)})")
    print("| set | " + " | ".join(r[0] for r in runs) + " | all runs pooled |")
    print("|---|" + "---|" * (len(runs) + 1))
    for s in SETS:
        if s not in pooled:
            continue
        cells = [interval(e.get(s)) for e in each]
        print(f"| {s} | " + " | ".join(cells) + f" | {interval(pooled[s])} |")


def voice_errors(eval_folder: Path, name: str = "target_test") -> dict[str, list[int]]:
    """Character errors and reference characters per voice (the speaker's espeak variant) on a set."""
    from asr_rl.rewards.normalize import char_errors

    out: dict[str, list[int]] = {}
    for line in (eval_folder / f"{name}.hyps.jsonl").read_text().splitlines():
        r = json.loads(line)
        voice = f"{(r.get('speaker') or '?').split('+')[-1].split(':')[0]} ({r['language']})"
        s, d, i, n = char_errors(r["reference"], r["hypothesis"])
        acc = out.setdefault(voice, [0, 0])
        acc[0], acc[1] = acc[0] + s + d + i, acc[1] + n
    return out


def print_voices(evals: Path, arms: list[str], seeds: list[int], name: str = "target_test") -> None:
    """CER per voice of `name` (each voice is heard only there: pool, dev and test voices differ), the
    start beside each arm (its seeds' errors pooled)."""
    cols = {}
    for arm in arms:
        folders = [evals / "start"] if arm == "start" else [evals / f"{arm}_s{s}" for s in seeds]
        folders = [f for f in folders if (f / f"{name}.hyps.jsonl").is_file()]
        if folders:
            total: dict[str, list[int]] = {}
            for f in folders:
                for v, (e, n) in voice_errors(f, name).items():
                    acc = total.setdefault(v, [0, 0])
                    acc[0], acc[1] = acc[0] + e, acc[1] + n
            cols[arm] = {v: e / n for v, (e, n) in total.items() if n}
    if len(cols) < 2:
        return
    print(f"\n| voice ({name}) | " + " | ".join(f"{a} CER %" for a in cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for v in sorted(cols["start"]):
        print(f"| {v} | " + " | ".join(pct(c.get(v)) for c in cols.values()) + " |")


def print_dynamics(work: Path, runs: list[str]) -> None:
    """What each RL run saw (its metrics.jsonl): the share of groups whose rewards tied (dropped by
    dynamic filtering and sampled again, AQA-TTRL's resampling), over the first and the last tenth of
    the updates; the mean reward there; the policy's entropy; the wall minutes of its updates."""
    rows = []
    for name in runs:
        path = work / name / "metrics.jsonl"
        if not path.is_file():
            continue
        steps = [r for r in map(json.loads, path.read_text().splitlines()) if "rollout/groups_seen" in r]
        if not steps:
            continue
        k = max(1, len(steps) // 10)

        def tied(part):
            seen = sum(r["rollout/groups_seen"] for r in part)
            return sum(r.get("rollout/groups_filtered", 0) for r in part) / max(seen, 1)

        def mean(part, key):
            vals = [r[key] for r in part if r.get(key) is not None]
            return sum(vals) / len(vals) if vals else float("nan")

        rows.append(f"| {name} | {len(steps)} | {100 * tied(steps[:k]):.0f} -> {100 * tied(steps[-k:]):.0f} | "
                    f"{mean(steps[:k], 'reward/mean'):.3f} -> {mean(steps[-k:], 'reward/mean'):.3f} | "
                    f"{mean(steps[:k], 'policy/entropy'):.3f} -> {mean(steps[-k:], 'policy/entropy'):.3f} | "
                    f"{sum(r.get('time/step', 0) for r in steps) / 60:.1f} |")
    if rows:
        print("\n| run | updates | tied groups %, first -> last tenth | reward mean | entropy | minutes |")
        print("|---|---:|---|---|---|---:|")
        print("\n".join(rows))


def curve_point(rep: dict) -> dict:
    m = rep["test_sets"]
    return {"dev_cer": m["target_dev"]["cer"], "test_cer": m["target_test"]["cer"],
            "dev_reward": m["target_dev"].get("verifier_mean_reward"),
            "test_reward": m["target_test"].get("verifier_mean_reward")}


def print_curves(curves: dict[str, list[dict]], start: dict) -> None:
    """The learning curves, and the checkpoint each criterion chooses (its target test CER): dev CER
    (labelled), the verifier's mean reward on the dev audio (held out, label-free) and on the test audio."""
    print("\n| run | update | target dev CER % | target test CER % | verifier reward dev | verifier reward test |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, points in curves.items():
        for pt in [{"step": 0, **curve_point(start)}, *points]:
            print(f"| {name} | {pt['step']} | {pct(pt['dev_cer'])} | {pct(pt['test_cer'])} | "
                  f"{pt['dev_reward'] or 0:.3f} | {pt['test_reward'] or 0:.3f} |")
    print("\n| run | chosen by dev CER: update, test CER % | by verifier reward on dev audio | on test audio |")
    print("|---|---|---|---|")
    for name, points in curves.items():
        pts = [{"step": 0, **curve_point(start)}, *points]
        picks = [min(pts, key=lambda q: q["dev_cer"]), max(pts, key=lambda q: q["dev_reward"] or 0),
                 max(pts, key=lambda q: q["test_reward"] or 0)]
        print(f"| {name} | " + " | ".join(f"{q['step']}, {pct(q['test_cer'])}" for q in picks) + " |")


def pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


if __name__ == "__main__":
    main()
