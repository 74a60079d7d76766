"""Benchmark: SFT step time with the frozen encoder's states cached in RAM only vs in a folder of
shards (`model.encoder_cache=DIR`), on the demo's SFT settings (sft_demo.yaml: Qwen2-Audio on the
frozen Whisper tiny.en, 16 utterances a step, one augmented variant) and a tiny model.

    python scripts/bench_encoder_cache.py [--work /tmp/bench_encoder_cache] [--train 400] [--epochs 3]

Arms (each a separate `asr-rl train sft` process, 1 thread):
- `ram`: `model.encoder_cache=null` (the in-memory cache of earlier versions, now LRU-bounded);
- `folder`: a fresh folder, every row written through as it is encoded;
- `folder, next run`: a new run on that filled folder: every row is read back from its shard once,
  then served from RAM (SFT after a killed SFT, or GRPO after SFT);
- `folder, 1 MiB RAM`: that folder with `model.encoder_cache_max_gib` far under one epoch's states:
  nearly every row of every step is read back from disk.
Step time: the median `time/step` of the warm steps (after the first epoch for the first two arms,
whose first epoch runs the encoder; all steps for the two that start from a filled folder). Target
(issue 40): the folder within 10% of RAM.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def asr_rl(*args: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-m", "asr_rl.cli", *args], check=True, env=env, cwd=ROOT)


def warm_step_times(run: Path, skip: int) -> list[float]:
    from asr_rl.trainer.run.metrics import read_metrics

    rows = [r for r in read_metrics(run) if "time/step" in r]
    return [r["time/step"] for r in rows if r["step"] > skip]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--work", default="/tmp/bench_encoder_cache")
    p.add_argument("--train", type=int, default=400, help="train utterances to synthesise")
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args()
    work = Path(args.work)
    corpus, model, cache = work / "corpus", work / "model", work / "encoder_cache"
    if not (corpus / "train.jsonl").is_file():
        asr_rl("data", "synth", "--out", str(corpus), "--train", str(args.train), "--test", "10", "--seed", "1")
    if not (model / "config.json").is_file():
        asr_rl("model", "init", "--arch", "qwen2_audio", "--size", "tiny", "--tokenizer-from",
               str(corpus / "train.jsonl"), "--out", str(model))
    per_epoch = -(-args.train // 16)
    common = ["--config", str(ROOT / "recipes/configs/sft_demo.yaml"), f"pretrain={model}",
              f"train_manifest={corpus / 'train.jsonl'}", f"max_steps={args.epochs * per_epoch}", "save_steps=0",
              "eval_steps=0", "num_threads=1", "logging.logging_steps=1", "logging.progress_bar=false",
              "logging.tensorboard=false", "early_stopping_patience=0", "early_stopping_decay_steps=0",
              "early_stopping_plateau_patience=0", "optim.lr_scheduler=cosine_with_min_lr"]
    arms = [("ram", ["model.encoder_cache=null"], per_epoch),
            ("folder", [f"model.encoder_cache={cache}"], per_epoch),
            ("folder, next run", [f"model.encoder_cache={cache}"], 0),
            ("folder, 1 MiB RAM", [f"model.encoder_cache={cache}", "model.encoder_cache_max_gib=0.001"], 0)]
    results = []
    for i, (name, extra, skip) in enumerate(arms):
        out = work / f"run{i}"
        if not (out / "final").is_dir():
            asr_rl("train", "sft", *common, f"output_dir={out}", *extra)
        times = warm_step_times(out, skip)
        results.append((name, statistics.median(times), len(times)))
    base = results[0][1]
    print(f"\n{'arm':<20} {'warm steps':>10} {'median s/step':>14} {'vs ram':>8}")
    for name, median, n in results:
        print(f"{name:<20} {n:>10} {median:>14.4f} {median / base:>8.3f}")


if __name__ == "__main__":
    main()
