"""Benchmark: adapting to a new domain from unlabelled audio (issues 39, 46), every arm budgeted in updates.

    make demo                                   # the SFT start and its acoustic scorer
    asr-rl data synth --domain target --out data/target_domain --train 800 --test 500 --seed 7
    python scripts/bench_adapt.py --start exp/demo_full_qwen2_audio/sft/best --target data/target_domain \
        --source data/demo_corpus_3000 --scorer exp/scorer/demo/final --work exp/bench_adapt --steps 250 \
        --sft-steps 1500 --seeds 42,2 [--arms rl_verifier_listening,self_train,...]

From the same start and the same target-domain pool (held-out English accents and new Mandarin voices
through a telephone line; about 10% of its clips hold nobody speaking, unmarked), each RL arm runs
`--steps` updates (the demo's stage 4 settings; wall time in the run's metrics) and each SFT arm
`--sft-steps`, once per seed in `--seeds` (the intervals pool both seeds' utterances); `--kl` anchors
every RL arm to the start (one work folder per value: choose it on the target dev set):
without transcripts
  rl_verifier             GRPO rewarded by recipes/rewards/voice_commands.py: the command grammar,
                          loops, speaking rate and the silence term (a voice-activity detector);
  rl_verifier_listening   the same with the acoustic term beside it (`--scorer`: how well the
                          hypothesis fits the audio under a CTC scorer on the frozen encoder);
  rl_listening            what a user without a grammar has: the acoustic and silence terms;
  rl_consensus            no grammar and nothing trained beside the policy: consensus (each sample's
                          agreement with the other samples of its utterance, 1 - mean normalised
                          edit distance) and the silence term (test-time RL's reward, TTRL);
  rl_listening_judge      the same with a judge beside them (`--judge`: a reward model trained on
                          the source transcripts against corrupted copies, `data judge-pairs`);
  rl_listening_home       the same as rl_listening, with the labelled source corpus drawn beside the pool
                          (train_manifest_probs, source lines scored by 1 - CER too) and a KL anchor
                          to the start;
  self_train              greedy pseudo-labels of the pool, then SFT on them;
  best_of_n               the best of 8 samples under the verifier with the acoustic term, then SFT;
  suta                    entropy minimisation on the pool (SUTA, Lin et al. 2022, arXiv:2203.14222):
                          the loop with zero advantages and the entropy term at -1 (its own
                          samples' token entropy minimised); SUTA's class-confusion term left out;
  rerank                  no training: 8 samples per utterance at test time, the one the verifier
                          with the acoustic term scores best (`asr-rl eval --rerank`);
  rerank_consensus        the same by consensus and silence: MBR decoding, rl_consensus's control;
with the pool's transcripts (`--labelled`)
  rl_cer                  GRPO with 1 - CER and the failure terms (the demo's reward);
  sft                     SFT on the transcripts.
The labelling time of self_train and best_of_n is reported apart. SFT runs at the start's floor
rate (constant), as the continuation control of bench_pretrained.py. Every model is evaluated on
the target dev and test sets, the source test_clean (forgetting) and the non-speech set, with the
verifier's pass rate, and compared with `asr-rl eval --compare` (paired bootstrap). `--vad-filter`
evaluates every model, the start included, behind `asr-rl eval --vad-filter` (the silence term's
detector in front of the model), in <work>/eval_vad: run it on a --work that holds trained arms and
only the evaluations are new. `--pool-set` also evaluates every model on the pool it adapted on, with
the transcripts kept aside (pool_labelled.jsonl): RL on the pool is then test-time RL, and this is its
transductive result, beside reranking the pool at the start. `--rerank-after` also reranks 8 samples of
each RL arm's model by that arm's own reward (`<arm>+rerank`), beside greedy after RL and reranking at
the start; the tables give each model's real-time factor (its decoding cost). `--adapt-on dev|test`
adapts on that set's audio instead of the pool (test-time RL with its recipe's config,
recipes/configs/grpo_test_time.yaml: choose settings on dev, report on test),
and `--save-every N` evaluates every N-th update's checkpoint: the learning curve, and which checkpoint
the verifier's mean reward (no transcript read) would choose against dev CER's choice.
"""
from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import yaml
from bench_common import FIXED_TIME_SFT, interval, run
from bench_spread import curve_point, pct, print_curves, print_dynamics, print_voices, split_sets

