"""Helpers shared by the benchmark scripts: run an asr-rl command, evaluate a model folder."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ASR_RL = str(Path(sys.executable).parent / "asr-rl")
# sft_demo.yaml trains to its plateau on dev; a benchmark's SFT for a fixed time runs a plain cosine
FIXED_TIME_SFT = ["early_stopping_patience=0", "early_stopping_decay_steps=0", "early_stopping_plateau_patience=0",
                  "optim.lr_scheduler=cosine_with_min_lr"]


def run(*args: str, threads: int = 2, env: dict | None = None) -> float:
    """Run `asr-rl args...` (with `env` added to the environment), streaming its output; returns
    wall seconds. Fails loudly."""
    env = {**os.environ, **(env or {}), "OMP_NUM_THREADS": str(threads)}
    start = time.perf_counter()
    subprocess.run([ASR_RL, *args], check=True, env=env)
    return time.perf_counter() - start


def interval(c: dict | None) -> str:
    """A paired comparison (`asr-rl eval --compare`'s, or `pooled_compare`'s) as one cell: the relative
    CER change, its 95% interval and P(better)."""
    if not c:
        return "-"
    u = c["utterance"]
    lo, hi = (100 * x for x in u["relative_ci"])
    return f"{100 * u['relative']:+.1f}% [{lo:+.1f}, {hi:+.1f}] P={u['p_improvement']:.2f}"


def ensure_corpus(corpus: Path, n_train: int, n_test: int, seed: int = 1) -> None:
    if not (corpus / "train.jsonl").is_file():
        run("data", "synth", "--out", str(corpus), "--train", str(n_train), "--test", str(n_test), "--seed", str(seed))


def ensure_model(model: Path, arch: str, size: str, corpus: Path) -> Path:
    """`asr-rl model init --arch ARCH --size SIZE` into `model` from the corpus's texts (unless there)."""
    if not (model / "config.json").is_file():
        run("model", "init", "--arch", arch, "--size", size, "--tokenizer-from", str(corpus / "train.jsonl"),
            "--out", str(model), threads=1)
    return model


def evaluate(model: Path, corpus: Path, out: Path, sets=("test_clean", "test_noisy")) -> dict[str, dict]:
    """CER etc. per test set from `asr-rl eval` (report.json)."""
    if not (out / "report.json").is_file():
        args = ["eval", "--model", str(model), "--output", str(out), "--batch-size", "32", "--quiet"]
        for s in sets:
            args += ["--test-set", f"{s}={corpus / (s + '.jsonl')}"]
        run(*args)
    return json.loads((out / "report.json").read_text())["test_sets"]


def metrics_at(run_dir: Path, step: int) -> dict:
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["step"] == step:
            return row
    raise KeyError(f"step {step} not in {run_dir}/metrics.jsonl")


def rel_cer(after: dict, before: dict) -> str:
    """The relative CER change from `before` to `after`, e.g. `-6.4%`."""
    return f"{100 * (after['cer'] - before['cer']) / before['cer']:+.1f}%" if before["cer"] else "-"


def pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}"
