"""Benchmark: which reward terms matter. GRPO from one SFT checkpoint, one run per reward, equal
wall time each; CER, keyword recall and language accuracy on dev (where the choice is made) and,
with `--test`, on the test sets.

    python scripts/bench_rewards.py --sft exp/demo_full_qwen2_audio/sft/final --minutes 5 [--test]

Each run is `asr-rl train grpo --config recipes/configs/grpo_demo.yaml reward.terms=...` on the
local backend (2 threads, nothing else running), then `asr-rl eval`. Variants (name: reward.terms):
plain 1 - CER; 1 - CER with the failure terms of Mega-ASR (arXiv:2605.19833: omission,
hallucination/repetition, empty output); the dual-granularity error-gated reward alone; and the
multi-term reward (keywords, language, fluency) with 1 - CER or dg_wer as its error term.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from bench_common import evaluate, run

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "cer": "{cer: 1.0}",
    "cer+failure": "{cer: 1.0, omission: 0.5, hallucination: 0.5, empty: 0.5}",
    "dg_wer": "{dg_wer: 1.0}",
    "multi": "{cer: 1.0, keyword: 0.3, language: 1.0, fluency: 0.2}",
    "multi+dg": "{dg_wer: 1.0, keyword: 0.3, language: 1.0, fluency: 0.2}",
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sft", required=True, help="SFT model folder every run starts from")
    p.add_argument("--work", default="exp/bench_rewards")
    p.add_argument("--corpus", default="data/demo_corpus_3000")
    p.add_argument("--minutes", type=float, default=5)
    p.add_argument("--steps", type=int, default=60, help="the LR schedule's length (about what fits in --minutes)")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--test", action="store_true", help="also evaluate the test sets (after choosing on dev)")
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for every GRPO run")
    args = p.parse_args()
    work, corpus = Path(args.work), Path(args.corpus)
    sets = ("dev", "test_clean", "test_noisy", "test_accent") if args.test else ("dev",)
    results = {"sft start": evaluate(Path(args.sft), corpus, work / "eval" / "sft", sets)}
    for name in args.variants:
        out = work / name
        if not (out / "final").is_dir():
            run("train", "grpo", "--config", str(ROOT / "recipes/configs/grpo_demo.yaml"), f"pretrain={args.sft}",
                f"train_manifest={corpus / 'train.jsonl'}", f"output_dir={out}", f"max_minutes={args.minutes}",
                f"max_steps={args.steps}", "save_steps=0", "eval_steps=0", "backend=local", "num_threads=2",
                f"reward.terms={VARIANTS[name]}", "logging.progress_bar=false", *args.overrides)
        results[name] = evaluate(out / "final", corpus, work / "eval" / name, sets)
    print(f"\nGRPO for {args.minutes:g} min per reward from {args.sft}: CER % (keyword recall %, language acc %)")
    print(f"{'reward':<13}" + "".join(f"{s:>26}" for s in sets))
    for name, res in results.items():
        cells = [f"{100 * res[s]['cer']:.2f} ({_pct(res[s]['keyword_recall'])}, {_pct(res[s]['language_accuracy'])})"
                 for s in sets]
        print(f"{name:<13}" + "".join(f"{c:>26}" for c in cells))


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


if __name__ == "__main__":
    main()