ROOT = Path(__file__).resolve().parents[1]
VERIFIER = str(ROOT / "recipes/rewards/voice_commands.py")
RL_ARMS = ("rl_verifier", "rl_verifier_listening", "rl_listening", "rl_consensus", "rl_listening_judge",
           "rl_listening_home", "suta")
SFT_ARMS = ("self_train", "best_of_n")
LABELLED = ("rl_cer", "sft")
RERANK = {"rerank": VERIFIER, "rerank_consensus": "builtin:consensus=1,silence=1"}
# --rerank-after: an RL arm's model reranked by its own reward (RL and reranking together)
OWN_REWARD = {"rl_verifier": VERIFIER, "rl_verifier_listening": VERIFIER, "rl_consensus": RERANK["rerank_consensus"]}
ARMS = (*RL_ARMS, *SFT_ARMS, *RERANK, *LABELLED)
LABEL_FREE = ["rollout.reference_in_group=false", "optim.micro_train_batch_size=32"]  # 8 x 8 samples: 32 a rank


def rl_run(start: Path, manifest: str, out: Path, steps: int, reward: list[str], seed: int = 42, env=None,
         save_every: int = 0, config: str = "grpo_demo.yaml") -> None:
    """GRPO for `steps` updates (a budget that does not depend on the host; its wall time is in the
    run's metrics), as the demo's stage 4 runs it (`config`: test-time RL runs its recipe's,
    grpo_test_time.yaml, whose rollouts hear the audio unaugmented); `save_every` > 0 keeps a
    checkpoint every that many updates (the learning curve)."""
    if (out / "final").is_dir():
        return
    run("train", "grpo", "--config", str(ROOT / "recipes/configs" / config), f"pretrain={start}",
        f"train_manifest={manifest}", f"output_dir={out}", "max_minutes=0", f"max_steps={steps}", f"seed={seed}",
        f"save_steps={save_every}", "max_ckpt_num=1000", "eval_steps=0", "backend=ray", "distributed.actor_num_gpus_per_node=2",
        "distributed.zero_stage=2", "logging.progress_bar=false", *reward, threads=1, env=env)


def sft(start: Path, manifest: Path, out: Path, steps: int, seed: int) -> None:
    if (out / "final").is_dir():
        return
    cfg = yaml.safe_load((start.parent / "config.yaml").read_text())
    lr = cfg["optim"]["learning_rate"] * cfg["optim"]["min_lr_ratio"]
    run("train", "sft", "--config", str(ROOT / "recipes/configs/sft_demo.yaml"), f"pretrain={start}",
        f"train_manifest={manifest}", f"output_dir={out}", "max_minutes=0", f"max_steps={steps}", f"seed={seed}",
        "save_steps=0", "eval_steps=0", *FIXED_TIME_SFT, "optim.lr_scheduler=constant_with_warmup",
        "optim.lr_warmup_ratio=0", f"optim.learning_rate={lr}", "logging.progress_bar=false")


def labels(start: Path, pool: Path, out: Path, best_of: int = 0, env=None) -> float:
    if out.is_file() and (out.parent / (out.name + ".done")).is_file():
        return float((out.parent / (out.name + ".done")).read_text())
    extra = ["--best-of", str(best_of), "--reward", VERIFIER] if best_of else []
    seconds = run("data", "pseudo-label", str(start), str(pool), "--out", str(out), "--quiet", *extra, env=env)
    (out.parent / (out.name + ".done")).write_text(f"{seconds:.1f}")
    return seconds


def evaluate(model: Path, sets: dict[str, Path], out: Path, extra: list[str] = (), env=None) -> dict:
    if not (out / "report.json").is_file():
        args = ["eval", "--model", str(model), "--output", str(out), "--batch-size", "32", "--quiet",
                "--verifier", VERIFIER, *extra]
        for name, path in sets.items():
            args += ["--test-set", f"{name}={path}"]
        run(*args, env=env)
    return json.loads((out / "report.json").read_text())


