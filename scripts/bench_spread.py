"""The spread of one arm over runs: every seed from every start, each run against its own start.

    python scripts/bench_adapt.py --start A/best --work exp/adapt_A --seeds 42,2,7 --arms rl_verifier --pool-set ...
    python scripts/bench_adapt.py --start B/best --work exp/adapt_B --seeds 42,2 --arms rl_verifier --pool-set ...
    python scripts/bench_spread.py --work exp/adapt_A,exp/adapt_B --arm rl_verifier

Reads what bench_adapt.py evaluated (`<work>/eval/start` and `<work>/eval/<arm>_s<seed>`) and prints,
per set, each run's relative CER change with its own paired-bootstrap interval and P(better), and all
runs pooled into one paired bootstrap (the utterance is the block, so an utterance heard by several
runs is not counted as independent: the interval holds the spread between runs too). `--against`
compares the arm with another arm of the same work folder and seed (e.g. `rerank`, once per start)
instead of the start.
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


if __name__ == "__main__":
    main()
