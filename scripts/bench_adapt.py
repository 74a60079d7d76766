"""Benchmark: adapting to a new domain from unlabelled audio (issues 39, 46): RL arms by updates, SFT arms by time.

    make demo                                   # the SFT start: exp/demo_full_qwen2_audio/sft/best
    asr-rl data synth --domain target --out data/target_domain --train 800 --test 500 --seed 7
    python scripts/bench_adapt.py --start exp/demo_full_qwen2_audio/sft/best --target data/target_domain \\
        --source data/demo_corpus_3000 --work exp/bench_adapt --steps 250 --minutes 5 [--scorer DIR] [--rl-only]

From the same start and the same target-domain pool (held-out accents and new voices through a
telephone channel), each RL arm runs `--steps` updates (the demo's stage 4 settings, its wall time in
the run's metrics) and each SFT arm trains for `--minutes`:
  (a) rl_verifier:  GRPO on the unlabelled pool, rewarded by recipes/rewards/voice_commands.py
                    (the command grammar, loops, speaking rate: no transcript);
  (b) self_train:   greedy pseudo-labels of the pool (`asr-rl data pseudo-label`), then SFT on them;
  (c) best_of_n:    the best of 8 samples under the same verifier as labels, then SFT on them;
and with the pool's transcripts:
  (d) rl_cer:       GRPO with 1 - CER and the failure terms (the demo's reward);
  (e) sft:          SFT on the transcripts;
with `--scorer` (an `asr-rl train scorer` folder), the arms that listen, also without transcripts:
  (f) rl_listening:           GRPO rewarded by the acoustic term alone (what a user without a grammar has);
  (g) rl_verifier_listening:  the verifier with the acoustic term beside it (VOICE_COMMANDS_SCORER).
The labelling time of (b) and (c) is reported apart, not charged to their SFT minutes. SFT runs at
the start's floor rate (constant), as the continuation control of bench_pretrained.py. Every arm is
evaluated on the target dev and test sets, the source test_clean (forgetting) and the non-speech
set, with the verifier's pass rate, and compared with `asr-rl eval --compare` (paired bootstrap).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import yaml
from bench_common import FIXED_TIME_SFT, run

ROOT = Path(__file__).resolve().parents[1]
VERIFIER = str(ROOT / "recipes/rewards/voice_commands.py")
ARMS = ("rl_verifier", "self_train", "best_of_n", "rl_cer", "sft")
LISTENING = ("rl_listening", "rl_verifier_listening")  # with --scorer


def grpo(start: Path, manifest: Path, out: Path, steps: int, reward: list[str], seed: int = 42, env=None) -> None:
    """GRPO for `steps` updates (a budget that does not depend on the host; its wall time is in the
    run's metrics), as the demo's stage 4 runs it."""
    if (out / "final").is_dir():
        return
    run("train", "grpo", "--config", str(ROOT / "recipes/configs/grpo_demo.yaml"), f"pretrain={start}",
        f"train_manifest={manifest}", f"output_dir={out}", "max_minutes=0", f"max_steps={steps}", f"seed={seed}",
        "save_steps=0", "eval_steps=0", "backend=ray", "distributed.actor_num_gpus_per_node=2",
        "distributed.zero_stage=2", "logging.progress_bar=false", *reward, threads=1, env=env)


def sft(start: Path, manifest: Path, out: Path, minutes: float) -> None:
    if (out / "final").is_dir():
        return
    cfg = yaml.safe_load((start.parent / "config.yaml").read_text())
    lr = cfg["optim"]["learning_rate"] * cfg["optim"]["min_lr_ratio"]
    run("train", "sft", "--config", str(ROOT / "recipes/configs/sft_demo.yaml"), f"pretrain={start}",
        f"train_manifest={manifest}", f"output_dir={out}", f"max_minutes={minutes}", "max_steps=1000000",
        "save_steps=0", "eval_steps=0", *FIXED_TIME_SFT, "optim.lr_scheduler=constant_with_warmup",
        "optim.lr_warmup_ratio=0", f"optim.learning_rate={lr}", "logging.progress_bar=false")


def labels(start: Path, pool: Path, out: Path, best_of: int = 0) -> float:
    if out.is_file() and (out.parent / (out.name + ".done")).is_file():
        return float((out.parent / (out.name + ".done")).read_text())
    extra = ["--best-of", str(best_of), "--reward", VERIFIER] if best_of else []
    seconds = run("data", "pseudo-label", str(start), str(pool), "--out", str(out), "--quiet", *extra)
    (out.parent / (out.name + ".done")).write_text(f"{seconds:.1f}")
    return seconds


def evaluate(model: Path, sets: dict[str, Path], out: Path) -> dict:
    if not (out / "report.json").is_file():
        args = ["eval", "--model", str(model), "--output", str(out), "--batch-size", "32", "--quiet",
                "--verifier", VERIFIER]
        for name, path in sets.items():
            args += ["--test-set", f"{name}={path}"]
        run(*args)
    return json.loads((out / "report.json").read_text())


def compare(a: Path, b: Path, out: Path) -> dict:
    if not (out / "report.json").is_file():
        run("eval", "--compare", str(a), str(b), "--output", str(out), "--quiet")
    return json.loads((out / "report.json").read_text())["compare"]


LABEL_FREE = ["rollout.reference_in_group=false", "optim.micro_train_batch_size=32"]  # 8 x 8 samples: 32 a rank


def train_arms(args, work: Path) -> dict[str, float]:
    """Each arm's model; returns the labelling seconds of the pseudo-label arms."""
    target, start, m, n = Path(args.target), Path(args.start), args.minutes, args.steps
    grpo(start, target / "pool.jsonl", work / "rl_verifier", n, [f"reward.file={VERIFIER}", "reward.terms=null", *LABEL_FREE])
    if args.scorer:  # the arms that listen: the acoustic term alone (no grammar), and beside the verifier
        grpo(start, target / "pool.jsonl", work / "rl_listening", n,
             ["reward.terms={acoustic: 1.0}", f"reward.term_options={{acoustic: {{scorer: {Path(args.scorer).resolve()}}}}}",
              *LABEL_FREE])
        grpo(start, target / "pool.jsonl", work / "rl_verifier_listening", n,
             [f"reward.file={VERIFIER}", "reward.terms=null", *LABEL_FREE],
             env={"VOICE_COMMANDS_SCORER": str(Path(args.scorer).resolve())})
    if args.rl_only:
        return {}
    seconds = {"self_train": labels(start, target / "pool.jsonl", work / "labels_greedy.jsonl"),
               "best_of_n": labels(start, target / "pool.jsonl", work / "labels_best_of_8.jsonl", best_of=8)}
    sft(start, work / "labels_greedy.jsonl", work / "self_train", m)
    sft(start, work / "labels_best_of_8.jsonl", work / "best_of_n", m)
    grpo(start, target / "pool_labelled.jsonl", work / "rl_cer", n,
         ["reward.terms={cer: 1.0, omission: 0.5, hallucination: 0.5, empty: 0.5}"])
    sft(start, target / "pool_labelled.jsonl", work / "sft", m)
    return seconds


def interval(c: dict | None) -> str:
    if not c:
        return "-"
    u = c["utterance"]
    lo, hi = (100 * x for x in u["relative_ci"])
    return f"{100 * u['relative']:+.1f}% [{lo:+.1f}, {hi:+.1f}] P={u['p_improvement']:.2f}"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--start", default="exp/demo_full_qwen2_audio/sft/best")
    p.add_argument("--target", default="data/target_domain")
    p.add_argument("--source", default="data/demo_corpus_3000")
    p.add_argument("--work", default="exp/bench_adapt")
    p.add_argument("--minutes", type=float, default=5.0, help="each SFT arm's wall time")
    p.add_argument("--steps", type=int, default=250, help="each RL arm's updates")
    p.add_argument("--scorer", help="an `asr-rl train scorer` folder: adds the arms that listen")
    p.add_argument("--rl-only", action="store_true", help="only the label-free RL arms (and the start)")
    args = p.parse_args()
    work, target = Path(args.work), Path(args.target)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    label_seconds = train_arms(args, work)
    sets = {"target_dev": target / "dev.jsonl", "target_test": target / "test.jsonl",
            "source_test_clean": Path(args.source) / "test_clean.jsonl", "nonspeech": target / "nonspeech.jsonl"}
    arms = [a for a in (*ARMS, *LISTENING) if (work / a / "final").is_dir()]
    models = {"start": Path(args.start), **{a: work / a / "final" for a in arms}}
    reports = {name: evaluate(path, sets, work / "eval" / name) for name, path in models.items()}
    pairs = [("start", a) for a in arms] + [p for p in (("self_train", "rl_verifier"), ("best_of_n", "rl_verifier"),
                                                         ("sft", "rl_cer"), ("rl_verifier", "rl_verifier_listening"))
                                            if p[0] in arms and p[1] in arms]
    comps = {(a, b): compare(work / "eval" / a, work / "eval" / b, work / "compare" / f"{b}_vs_{a}") for a, b in pairs}
    print(f"\nbench_adapt: RL {args.steps} updates, SFT {args.minutes} min an arm, from {args.start}; labelling s: {label_seconds}; "
          f"whole run {(time.perf_counter() - t0) / 60:.1f} min")
    print("| model | set | CER % | ins % | loops % | kw err % | verifier pass % | non-speech halluc % |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, rep in reports.items():
        for s, m in rep["test_sets"].items():
            print(f"| {name} | {s} | {_pct(m.get('cer'))} | {_pct(m.get('insertion_rate'))} | {_pct(m.get('loop_rate'))} | "
                  f"{_pct(m.get('keyword_error_rate'))} | {_pct(m.get('verifier_pass_rate'))} | "
                  f"{_pct(m.get('nonspeech_hallucination_rate'))} |")
    print("\n| B vs A | set | CER relative [95% CI] P(B better) |")
    print("|---|---|---|")
    for (a, b), c in comps.items():
        for s in ("target_dev", "target_test", "source_test_clean"):
            print(f"| {b} vs {a} | {s} | {interval(c['test_sets'].get(s))} |")
    (work / "summary.json").write_text(json.dumps({"label_seconds": label_seconds, "reports": reports,
                                                   "compare": {f"{b}_vs_{a}": c for (a, b), c in comps.items()}},
                                                  indent=1, default=str))


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


if __name__ == "__main__":
    main()
