"""Benchmark: asynchronous rollouts against synchronous ones, side by side (issue 17).

    python scripts/bench_async.py --exp EXP --corpus CORPUS [--minutes 6]

From `EXP/sft/final` (recipes/quickstart.sh stages 0-2), GRPO with the demo's settings
(recipes/configs/grpo_demo.yaml) on Ray: one trainer rank (one core) and one HF engine actor (the
other core). `sync`: `async_queue_size=0`, each batch generated after the previous update, through
the same actor (the synchronous step with this placement). `async`: `async_queue_size=1` with TIS
correction, the next batch generated while the trainer updates. Each runs `--minutes` of wall time
with a dev evaluation (100 utterances) every `--eval-steps`. Prints the mean step time and its parts
(steps 2 on: step 1 warms up), the target async <= 1.1 x max(rollout, train) of the synchronous
step, and dev CER against elapsed minutes for both. With the demo's dynamic filtering a step takes
~3 generation rounds and only the first is generated ahead; `--no-filter` measures one round a step.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench_common import run

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--exp", required=True)
    p.add_argument("--corpus", required=True)
    p.add_argument("--minutes", type=float, default=6.0)
    p.add_argument("--eval-steps", type=int, default=10)
    p.add_argument("--no-filter", action="store_true",
                   help="rollout.dynamic_filtering=false: one generation round a step (the demo refills ~3)")
    args = p.parse_args()
    exp, corpus = Path(args.exp), Path(args.corpus)
    runs = exp / ("bench_async_nofilter" if args.no_filter else "bench_async")
    settings = ["rollout.dynamic_filtering=false"] if args.no_filter else []
    modes = {"sync": ["rollout.async_queue_size=0"],
             "async": ["rollout.async_queue_size=1", "algo.rollout_correction=tis"]}
    for mode, extra in modes.items():
        out = runs / mode
        if not (out / "final").is_dir():
            run("train", "grpo", "--config", str(ROOT / "recipes/configs/grpo_demo.yaml"), f"pretrain={exp / 'sft/final'}",
                f"train_manifest={corpus / 'train.jsonl'}", f"eval_manifest={corpus / 'dev.jsonl'}",
                f"output_dir={out}", f"model.encoder_cache={exp / 'encoder_cache'}", "backend=ray",
                "distributed.actor_num_gpus_per_node=1", "distributed.vllm_num_engines=1", "distributed.ray_num_cpus=2",
                "rollout.async_enable=true", f"max_minutes={args.minutes}", "max_steps=100", "save_steps=0",
                f"eval_steps={args.eval_steps}", "logging.progress_bar=false", *settings, *extra, threads=1)
    rows = {m: [json.loads(x) for x in (runs / m / "metrics.jsonl").read_text().splitlines()]
            for m in modes}
    print("| mode | steps | time/step s | rollout (wait) s | train s | log-probs s | sync s | rounds | version lag |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    means = {}
    for m, rs in rows.items():
        steps = [r for r in rs if "time/step" in r and r["step"] >= 2]
        means[m] = {k: sum(r[k] for r in steps) / len(steps) for k in
                    ("time/step", "time/rollout", "time/train", "time/logprobs", "time/sync", "rollout/rounds",
                     "rollout/version_lag")}
        mm = means[m]
        print(f"| {m} | {len(steps) + 1} | {mm['time/step']:.2f} | {mm['time/rollout']:.2f} | {mm['time/train']:.2f} | "
              f"{mm['time/logprobs']:.2f} | {mm['time/sync']:.2f} | {mm['rollout/rounds']:.1f} | "
              f"{mm['rollout/version_lag']:.2f} |")
    s = means["sync"]
    bound = max(s["time/rollout"], s["time/train"] + s["time/logprobs"])
    print(f"async step {means['async']['time/step']:.2f} s vs 1.1 x max(rollout {s['time/rollout']:.2f}, "
          f"train + log-probs {s['time/train'] + s['time/logprobs']:.2f}) = {1.1 * bound:.2f} s: "
          f"{'met' if means['async']['time/step'] <= 1.1 * bound else 'missed'}")
    print("\ndev CER (100 utterances) against elapsed minutes")
    for m, rs in rows.items():
        curve = [(r.get("time/elapsed_min", 0.0), r["eval/cer"]) for r in rs if "eval/cer" in r]
        print(f"{m}: " + ", ".join(f"{t:.1f} min {100 * c:.2f}%" for t, c in curve))


if __name__ == "__main__":
    main()