def compare(a: Path, b: Path, out: Path) -> dict:
    if not (out / "report.json").is_file():
        run("eval", "--compare", str(a), str(b), "--output", str(out), "--quiet")
    return json.loads((out / "report.json").read_text())["compare"]


def train_arm(arm: str, args, work: Path, seed: int) -> float | None:
    """Train `arm` with `seed` (the folder `<arm>_s<seed>`); the labelling seconds of a pseudo-label arm."""
    start, n, scorer = Path(args.start), args.steps, str(Path(args.scorer).resolve())
    out, pool, labelled = work / f"{arm}_s{seed}", args.adapt_manifest, args.adapt_labelled
    listening = {"VOICE_COMMANDS_SCORER": scorer}
    terms = f"reward.term_options={{acoustic: {{scorer: {scorer}}}}}"
    kl = f"algo.init_kl_coef={args.kl}"
    grpo = functools.partial(rl_run, save_every=args.save_every,
                             config="grpo_demo.yaml" if args.adapt_on == "pool" else "grpo_test_time.yaml")
    if arm == "rl_verifier":
        grpo(start, pool, out, n, [f"reward.file={VERIFIER}", "reward.terms=null", *LABEL_FREE, kl], seed)
    elif arm == "rl_verifier_listening":
        grpo(start, pool, out, n, [f"reward.file={VERIFIER}", "reward.terms=null", *LABEL_FREE, kl], seed,
             env=listening)
    elif arm == "rl_listening":
        grpo(start, pool, out, n, ["reward.terms={acoustic: 1.0, silence: 1.0}", terms, *LABEL_FREE, kl], seed)
    elif arm == "rl_consensus":
        grpo(start, pool, out, n, ["reward.terms={consensus: 1.0, silence: 1.0}", *LABEL_FREE, kl], seed)
    elif arm == "rl_listening_judge":
        judge = str(Path(args.judge).resolve())
        grpo(start, pool, out, n, ["reward.terms={acoustic: 1.0, silence: 1.0, plausibility: 1.0}", *LABEL_FREE, kl,
                                   f"reward.term_options={{acoustic: {{scorer: {scorer}}}, plausibility: {{model: {judge}}}}}"],
             seed)
    elif arm == "rl_listening_home":
        home = f"{Path(args.source) / 'train.jsonl'},{pool}"
        grpo(start, home, out, n, ["reward.terms={cer: 1.0, acoustic: 1.0, silence: 1.0}", terms, *LABEL_FREE,
                                   "train_manifest_probs=[0.3, 0.7]", kl], seed)
    elif arm == "suta":  # zero advantages (a constant reward, every group kept): only the entropy term acts
        grpo(start, pool, out, n, ["reward.terms={repetition: 0.0}", "rollout.dynamic_filtering=false",
                                   "rollout.n_samples_per_prompt=2", "rollout.reference_in_group=false",
                                   "optim.micro_train_batch_size=8", "algo.entropy_coef=-1.0"], seed)
    elif arm in SFT_ARMS:
        best_of = 8 if arm == "best_of_n" else 0
        seconds = labels(start, Path(pool), work / f"labels_{arm}.jsonl", best_of, env=listening)
        sft(start, work / f"labels_{arm}.jsonl", out, args.sft_steps, seed)
        return seconds
    elif arm == "rl_cer":
        grpo(start, labelled, out, n,
             ["reward.terms={cer: 1.0, omission: 0.5, hallucination: 0.5, empty: 0.5}"], seed)
    elif arm == "sft":
        sft(start, Path(labelled), out, args.sft_steps, seed)
    return None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--start", default="exp/demo_full_qwen2_audio/sft/best")
    p.add_argument("--target", default="data/target_domain")
    p.add_argument("--source", default="data/demo_corpus_3000")
    p.add_argument("--scorer", default="exp/scorer/demo/final",
                   help="an `asr-rl train scorer` folder ('': none; `rerank` then scores by the verifier alone)")
    p.add_argument("--judge", default="exp/judge/rm/final", help="rl_listening_judge: an `asr-rl train rm` folder")
    p.add_argument("--work", default="exp/bench_adapt")
    p.add_argument("--steps", type=int, default=250, help="each RL arm's updates")
    p.add_argument("--sft-steps", type=int, default=1500, help="each SFT arm's steps (16 utterances a step)")
    p.add_argument("--seeds", default="42,2", help="each trained arm once per seed")
    p.add_argument("--kl", type=float, default=0.0,
                   help="every RL arm but suta: the KL coefficient to the start (choose it on target dev)")
    p.add_argument("--arms", default=",".join(a for a in ARMS if a not in LABELLED), help=f"of {', '.join(ARMS)}")
    p.add_argument("--vad-filter", action="store_true",
                   help="evaluate every model behind `asr-rl eval --vad-filter` (in <work>/eval_vad; trained arms "
                        "already there are not trained again)")
    p.add_argument("--pool-set", action="store_true",
                   help="evaluate every model on the pool too, its transcripts kept aside (pool_labelled.jsonl)")
    p.add_argument("--rerank-after", action="store_true",
                   help="also rerank 8 samples of each RL arm's model by its own reward (<arm>+rerank)")
    p.add_argument("--adapt-on", choices=("pool", "dev", "test"), default="pool",
                   help="the target audio the arms adapt on, its transcripts removed: the pool (inductive: dev and "
                        "test are other voices), or the dev or test audio itself (test-time RL, transductive: choose "
                        "settings adapting on dev, report adapting on test); rl_cer and sft take that audio's transcripts")
    p.add_argument("--save-every", type=int, default=0,
                   help="RL arms keep a checkpoint every N updates, each evaluated on target dev and test: the "
                        "learning curve, and the checkpoint a label-free criterion chooses against dev CER's choice")
    p.add_argument("--summary-only", action="store_true",
                   help="train and decode nothing: the tables of the models and evaluations already there")
    args = p.parse_args()
    work, target, seeds = Path(args.work), Path(args.target), [int(x) for x in args.seeds.split(",")]
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        raise SystemExit(f"unknown arm(s) {', '.join(unknown)}; valid: {', '.join(ARMS)}")
    work.mkdir(parents=True, exist_ok=True)
    args.adapt_manifest, args.adapt_labelled = adapt_manifests(target, args.adapt_on, work)
    t0 = time.perf_counter()
    sets = {"target_dev": target / "dev.jsonl", "target_test": target / "test.jsonl",
            "source_test_clean": Path(args.source) / "test_clean.jsonl", "nonspeech": target / "nonspeech.jsonl"}
    if args.pool_set and args.adapt_on == "pool":  # adapting on dev or test, that set is the pool's
        sets["pool"] = target / "pool_labelled.jsonl"
    # reranking by the verifier listens too when a scorer is given ('': the verifier alone, rl_verifier's reward)
    listening = {"VOICE_COMMANDS_SCORER": str(Path(args.scorer).resolve())} if args.scorer else {}
    evals, gate = (work / "eval_vad", ["--vad-filter"]) if args.vad_filter else (work / "eval", [])
    label_seconds, reports = {}, {"start": evaluate(Path(args.start), sets, evals / "start", gate)}
    curves: dict[str, list[dict]] = {}
    for seed in seeds:
        for arm in arms:
            name = f"{arm}_s{seed}"
            if args.summary_only:
                for done in (name, f"{arm}+rerank_s{seed}"):
                    if (evals / done / "report.json").is_file():
                        reports[done] = json.loads((evals / done / "report.json").read_text())
                if args.save_every and name in reports and arm in RL_ARMS:
                    curves[name] = curve(work / name, sets, evals, name, gate, reports[name], args.steps, decode=False)
                continue
            if arm in RERANK:
                reports[name] = evaluate(Path(args.start), sets, evals / name,
                                         ["--rerank", "8", "--reward", RERANK[arm], "--seed", str(seed), *gate],
                                         env=listening)
                continue
            seconds = train_arm(arm, args, work, seed)
            if seconds is not None:
                label_seconds[arm] = seconds
            reports[name] = evaluate(work / name / "final", sets, evals / name, gate)
            if args.save_every and arm in RL_ARMS:
                curves[name] = curve(work / name, sets, evals, name, gate, reports[name], args.steps)
            if args.rerank_after and arm in OWN_REWARD:
                both = f"{arm}+rerank_s{seed}"
                reports[both] = evaluate(work / name / "final", sets, evals / both,
                                         ["--rerank", "8", "--reward", OWN_REWARD[arm], "--seed", str(seed), *gate],
                                         env=listening)
    summarise(args, evals, reports, label_seconds, seeds, arms, (time.perf_counter() - t0) / 60)
    if curves:
        print_curves(curves, reports["start"])
    print_dynamics(work, [f"{a}_s{s}" for s in seeds for a in arms if a in RL_ARMS])
    print_voices(evals, ["start", *arms], seeds)


