"""Benchmark: SFT step time with the frozen encoder's states cached in RAM only vs in a folder of
shards (`model.encoder_cache=DIR`), on the demo's SFT settings (sft_demo.yaml: Qwen2-Audio on the
frozen Whisper tiny.en, 16 utterances a step) with a tiny model and the waveform augmentation off
(with it, each epoch draws variants not encoded yet, and a step that runs the encoder is not warm).

    python scripts/bench_encoder_cache.py [--work /tmp/bench_encoder_cache] [--train 400] [--epochs 3]

Arms (each a separate `asr-rl train sft` process, 1 thread):
- `ram`: `model.encoder_cache=null` (the in-memory cache of earlier versions, now LRU-bounded);
- `folder`: a fresh folder, every row written through as it is encoded;
- `folder, next run`: a new run on that filled folder: every row is read back from its shard once,
  then served from RAM (SFT after a killed SFT, or GRPO after SFT);
- `folder, 1 MiB RAM`: that folder with `model.encoder_cache_max_gib` far under one epoch's states:
  nearly every row of every step is read back from disk.
Step time: the median `time/step` of the warm steps (those whose encoder time stayed 0: after the
first epoch for the first two arms, all steps for the two that start from a filled folder). Target
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


def warm_steps(run: Path) -> tuple[list[float], dict]:
    """`time/step` of the steps that ran no encoder pass, and the last step's metrics."""
    from asr_rl.trainer.run.metrics import read_metrics

    rows = [r for r in read_metrics(run) if "time/step" in r]
    times, spent = [], 0.0
    for r in rows:
        if r["time/encoder_total"] == spent:
            times.append(r["time/step"])
        spent = r["time/encoder_total"]
    return times, rows[-1]


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
              "early_stopping_plateau_patience=0", "optim.lr_scheduler=cosine_with_min_lr", "augment.noise_prob=0",
              "augment.reverb_prob=0", "augment.telephone_prob=0", "augment.speed_prob=0"]
    arms = [("ram", ["model.encoder_cache=null"]),
            ("folder", [f"model.encoder_cache={cache}"]),
            ("folder, next run", [f"model.encoder_cache={cache}"]),
            ("folder, 1 MiB RAM", [f"model.encoder_cache={cache}", "model.encoder_cache_max_gib=0.001"])]
    results = []
    for i, (name, extra) in enumerate(arms):
        out = work / f"run{i}"
        if not (out / "final").is_dir():
            asr_rl("train", "sft", *common, f"output_dir={out}", *extra)
        times, last = warm_steps(out)
        results.append((name, statistics.median(times), statistics.mean(times), len(times), last))
    base = results[0][1]
    print(f"\n{'arm':<20} {'warm steps':>10} {'median s/step':>14} {'mean':>8} {'vs ram':>8} {'disk reads':>10} "
          f"{'RAM MiB':>8}")
    for name, median, mean, n, last in results:
        print(f"{name:<20} {n:>10} {median:>14.4f} {mean:>8.4f} {median / base:>8.3f} "
              f"{last['encoder/disk_reads']:>10.0f} {1024 * last['encoder/ram_gib']:>8.1f}")


if __name__ == "__main__":
    main()
