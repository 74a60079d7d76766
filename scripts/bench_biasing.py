"""Benchmark: RL on a biasing reward against SFT continued, on context lists of 0, 10 and 100 items.

    python scripts/bench_biasing.py --work exp/bench_biasing [--train 3000 --test 200 --rl-minutes 8]
    # from a finished `make demo` (its corpus, pool and SFT at its plateau, without lists):
    python scripts/bench_biasing.py --work exp/bench_biasing --from-corpus data/demo_corpus_3000 \
        --from-pool data/demo_corpus_3000_rl_pool --start exp/demo_full_qwen2_audio/sft/best

1. The corpus with context lists: `asr-rl data synth --context-sizes 0,10,100` (and a pool of new
   utterances for the RL stage, with lists too), or an existing synth corpus's audio with the same
   lists added (`--from-corpus`, `--from-pool`: synth/contexts.py, seeded as synth seeds them).
2. The start: `model init` (Qwen2-Audio on the frozen Whisper tiny.en encoder, `small`), or `--start`,
   an SFT'd model whose character tokenizer is extended to the lists' characters (new embedding rows
   at the mean of the old ones).
3. SFT with the lists, to its plateau on dev with 10-item lists (recipes/configs/sft_demo.yaml:
   early stopping, decay, a flat window at the floor rate; from `--start`, at `--sft-lr`).
4. RL from the SFT's best: recipes/configs/grpo_demo.yaml with the reward `cer` + `biasing`, on the
   pool, for `--rl-minutes`.
5. The control: SFT continued from the same start on the same pool with its transcripts, for the RL
   run's wall time (scripts/bench_pretrained.py's continuation).
6. `asr-rl eval` on test_clean at each list size and `--compare` (paired bootstrap): CER, B-WER,
   U-WER and false biasing, RL against the start and against the control.

Targets (issue 28): at list size 100, RL lowers B-WER by >= 30% relative from the start, U-WER
rises by no more than 2% relative, and RL beats the continuation on B-WER.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import yaml
from bench_common import evaluate, run
from bench_pretrained import compare, continuation_args

from asr_rl.data.synth.contexts import add_contexts

ROOT = Path(__file__).resolve().parents[1]


def sets_for(sizes: list[int]) -> list[str]:
    return [f"test_clean_ctx{n}" if n else "test_clean" for n in sizes]


def with_contexts(src: Path, dst: Path, sizes: list[int]) -> None:
    """`src` (a synth corpus) with context lists, as `data synth --context-sizes` would add them (the
    same seeded streams), into `dst`: its manifests only, the audio paths pointing into `src`."""
    if (dst / "train.jsonl").is_file():
        return
    seed = json.loads((src / "corpus.json").read_text())["params"]["seed"]
    rows = {}
    for manifest in sorted(src.glob("*.jsonl")):
        lines = [json.loads(x) for x in manifest.read_text(encoding="utf-8").splitlines() if x.strip()]
        rows[manifest.stem] = [dict(r, audio=str((src / r["audio"]).resolve())) for r in lines]
    dst.mkdir(parents=True, exist_ok=True)
    for split, split_rows in add_contexts(rows, sizes, seed).items():
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in split_rows)
        (dst / f"{split}.jsonl").write_text(text, encoding="utf-8")


def extend_vocabulary(src: Path, dst: Path, manifests: list[Path]) -> None:
    """`src` with its character tokenizer extended to every character of `manifests` (their context
    lists name people and places no transcript does); the new embedding rows start at the mean of
    the old ones (transformers' resize_token_embeddings)."""
    if (dst / "config.json").is_file():
        return
    from transformers import AutoConfig

    from asr_rl.models.families import spec_for
    from asr_rl.models.tokenizer import read_texts

    tok = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tok["model"]["vocab"]
    new = sorted({c for t in read_texts(manifests) for c in t} - set(vocab) - {" "})
    size = max(max(vocab.values()), *(a["id"] for a in tok["added_tokens"])) + 1
    vocab.update({c: size + i for i, c in enumerate(new)})
    model = spec_for(AutoConfig.from_pretrained(src).model_type).model_class().from_pretrained(src)
    model.resize_token_embeddings(size + len(new))
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors", "tokenizer.json", "best.json"))
    model.save_pretrained(dst)
    (dst / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    print(f"{dst}: {len(new)} characters added to {src}'s tokenizer: {''.join(new)}")


def prepare(work: Path, args) -> tuple[Path, Path, Path]:
    """The corpus and the pool with lists, and the model the SFT with lists starts from."""
    corpus, pool = work / "corpus", work / "pool"
    if args.from_corpus:
        with_contexts(Path(args.from_corpus), corpus, args.sizes)
        with_contexts(Path(args.from_pool), pool, args.sizes)
    else:
        sizes = ",".join(map(str, args.sizes))
        run("data", "synth", "--out", str(corpus), "--train", str(args.train), "--test", str(args.test), "--seed",
            "1", "--context-sizes", sizes, "--quiet")
        run("data", "synth", "--out", str(pool), "--train", str(args.pool), "--test", "1", "--seed", "99",
            "--context-sizes", sizes, "--quiet")
    manifests = [corpus / "train.jsonl", pool / "train.jsonl", *sorted(corpus.glob("*_ctx*.jsonl"))]
    if args.start:
        extend_vocabulary(Path(args.start), work / "init", manifests)
    elif not (work / "init" / "config.json").is_file():
        run("model", "init", "--arch", "qwen2_audio", "--size", "small", "--tokenizer-from",
            *map(str, manifests), "--out", str(work / "init"))
    return corpus, pool, work / "init"


def train(work: Path, args) -> None:
    corpus, pool, init = prepare(work, args)
    cache = f"model.encoder_cache={work / 'encoder_cache'}"
    dev = corpus / (f"dev_ctx{args.dev_size}.jsonl" if args.dev_size else "dev.jsonl")
    # from an SFT'd start: its plateau's rate schedule again, scaled down (a warm start at 2e-3
    # would first undo what it knows)
    warm = [f"optim.learning_rate={args.sft_lr}", "early_stopping_decay_steps=200",
            "early_stopping_plateau_patience=4", "optim.min_lr_ratio=0.2"] if args.start else []
    if not (work / "sft" / "final").is_dir():
        run("train", "sft", "--config", str(ROOT / "recipes/configs/sft_demo.yaml"), f"pretrain={init}",
            f"train_manifest={corpus / 'train.jsonl'}", f"eval_manifest={dev}", f"output_dir={work / 'sft'}",
            f"max_minutes={args.sft_minutes}", cache, "logging.progress_bar=false", "resume=auto", *warm)
    start = work / "sft" / ("best" if (work / "sft" / "best").is_dir() else "final")
    if not (work / "rl" / "final").is_dir():
        run("train", "grpo", "--config", str(ROOT / "recipes/configs/grpo_demo.yaml"), f"pretrain={start}",
            f"train_manifest={pool / 'train.jsonl'}", f"eval_manifest={dev}", f"output_dir={work / 'rl'}",
            # grpo_demo.yaml's own max_steps: its warmup is a share of them (a huge bound would keep
            # the rate at its warmup's start); max_minutes ends the run first
            "backend=local", "num_threads=2", f"max_minutes={args.rl_minutes}",
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
    p.add_argument("--from-corpus", default=None, help="a synth corpus whose audio to reuse (lists added)")
    p.add_argument("--from-pool", default=None, help="with --from-corpus: the pool's synth corpus")
    p.add_argument("--start", default=None, help="an SFT'd model (without lists) to start the SFT with lists from")
    p.add_argument("--sft-lr", type=float, default=5e-4, help="with --start: the SFT's stable rate")
    args = p.parse_args()
    work = Path(args.work)
    train(work, args)
    report(work, args)


if __name__ == "__main__":
    main()
