"""Benchmark: RL on a biasing reward against SFT continued, on context lists of 0, 10 and 100 items.

    python scripts/bench_biasing.py --work exp/bench_biasing [--train 3000 --test 200 --rl-minutes 8]

1. `asr-rl data synth --context-sizes 0,10,100` (and a pool of new utterances for the RL stage, with
   lists too); `model init` (Qwen2-Audio on the frozen Whisper tiny.en encoder, `small`).
2. SFT with the lists, to its plateau on dev (recipes/configs/sft_demo.yaml: early stopping, decay,
   a flat window at the floor rate), dev with 10-item lists.
3. RL from the SFT's best: recipes/configs/grpo_demo.yaml with the reward `cer` + `biasing`, on the
   pool, for `--rl-minutes`.
4. The control: SFT continued from the same start on the same pool with its transcripts, for the RL
   run's wall time (scripts/bench_pretrained.py's continuation).
5. `asr-rl eval` on test_clean at each list size and `--compare` (paired bootstrap): CER, B-WER,
   U-WER and false biasing, RL against the start and against the control.

Targets (issue 28): at list size 100, RL lowers B-WER by >= 30% relative from the start, U-WER
rises by no more than 2% relative, and RL beats the continuation on B-WER.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml
from bench_common import evaluate, run
from bench_pretrained import compare, continuation_args

ROOT = Path(__file__).resolve().parents[1]


def sets_for(sizes: list[int]) -> list[str]:
    return [f"test_clean_ctx{n}" if n else "test_clean" for n in sizes]


def train(work: Path, args) -> None:
    corpus, pool = work / "corpus", work / "pool"
    sizes = ",".join(map(str, args.sizes))
    run("data", "synth", "--out", str(corpus), "--train", str(args.train), "--test", str(args.test), "--seed", "1",
        "--context-sizes", sizes, "--quiet")
    run("data", "synth", "--out", str(pool), "--train", str(args.pool), "--test", "1", "--seed", "99",
        "--context-sizes", sizes, "--quiet")
    if not (work / "init" / "config.json").is_file():
        run("model", "init", "--arch", "qwen2_audio", "--size", "small", "--tokenizer-from",
            str(corpus / "train.jsonl"), str(pool / "train.jsonl"), "--out", str(work / "init"))
    cache = f"model.encoder_cache={work / 'encoder_cache.pt'}"
    dev = corpus / (f"dev_ctx{args.dev_size}.jsonl" if args.dev_size else "dev.jsonl")
    if not (work / "sft" / "final").is_dir():
        run("train", "sft", "--config", str(ROOT / "recipes/configs/sft_demo.yaml"), f"pretrain={work / 'init'}",
            f"train_manifest={corpus / 'train.jsonl'}", f"eval_manifest={dev}", f"output_dir={work / 'sft'}",
            f"max_minutes={args.sft_minutes}", cache, "logging.progress_bar=false", "resume=auto")
    start = work / "sft" / ("best" if (work / "sft" / "best").is_dir() else "final")
    if not (work / "rl" / "final").is_dir():
        run("train", "grpo", "--config", str(ROOT / "recipes/configs/grpo_demo.yaml"), f"pretrain={start}",
            f"train_manifest={pool / 'train.jsonl'}", f"eval_manifest={dev}", f"output_dir={work / 'rl'}",
            "backend=local", "num_threads=2", "max_steps=100000", f"max_minutes={args.rl_minutes}",
            "save_steps=0", "eval_steps=0", cache, f"reward.terms={{cer: 1.0, biasing: {args.biasing_weight}}}",
            "logging.progress_bar=false", "resume=auto")
    if not (work / "sft_continued" / "final").is_dir():
        rl_cfg = yaml.safe_load((work / "rl" / "config.yaml").read_text())
        sft_cfg = yaml.safe_load((work / "sft" / "config.yaml").read_text())
        rows = [json.loads(x) for x in (work / "rl" / "metrics.jsonl").read_text().splitlines()]
        minutes = max(r.get("time/elapsed_min", 0.0) for r in rows)
        run(*continuation_args(work, rl_cfg, sft_cfg, None, minutes))


def report(work: Path, args) -> None:
    corpus, sets = work / "corpus", sets_for(args.sizes)
    start = work / "sft" / ("best" if (work / "sft" / "best").is_dir() else "final")
    models = {"sft": start, "rl": work / "rl" / "final", "sft_continued": work / "sft_continued" / "final"}
    for name, path in models.items():
        evaluate(path, corpus, work / "eval" / name, sets)
    pairs = {"RL vs start": ("sft", "rl"), "SFT cont. vs start": ("sft", "sft_continued"),
             "RL vs SFT cont.": ("sft_continued", "rl")}
    cmp = {label: compare(work / "eval" / a, work / "eval" / b, work / "eval" / f"compare_{a}_{b}")
           for label, (a, b) in pairs.items()}
    print("\n| set | pair | CER A / B % | B-WER A / B % [B-A pts 95% CI] P(B<A) | U-WER A / B % | false biasing A / B |")
    print("|---|---|---|---|---|---|")
    for s in sets:
        for label, c in cmp.items():
            t = c[s]
            u, bias = t["utterance"], t.get("biasing") or {}
            bw, uw = bias.get("b_wer"), bias.get("u_wer")
            b_cell = (f"{100 * bw['cer_a']:.2f} / {100 * bw['cer_b']:.2f} [{100 * bw['delta_ci'][0]:+.2f}, "
                      f"{100 * bw['delta_ci'][1]:+.2f}] {bw['p_improvement']:.2f}" if bw else "-")
            u_cell = f"{100 * uw['cer_a']:.2f} / {100 * uw['cer_b']:.2f}" if uw else "-"
            fb = bias.get("false_biasing")
            fb_cell = f"{fb['a']} / {fb['b']}" if fb else "-"
            print(f"| {s} | {label} | {100 * u['cer_a']:.2f} / {100 * u['cer_b']:.2f} | {b_cell} | {u_cell} | {fb_cell} |")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--work", default="exp/bench_biasing")
    p.add_argument("--train", type=int, default=3000)
    p.add_argument("--test", type=int, default=200)
    p.add_argument("--pool", type=int, default=800, help="utterances the RL stage (and the control) train on")
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[0, 10, 100])
    p.add_argument("--dev-size", type=int, default=10, help="the list size of the dev set SFT stops on")
    p.add_argument("--sft-minutes", type=float, default=45)
    p.add_argument("--rl-minutes", type=float, default=8)
    p.add_argument("--biasing-weight", type=float, default=1.0)
    args = p.parse_args()
    work = Path(args.work)
    train(work, args)
    report(work, args)


if __name__ == "__main__":
    main()
