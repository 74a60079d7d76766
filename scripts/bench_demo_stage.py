"""Benchmark: the demo's RL stage, steps per minute, refill rounds and time per phase, for the code
of an earlier commit (a git worktree of it) and the current tree, one after the other on this host.

    make demo   # or stages 0-2 of it: exp/demo_full_qwen2_audio/sft/best and the target pool
    python scripts/bench_demo_stage.py --start exp/demo_full_qwen2_audio/sft/best \\
        --pool data/demo_corpus_3000_target/pool.jsonl --dev data/demo_corpus_3000_target/dev.jsonl \\
        --baseline 08c0ed3 --steps 60 [--arms before,after,after_local]

Each arm runs the quickstart's stage 4 as it is (recipes/configs/grpo_demo.yaml, label-free on the
unlabelled target pool, the voice-command verifier served by `asr-rl reward serve` on 127.0.0.1, Ray
with 2 ZeRO-2 ranks, 1 thread each) for `--steps` updates from the same start, with no dev
evaluation or checkpoint inside the timed steps; `after_local` is the same step on the local backend
(one process, 2 threads): what the distributed path costs at this shape. Reported per arm: median
step time and steps per minute (steps after the first two, which warm the caches), refill rounds a
step, the median of each `time/*` phase; then each arm's final model on the target dev set, the
current code's against the earlier one's (`asr-rl eval --compare`: paired bootstrap).
Run it on a quiet machine: the numbers are wall times.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
VERIFIER = ROOT / "recipes/rewards/voice_commands.py"
PHASES = ("rollout", "reward", "logprobs", "advantages", "train", "sync")


def worktree(commit: str, where: Path) -> Path:
    """A checkout of `commit` at `where` (made once)."""
    if not (where / "asr_rl").is_dir():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), commit], check=True)
    return where


def serve(port: int) -> subprocess.Popen:
    server = subprocess.Popen([sys.executable, "-m", "asr_rl.cli", "reward", "serve", "--reward", str(VERIFIER),
                               "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    for _ in range(120):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    server.kill()
    raise RuntimeError("the reward server did not start")


def train(code: Path, out: Path, args, backend: str, port: int) -> float:
    """The demo's RL stage from `code` (a tree of the package) into `out`; returns wall seconds."""
    if (out / "final").is_dir():
        return float((out / "wall_s").read_text())
    ranks = ["distributed.actor_num_gpus_per_node=2", "distributed.zero_stage=2", "num_threads=1"] \
        if backend == "ray" else ["num_threads=2"]
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1" if backend == "ray" else "2"}
    cmd = [sys.executable, "-m", "asr_rl.cli", "train", "grpo", "--config", str(code / "recipes/configs/grpo_demo.yaml"),
           f"pretrain={args.start}", f"train_manifest={args.pool}", f"output_dir={out}", f"backend={backend}",
           f"max_steps={args.steps}", "max_minutes=0", "save_steps=0", "eval_steps=0", "seed=" + str(args.seed),
           f"reward.remote_url=http://127.0.0.1:{port}", "reward.terms=null", "rollout.reference_in_group=false",
           "optim.micro_train_batch_size=32", "optim.lr_warmup_ratio=0", "logging.progress_bar=false",
           *ranks]
    cache = out / "encoder_cache"  # each arm its own copy of the SFT's: it encodes the pool's rows itself, as the demo does
    if not cache.is_dir():
        shutil.copytree(args.cache, cache)
    cmd.append(f"model.encoder_cache={cache}")
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, cwd=code)
    wall = time.perf_counter() - start
    (out / "wall_s").write_text(f"{wall:.1f}")
    return wall


def summarise(run: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/step" in r][2:]  # the first two warm the encoder cache and the allocator
    med = {p: statistics.median(r.get(f"time/{p}", 0.0) for r in rows) for p in PHASES}
    step = statistics.median(r["time/step"] for r in rows)
    return {"step_s": step, "steps_per_min": 60 * len(rows) / sum(r["time/step"] for r in rows),
            "rounds": statistics.mean(r["rollout/rounds"] for r in rows),
            "generated": statistics.mean(r["rollout/groups_seen"] for r in rows), **med}


def evaluate(code: Path, model: Path, dev: Path, out: Path) -> Path:
    if not (out / "report.json").is_file():
        subprocess.run([sys.executable, "-m", "asr_rl.cli", "eval", "--model", str(model), "--test-set",
                        f"target_dev={dev}", "--output", str(out), "--quiet"], check=True,
                       env={**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "2"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--start", type=Path, required=True)
    ap.add_argument("--pool", type=Path, required=True)
    ap.add_argument("--dev", type=Path, help="the target dev set: each arm's final model evaluated on it")
    ap.add_argument("--baseline", default="08c0ed3", help="the earlier commit ('before')")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--arms", default="before,after,after_local")
    ap.add_argument("--cache", type=Path, default=Path("exp/demo_full_qwen2_audio/encoder_cache"))
    ap.add_argument("--work", type=Path, default=Path("exp/bench_demo_stage"))
    ap.add_argument("--port", type=int, default=5171)
    args = ap.parse_args()
    args.start, args.pool, args.cache = args.start.resolve(), args.pool.resolve(), args.cache.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    arms = args.arms.split(",")
    code = {"before": worktree(args.baseline, (args.work / f"code_{args.baseline}").resolve()), "after": ROOT}
    server = serve(args.port)
    results = {}
    try:
        for arm in arms:
            tree = code["before" if arm == "before" else "after"]
            out = (args.work / f"{arm}_s{args.seed}").resolve()
            wall = train(tree, out, args, "local" if arm.endswith("_local") else "ray", args.port)
            results[arm] = {**summarise(out), "wall_s": wall}
    finally:
        server.kill()
    print(f"\n{'arm':<12} {'step s':>7} {'steps/min':>10} {'x':>6} {'rounds':>7} {'groups':>7} "
          + " ".join(f"{p:>9}" for p in PHASES) + f" {'wall s':>7}")
    base = results.get("before", next(iter(results.values())))["steps_per_min"]
    for arm, m in results.items():
        print(f"{arm:<12} {m['step_s']:7.2f} {m['steps_per_min']:10.1f} {m['steps_per_min'] / base:5.2f}x "
              f"{m['rounds']:7.2f} {m['generated']:7.1f} " + " ".join(f"{m[p]:9.3f}" for p in PHASES)
              + f" {m['wall_s']:7.0f}")
    if args.dev is not None and "before" in results and "after" in results:
        reports = {arm: evaluate(code["before" if arm == "before" else "after"], args.work / f"{arm}_s{args.seed}" / "final",
                                 args.dev.resolve(), args.work / f"eval_{arm}_s{args.seed}") for arm in ("before", "after")}
        subprocess.run([sys.executable, "-m", "asr_rl.cli", "eval", "--compare", str(reports["before"]),
                        str(reports["after"]), "--output", str(args.work / f"compare_s{args.seed}")], check=True)


if __name__ == "__main__":
    main()