def adapt_manifests(target: Path, split: str, work: Path) -> tuple[str, str]:
    """The manifest the arms adapt on (no transcripts) and the same audio with them (rl_cer, sft)."""
    if split == "pool":
        return str(target / "pool.jsonl"), str(target / "pool_labelled.jsonl")
    from asr_rl.data.synth.target import POOL_FIELDS

    rows = [json.loads(line) for line in (target / f"{split}.jsonl").read_text().splitlines() if line.strip()]
    out = work / f"adapt_{split}.jsonl"
    for r in rows:  # an audio path is relative to its manifest's folder, and the copy lives elsewhere
        r["audio"] = str((target / r["audio"]).resolve())
    out.write_text("".join(json.dumps({k: r[k] for k in POOL_FIELDS if k in r}, ensure_ascii=False) + "\n"
                           for r in rows))
    return str(out), str(target / f"{split}.jsonl")


def curve(run_dir: Path, sets: dict, evals: Path, name: str, gate: list[str], final: dict,
          steps: int, decode: bool = True) -> list[dict]:
    """Each kept checkpoint of an RL run on target dev and test (`<name>@<step>`; the last is `final`),
    with the verifier's mean reward on each (label-free: it reads no transcript); `decode` False:
    only the checkpoints already evaluated."""
    points = []
    for ck in sorted((run_dir / "checkpoints").glob("step_*")):
        step = int(ck.name.split("_")[1])
        out = evals / f"{name}@{step}"
        if step != steps and not decode and not (out / "report.json").is_file():
            continue
        rep = final if step == steps else evaluate(ck, {k: sets[k] for k in ("target_dev", "target_test")}, out, gate)
        points.append({"step": step, **curve_point(rep)})
    return points


