"""Benchmark: GRPO from the `small` SFT checkpoint for N minutes; test CER before and after.

    python scripts/bench_grpo.py --sft exp/bench_sft/sft/final --work exp/bench_grpo --minutes 10

Runs `asr-rl train grpo` with recipes/configs/grpo_demo.yaml (local backend, 2 threads) for
`--minutes`, then `asr-rl eval` on test_clean and test_noisy for the SFT start and the GRPO result,
and prints the relative CER reduction. Target (issue 4): >= 20% relative CER reduction.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from bench_common import ensure_corpus, evaluate, run

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sft", required=True, help="SFT model folder to start from")
    p.add_argument("--work", default="exp/bench_grpo")
    p.add_argument("--corpus", default="data/demo_corpus_3000")
    p.add_argument("--minutes", type=float, default=10)
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for `asr-rl train grpo`")
    args = p.parse_args()
    work, corpus = Path(args.work), Path(args.corpus)
    ensure_corpus(corpus, 3000, 200)
    grpo = work / "grpo"
    if not (grpo / "final").is_dir():
        run("train", "grpo", "--config", str(ROOT / "recipes/configs/grpo_demo.yaml"), f"pretrain={args.sft}",
            f"train_manifest={corpus / 'train.jsonl'}", f"output_dir={grpo}", f"max_minutes={args.minutes}",
            "max_steps=1000", "save_steps=0", "eval_steps=0", "logging.progress_bar=false", *args.overrides)
    before = evaluate(Path(args.sft), corpus, work / "eval_sft")
    after = evaluate(grpo / "final", corpus, work / "eval_grpo")
    print(f"\n{'test set':<12} {'SFT CER%':>9} {'GRPO CER%':>10} {'rel. change':>12} {'kw recall SFT/GRPO':>20} {'lang acc SFT/GRPO':>19}")
    for name in ("test_clean", "test_noisy"):
        b, a = before[name], after[name]
        rel = (a["cer"] - b["cer"]) / b["cer"] if b["cer"] else float("nan")
        print(f"{name:<12} {100 * b['cer']:>9.2f} {100 * a['cer']:>10.2f} {100 * rel:>11.1f}% "
              f"{_pct(b['keyword_recall'])}/{_pct(a['keyword_recall']):>9} {_pct(b['language_accuracy'])}/{_pct(a['language_accuracy']):>8}")


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


if __name__ == "__main__":
    main()
