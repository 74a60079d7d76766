"""The memory estimate printed before the first RL step against the measured peak RSS, at the real
Qwen3-ASR dimensions (random weights: `asr-rl model init --arch qwen3_asr --size 0.6b`).

Usage:
    python scripts/bench_memory.py --corpus data/demo_corpus_3000 [--size 0.6b] [--dtype bfloat16 float32]
                                   [--workdir /tmp/bench_memory]

For each dtype: one GRPO step (local backend, KL reference in the loss, 2 utterances x 4 samples,
16 new tokens, micro batch 8) in its own process; the estimate is read from that run's log, the
peak from the kernel (`ru_maxrss` of the child). Prints a table with the ratio. Nothing else should
run on the machine meanwhile.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path


_PEAK_OF_CHILD = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
                  "print('PEAK_KIB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
                  "sys.exit(r.returncode)")


def run(cmd: list[str]) -> tuple[str, float, float]:
    """(log, peak RSS GiB of the command, seconds). A fresh intermediate process waits for the
    command alone, so earlier children (model init, conversion) do not mask its peak."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _PEAK_OF_CHILD, *cmd], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    peak = int(re.search(r"PEAK_KIB (\d+)", out.stderr).group(1))
    return out.stderr + out.stdout, peak / 2**20, seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True, help="a folder with train.jsonl (asr-rl data synth)")
    ap.add_argument("--size", default="0.6b")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bench_memory"))
    ap.add_argument("overrides", nargs="*", help="more key=value settings of the run, e.g. model.lora_rank=16")
    args = ap.parse_args()
    cli = str(Path(sys.executable).parent / "asr-rl")
    model = args.workdir / f"qwen3_asr_{args.size}"
    if not (model / "config.json").is_file():
        subprocess.run([cli, "model", "init", "--arch", "qwen3_asr", "--size", args.size, "--tokenizer-from",
                        str(args.corpus / "train.jsonl"), "--out", str(model)], check=True)
    if args.dtype == "bfloat16" and not (model.parent / f"{model.name}_bf16" / "config.json").is_file():
        # released checkpoints are bf16 on disk; `model init` writes fp32, whose file pages would count
        # in the peak RSS of a bf16 load
        subprocess.run([sys.executable, "-c", (
            "import sys, torch; from asr_rl.models.audio_policy import AudioPolicy; "
            "AudioPolicy.from_pretrained(sys.argv[1], dtype=torch.bfloat16).save_pretrained(sys.argv[2])"),
            str(model), str(model.parent / f"{model.name}_bf16")], check=True)
    if args.dtype == "bfloat16":
        model = model.parent / f"{model.name}_bf16"
    out = args.workdir / f"grpo_{args.size}_{args.dtype}_{int(time.time())}"
    log, peak, seconds = run([cli, "train", "grpo", f"pretrain={model}", f"train_manifest={args.corpus / 'train.jsonl'}",
                              f"output_dir={out}", "max_steps=1", "save_steps=0", "eval_steps=0",
                              "rollout_batch_size=2", "n_samples_per_prompt=4", "max_new_tokens=16",
                              "micro_train_batch_size=8", f"model.dtype={args.dtype}", "logging.tensorboard=false",
                              "logging.progress_bar=false", "rollout.dynamic_filtering=false", "init_kl_coef=0.02",
                              *args.overrides])
    table = log[log.index("memory estimate"):].split("\n")
    parts = {m.group(1).strip(): float(m.group(2)) / 1024 for line in table[1:12]
             if (m := re.match(r"\s+(.+?)\s+([\d.]+) MiB", line))}
    estimate = parts.pop("total")
    print(f"Qwen3-ASR {args.size} real dimensions, {args.dtype}, one GRPO step (2 x 4 samples x 16 tokens, "
          f"KL reference) {' '.join(args.overrides)}, {seconds:.0f} s including load\n")
    print("| " + " | ".join(parts) + " | estimate GiB | measured peak RSS GiB | estimate / measured |")
    print("|" + "---:|" * (len(parts) + 3))
    print("| " + " | ".join(f"{v:.2f}" for v in parts.values()) + f" | {estimate:.2f} | {peak:.2f} | "
          f"{estimate / peak:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
