"""Benchmark: the demo's RL stage against SFT continued from the same start for the same wall time.

    make demo                                   # exp/demo_full_qwen2_audio: sft/, grpo/, eval/
    python scripts/bench_pretrained.py --exp exp/demo_full_qwen2_audio

The control sees exactly the data the RL stage saw: it starts from the RL run's `pretrain` (the
SFT's best on dev, at its plateau), trains on the RL run's `train_manifest` (the demo's pool of
utterances the SFT never heard) with their transcripts, with the RL run's augmentation settings and
encoder cache, for the RL run's wall time (`time/elapsed_min` of its last logged step). Its rate is
constant, by default the SFT run's floor (`learning_rate * min_lr_ratio`: the rate its plateau was
measured at; `--continue-lr` to choose another on dev). Then every model is evaluated on dev and each
test set (the demo's own evaluations are reused when present) and compared utterance by utterance
with `asr-rl eval --compare` (paired bootstrap, 95% intervals, probability of improvement).

Targets (issue 27): from the plateau, RL lowers CER by >= 15% relative on dev, test_clean,
test_noisy and test_accent, each with P(improvement) >= 0.95, beats the continuation on each set,
keyword recall up and language accuracy not down.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml
from bench_common import FIXED_TIME_SFT, evaluate, pct, run

ROOT = Path(__file__).resolve().parents[1]
SETS = ("dev", "test_clean", "test_noisy", "test_accent")


def continuation_args(exp: Path, rl_cfg: dict, sft_cfg: dict, lr: float | None, minutes: float) -> list[str]:
    """`asr-rl train sft` arguments of the control: the RL run's start, data, augmentation and cache."""
    lr = lr if lr is not None else sft_cfg["optim"]["learning_rate"] * sft_cfg["optim"]["min_lr_ratio"]
    augment = [f"augment.{k}={v}" for k, v in rl_cfg["augment"].items() if k in sft_cfg["augment"]]
    cache = rl_cfg["model"].get("encoder_cache")
    return ["train", "sft", "--config", str(ROOT / "recipes/configs/sft_demo.yaml"), f"pretrain={rl_cfg['pretrain']}",
            f"train_manifest={rl_cfg['train_manifest']}", f"output_dir={exp / 'sft_continued'}",
            f"max_minutes={minutes:.2f}", "max_steps=1000000", "save_steps=0", "eval_steps=0",
            *FIXED_TIME_SFT, "optim.lr_scheduler=constant_with_warmup", "optim.lr_warmup_ratio=0",
            f"optim.learning_rate={lr}",
            *augment, *([f"model.encoder_cache={cache}"] if cache else []), "logging.progress_bar=false"]


def compare(a: Path, b: Path, out: Path) -> dict:
    """`asr-rl eval --compare a b`'s per-set results (B against A)."""
    if not (out / "report.json").is_file():
        run("eval", "--compare", str(a), str(b), "--output", str(out))
    return json.loads((out / "report.json").read_text())["compare"]["test_sets"]


def interval(c: dict) -> str:
    u = c["utterance"]
    lo, hi = (100 * x for x in u["relative_ci"])
    return f"{100 * u['relative']:+.1f}% [{lo:+.1f}, {hi:+.1f}] P={u['p_improvement']:.2f}"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--exp", default="exp/demo_full_qwen2_audio", help="a finished `make demo` folder")
    p.add_argument("--corpus", default=None, help="the test sets' folder (default: the SFT's training corpus)")
    p.add_argument("--rl", default="grpo", help="the RL run's folder name under --exp")
    p.add_argument("--continue-lr", type=float, default=None, help="the control's constant rate (default: the "
                                                                   "SFT's floor rate)")
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for the SFT continuation")
    args = p.parse_args()
    exp = Path(args.exp)
    rl_cfg = yaml.safe_load((exp / args.rl / "config.yaml").read_text())
    sft_cfg = yaml.safe_load((exp / "sft" / "config.yaml").read_text())
    corpus = Path(args.corpus) if args.corpus else Path(sft_cfg["train_manifest"]).parent
    rows = [json.loads(x) for x in (exp / args.rl / "metrics.jsonl").read_text().splitlines()]
    minutes = max(r.get("time/elapsed_min", 0.0) for r in rows)
    cont = exp / "sft_continued"
    if not (cont / "final").is_dir():
        run(*continuation_args(exp, rl_cfg, sft_cfg, args.continue_lr, minutes), *args.overrides)
    models = {"sft": Path(rl_cfg["pretrain"]), "rl": exp / args.rl / "final", "sft_continued": cont / "final"}
    evals = {"sft": exp / "eval" / "sft", "rl": exp / "eval" / args.rl, "sft_continued": exp / "eval" / "sft_continued"}
    results = {m: evaluate(path, corpus, evals[m], SETS) for m, path in models.items()}
    rl_vs_start = compare(evals["sft"], evals["rl"], exp / "eval" / "compare")
    cont_vs_start = compare(evals["sft"], evals["sft_continued"], exp / "eval" / "compare_continued")
    rl_vs_cont = compare(evals["sft_continued"], evals["rl"], exp / "eval" / "compare_rl_vs_continued")
    print(f"\n{args.rl} and SFT continued, each {minutes:.1f} min from {models['sft']} on {rl_cfg['train_manifest']}")
    print("| set | start CER % | RL CER % | SFT cont. CER % | RL vs start [95% CI] | SFT cont. vs start | "
          "RL vs SFT cont. | kw recall start/RL/cont | lang acc start/RL/cont |")
    print("|---|---:|---:|---:|---|---|---|---|---|")
    for s in SETS:
        a, b, c = (results[m][s] for m in models)
        print(f"| {s} | {100 * a['cer']:.2f} | {100 * b['cer']:.2f} | {100 * c['cer']:.2f} | {interval(rl_vs_start[s])} | "
              f"{interval(cont_vs_start[s])} | {interval(rl_vs_cont[s])} | "
              f"{'/'.join(pct(m['keyword_recall']) for m in (a, b, c))} | "
              f"{'/'.join(pct(m['language_accuracy']) for m in (a, b, c))} |")


if __name__ == "__main__":
    main()