def summarise(args, evals: Path, reports: dict, label_seconds: dict, seeds: list[int], arms: list[str],
              minutes: float) -> None:
    """Tables of each model's metrics and of paired comparisons, pooled over seeds (`pool_compare`);
    `evals`: the folder of the evaluations (`<work>/eval`, or `eval_vad` behind the gate)."""
    print(f"\nbench_adapt: RL {args.steps} updates, SFT {args.sft_steps} steps an arm, seeds {seeds}, from "
          f"{args.start}; labelling s: {label_seconds}; whole run {minutes:.1f} min")
    print("| model | set | CER % | ins % | loops % | kw err % | verifier pass % | non-speech halluc % | RTF |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, rep in reports.items():
        for s, m in rep["test_sets"].items():
            print(f"| {name} | {s} | {pct(m.get('cer'))} | {pct(m.get('insertion_rate'))} | {pct(m.get('loop_rate'))} | "
                  f"{pct(m.get('keyword_error_rate'))} | {pct(m.get('verifier_pass_rate'))} | "
                  f"{pct(m.get('nonspeech_hallucination_rate'))} | {m.get('rtf') or 0:.3f} |")
    print("\n| model | target test CER % en / zh | keyword error % (target test): digits en / zh, names en / zh |")
    print("|---|---|---|")
    for name, rep in reports.items():
        per = rep["test_sets"]["target_test"].get("per_language") or {}
        kinds = keyword_kinds(evals / name)
        print(f"| {name} | {pct((per.get('en') or {}).get('cer'))} / {pct((per.get('zh') or {}).get('cer'))} | "
              + " / ".join(pct(kinds.get(k)) for k in ("digit_en", "digit_zh", "name_en", "name_zh")) + " |")
    main_arm = "rl_verifier_listening"
    pairs = [("start", a) for a in arms] + [(c, main_arm) for c in ("self_train", "best_of_n", "suta", "rerank", "rl_verifier")
                                            if c in arms and main_arm in arms and c != main_arm]
    pairs += [(c, a) for c, a in (("rerank", "rl_verifier"), ("rerank_consensus", "rl_consensus"))
              if c in arms and a in arms]
    if args.rerank_after:  # RL + reranking against greedy after RL and against reranking at the start
        pairs += [(a, f"{a}+rerank") for a in arms if a in OWN_REWARD]
        pairs += [(c, f"{a}+rerank") for c, a in (("rerank", "rl_verifier"), ("rerank_consensus", "rl_consensus"))
                  if c in arms and a in arms]
    split_sets(evals)
    comps = {}
    for a, b in pairs:
        comps[(a, b)] = pool_compare(evals, a, b, seeds)
    print("\n| B vs A | set | CER relative [95% CI] P(B better), seeds pooled | each seed |")
    print("|---|---|---|---|")
    for (a, b), c in comps.items():
        for s in ("target_dev", "target_test", "target_test_zh", "source_test_clean", "pool", "pool_speech"):
            runs = ", ".join("-" if r is None else f"{100 * r:+.1f}%" for r in (c.get(s) or {}).get("runs", []))
            print(f"| {b} vs {a} | {s} | {interval(c.get(s))} | {runs} |")
    (evals / "summary.json").write_text(json.dumps({"label_seconds": label_seconds, "reports": reports,
                                                   "compare": {f"{b}_vs_{a}": c for (a, b), c in comps.items()}},
                                                  indent=1, default=str))


def keyword_kinds(eval_folder: Path, name: str = "target_test") -> dict[str, float]:
    """Keyword error rate by kind on a set: `digit` (phone numbers, times, amounts: number words or
    Chinese numerals), `name` (the grammars' contacts), per language: the share of such keywords the
    hypothesis misses."""
    from asr_rl.data.synth import grammar_en, grammar_zh
    from asr_rl.rewards.normalize import keyword_hits

    names = set(grammar_en.NAMES) | set(grammar_zh.NAMES)
    numbers = {w for n in range(100) for w in grammar_en.number_words(n).split()} | {"oh"}
    zh_digits = set("零一二两三四五六七八九十百点半")
    counts: dict[str, list[int]] = {}
    for line in (eval_folder / f"{name}.hyps.jsonl").read_text().splitlines():
        r = json.loads(line)
        for k in r["keywords"]:
            kind = ("name" if k in names else "digit" if (set(k.split()) <= numbers or set(k) <= zh_digits)
                    else None)
            if kind:
                c = counts.setdefault(f"{kind}_{r['language']}", [0, 0])
                c[0] += 1 - keyword_hits(r["hypothesis"], [k])
                c[1] += 1
    return {k: miss / n for k, (miss, n) in sorted(counts.items())}


def pool_compare(evals: Path, a: str, b: str, seeds: list[int]) -> dict:
    """B against A on each set, both seeds' utterances in one paired bootstrap (an utterance of seed
    s is paired with itself under A's seed-s model; the start is one model for every seed)."""
    from asr_rl.evaluation.compare import pooled_compare

    def folder(arm, seed):
        return evals / (arm if arm == "start" else f"{arm}_s{seed}")

    pairs = [(folder(a, s), folder(b, s)) for s in seeds if (folder(a, s) / "report.json").is_file()
             and (folder(b, s) / "report.json").is_file()]
    return pooled_compare(pairs) if pairs else {}



if __name__ == "__main__":
    main()
