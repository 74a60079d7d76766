"""Benchmark: SFT of the `small` model on the synthesised demo corpus; held-out CER vs wall minutes.

    python scripts/bench_sft.py --work exp/bench_sft --minutes 20 [--arch qwen3_asr]

Synthesises `asr-rl data synth --train 3000 --test 200` (if missing), `asr-rl model init --size small
--arch ARCH` (qwen2_audio on the pretrained Whisper tiny.en encoder by default; qwen3_asr from
scratch), trains with the arch's demo config (sft_demo.yaml or sft_scratch.yaml) for `--minutes`
(2 threads), saving every `--ckpt-every` steps, then evaluates every checkpoint on dev and the test
sets and prints a table (English and Mandarin apart). Targets: qwen2_audio test_clean CER <= 8%
within 15 minutes (issue 13); qwen3_asr <= 15% within 20 (issue 3).
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from bench_common import FIXED_TIME_SFT, ensure_corpus, evaluate, metrics_at, run

ROOT = Path(__file__).resolve().parents[1]
SETS = ("dev", "test_clean", "test_noisy", "test_accent")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--work", default="exp/bench_sft")
    p.add_argument("--corpus", default="data/demo_corpus_3000")
    p.add_argument("--arch", default="qwen2_audio", choices=["qwen2_audio", "qwen3_asr"])
    p.add_argument("--minutes", type=float, default=15)
    p.add_argument("--ckpt-every", type=int, default=300)
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for `asr-rl train sft`")
    args = p.parse_args()
    work, corpus = Path(args.work), Path(args.corpus)
    ensure_corpus(corpus, 3000, 200)
    init = work / "init"
    if not init.is_dir():
        run("model", "init", "--arch", args.arch, "--size", "small", "--tokenizer-from", str(corpus / "train.jsonl"),
            "--out", str(init))
    sft = work / "sft"
    # a pretrained (frozen) encoder trains with the demo's settings, a random one with the from-scratch ones
    from asr_rl.models.families import FAMILIES

    config = "sft_demo.yaml" if FAMILIES.get(args.arch).default_encoder else "sft_scratch.yaml"
    if not (sft / "final").is_dir():
        run("train", "sft", "--config", str(ROOT / "recipes/configs" / config), f"pretrain={init}",
            f"train_manifest={corpus / 'train.jsonl'}", f"output_dir={sft}", f"max_minutes={args.minutes}",
            f"save_steps={args.ckpt_every}", "max_ckpt_num=100", "eval_steps=0", "logging.progress_bar=false",
            *(FIXED_TIME_SFT if config == "sft_demo.yaml" else []),
            *args.overrides)
    rows = []
    for ckpt in sorted((sft / "checkpoints").glob("step_*")):
        step = int(re.sub(r"\D", "", ckpt.name))
        minutes = metrics_at(sft, step)["time/elapsed_min"]
        report = evaluate(ckpt, corpus, work / "eval" / ckpt.name, SETS)
        rows.append((step, minutes, report))
    print(f"\n{'step':>6} {'minutes':>8} " + " ".join(f"{s + ' CER%':>17}" for s in SETS)
          + f" {'test_clean en/zh CER%':>22}")
    for step, minutes, report in rows:
        langs = report["test_clean"].get("per_language", {})
        split = "/".join(f"{100 * langs[lang]['cer']:.2f}" if lang in langs else "-" for lang in ("en", "zh"))
        print(f"{step:>6} {minutes:>8.1f} " + " ".join(f"{100 * report[s]['cer']:>17.2f}" for s in SETS) + f" {split:>22}")


if __name__ == "__main__":
    main()
