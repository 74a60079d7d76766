"""Benchmark: DPO on the model's own N-best pairs vs GRPO vs SFT continued, at equal wall time from
one SFT start (issue 17).

    python scripts/bench_preference.py --exp EXP --corpus CORPUS [--minutes 8] [--dpo 2e-5,0 2e-5,1]

EXP holds `sft/final` and `encoder_cache/` (recipes/quickstart.sh stages 0-2, or `make demo`).
Every arm gets `--minutes` of wall time on the local backend (2 threads, nothing else running):
- GRPO: recipes/configs/grpo_demo.yaml (the demo's settings and reward terms);
- SFT continued: recipes/configs/sft_demo.yaml, a fresh cosine from 5e-4 (as bench_pretrained.py);
- DPO: `asr-rl data pairs` on the first `--pair-utterances` training utterances (8 samples at
  temperature 1, the GRPO reward terms, best vs worst), then `asr-rl train dpo` for `--dpo-epochs`
  passes over the pairs (cosine decay), capped by the rest of the minutes. The pair building time
  counts. One DPO run per `--dpo` variant (`LR,NLL_COEF`: learning rate and OpenRLHF's
  `nll_loss_coef` on the chosen transcript); the one with the lowest dev CER is reported (chosen on
  dev, reported on test). Training DPO for the whole minutes instead (65 passes over 112 pairs)
  wrecked the model (BENCHMARKS.md).
Prints per set the CER, keyword recall and language accuracy of each model, and the relative CER
change against the start.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench_common import FIXED_TIME_SFT, evaluate, pct, rel_cer, run

ROOT = Path(__file__).resolve().parents[1]
SETS = ("dev", "test_clean", "test_noisy", "test_accent")
REWARD = "--reward-config"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--exp", required=True)
    p.add_argument("--corpus", required=True)
    p.add_argument("--minutes", type=float, default=8.0)
    p.add_argument("--pair-utterances", type=int, default=1200)
    p.add_argument("--dpo", nargs="+", default=["2e-5,0", "2e-5,1"], help="LR,NLL_COEF variants")
    p.add_argument("--dpo-epochs", type=float, default=2.0)
    p.add_argument("--beta", type=float, default=0.1)
    args = p.parse_args()
    exp, corpus, minutes = Path(args.exp), Path(args.corpus), args.minutes
    sft, cache, out = exp / "sft/final", exp / "encoder_cache", exp / "bench17"
    common = [f"pretrain={sft}", f"model.encoder_cache={cache}", "save_steps=0", "eval_steps=0",
              "logging.progress_bar=false", "num_threads=2", f"max_minutes={minutes}"]
    models = {"sft": sft}
    if not (out / "grpo/final").is_dir():
        run("train", "grpo", "--config", str(ROOT / "recipes/configs/grpo_demo.yaml"), *common, "backend=local",
            f"train_manifest={corpus / 'train.jsonl'}", f"output_dir={out / 'grpo'}", "max_steps=100")  # the demo's warmup
    models["grpo"] = out / "grpo/final"
    if not (out / "sft_continued/final").is_dir():
        run("train", "sft", "--config", str(ROOT / "recipes/configs/sft_demo.yaml"), *common, *FIXED_TIME_SFT,
            "optim.learning_rate=5e-4",
            f"train_manifest={corpus / 'train.jsonl'}", f"output_dir={out / 'sft_continued'}",
            f"max_steps={int(minutes * 60 / 0.2)}")  # ~0.2 s a step here: the cosine spans the minutes
    models["sft_continued"] = out / "sft_continued/final"
    pair_minutes, pairs = build_pairs(sft, corpus, out, args.pair_utterances)
    n_pairs = sum(1 for _ in pairs.open(encoding="utf-8"))
    steps = max(1, round(args.dpo_epochs * n_pairs / 16))
    for variant in args.dpo:
        lr, nll = (float(x) for x in variant.split(","))
        name = f"dpo_lr{lr:g}_nll{nll:g}_p{args.pair_utterances}"
        if not (out / name / "final").is_dir():
            wall = run("train", "dpo", *common, f"max_minutes={minutes - pair_minutes:.2f}",
                       f"train_manifest={pairs}", f"output_dir={out / name}", f"optim.learning_rate={lr}",
                       f"nll_loss_coef={nll}", f"beta={args.beta}", "train_batch_size=16", "micro_train_batch_size=16",
                       f"max_steps={steps}", "optim.lr_warmup_ratio=0.1")
            (out / name / "wall_seconds").write_text(f"{wall:.1f}")
        models[name] = out / name / "final"
    results = {name: evaluate(path, corpus, out / "eval" / name, SETS) for name, path in models.items()}
    dpo = min((n for n in models if n.startswith("dpo")), key=lambda n: results[n]["dev"]["cer"])
    shown = ["sft", "grpo", "sft_continued", dpo]
    print(f"\n{minutes:.1f} min per arm from the same SFT start; DPO: {pair_minutes:.1f} min building {n_pairs} "
          f"pairs, {steps} steps ({args.dpo_epochs:g} passes), "
          f"{dpo} chosen on dev among {', '.join(n for n in models if n.startswith('dpo'))}")
    print("| set | " + " | ".join(f"{m} CER %" for m in shown) + " | keyword recall % | language acc % |")
    print("|---|" + "---:|" * (len(shown) + 2))
    for s in SETS:
        r = [results[m][s] for m in shown]
        cers = [f"{100 * x['cer']:.2f}" + ("" if i == 0 else f" ({rel_cer(x, r[0])})") for i, x in enumerate(r)]
        print(f"| {s} | " + " | ".join(cers) + f" | {' / '.join(pct(x['keyword_recall']) for x in r)} | "
              f"{' / '.join(pct(x['language_accuracy']) for x in r)} |")
    for n in models:
        if n != "sft" and n in results:
            wall = out / n / "wall_seconds"
            print(f"{n}: dev CER {100 * results[n]['dev']['cer']:.2f}"
                  + (f", trained in {float(wall.read_text()) / 60:.1f} min" if wall.is_file() else ""))


def build_pairs(sft: Path, corpus: Path, out: Path, n_utts: int) -> tuple[float, Path]:
    """The pair file from the first `n_utts` training utterances; returns the minutes it took and the file."""
    pairs, done = out / f"pairs_{n_utts}.jsonl", out / f"pairs_{n_utts}.time"
    if done.is_file():
        return float(done.read_text()), pairs
    out.mkdir(parents=True, exist_ok=True)
    subset = out / f"pair_source_{n_utts}.jsonl"
    lines = (corpus / "train.jsonl").read_text(encoding="utf-8").splitlines()[:n_utts]
    rows = [json.loads(x) for x in lines]
    for r in rows:  # absolute audio paths: the subset lives elsewhere
        r["audio"] = str((corpus / r["audio"]).resolve())
    subset.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    reward = out / "reward.yaml"
    reward.write_text("terms: {cer: 1.0, omission: 0.5, hallucination: 0.5, empty: 0.5}\n")
    start = time.perf_counter()
    run("data", "pairs", "--model", str(sft), "--manifest", str(subset), "--out", str(pairs), "--n", "8",
        "--temperature", "1.0", "--max-new-tokens", "64", "--batch-size", "8", REWARD, str(reward))
    minutes = (time.perf_counter() - start) / 60
    done.write_text(f"{minutes:.3f}")
    return minutes, pairs


if __name__ == "__main__":
    main()
