"""Benchmark: SFT of the `small` model on the synthesised demo corpus; held-out CER vs wall minutes.

    python scripts/bench_sft.py --work exp/bench_sft --minutes 20

Synthesises `asr-rl data synth --train 3000 --test 200` (if missing), `asr-rl model init --size small`,
trains with recipes/configs/sft_demo.yaml for `--minutes` (2 threads), saving every `--ckpt-every`
steps, then evaluates every checkpoint on test_clean and test_noisy and prints a table. Target
(issue 3): test_clean CER <= 15% within 20 minutes on the 2-core machine.
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from bench_common import ensure_corpus, evaluate, metrics_at, run

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--work", default="exp/bench_sft")
    p.add_argument("--corpus", default="data/demo_corpus_3000")
    p.add_argument("--minutes", type=float, default=20)
    p.add_argument("--ckpt-every", type=int, default=300)
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for `asr-rl train sft`")
    args = p.parse_args()
    work, corpus = Path(args.work), Path(args.corpus)
    ensure_corpus(corpus, 3000, 200)
    init = work / "init"
    if not init.is_dir():
        run("model", "init", "--size", "small", "--tokenizer-from", str(corpus / "train.jsonl"), "--out", str(init))
    sft = work / "sft"
    if not (sft / "final").is_dir():
        run("train", "sft", "--config", str(ROOT / "recipes/configs/sft_demo.yaml"), f"pretrain={init}",
            f"train_manifest={corpus / 'train.jsonl'}", f"output_dir={sft}", f"max_minutes={args.minutes}",
            f"save_steps={args.ckpt_every}", "max_ckpt_num=100", "eval_steps=0", "logging.progress_bar=false",
            *args.overrides)
    rows = []
    for ckpt in sorted((sft / "checkpoints").glob("step_*")):
        step = int(re.sub(r"\D", "", ckpt.name))
        minutes = metrics_at(sft, step)["time/elapsed_min"]
        report = evaluate(ckpt, corpus, work / "eval" / ckpt.name)
        rows.append((step, minutes, report["test_clean"]["cer"], report["test_noisy"]["cer"]))
    print(f"\n{'step':>6} {'minutes':>8} {'test_clean CER%':>16} {'test_noisy CER%':>16}")
    for step, minutes, clean, noisy in rows:
        print(f"{step:>6} {minutes:>8.1f} {100 * clean:>16.2f} {100 * noisy:>16.2f}")


if __name__ == "__main__":
    main()
