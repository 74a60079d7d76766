"""`asr-rl data ...`: check, synth, pairs, judge-pairs and pseudo-label (the handlers and their parser).

As in cli.py, heavy imports happen inside the handlers, so that `asr-rl --help` and `data check`
start quickly.
"""
from __future__ import annotations

import argparse
import math
import sys


# what `data check` checks a preference manifest as (data/pairs.py `preference_kind`)
_PREFERENCE_KINDS = {"paired": "DPO pairs (`chosen`, `rejected`), as `train dpo` reads them",
                     "unpaired": "KTO examples (`completion`, `label`), as `train kto` reads them",
                     "text_pairs": "text preference pairs (`prompt`, `chosen`, `rejected`), as `train rm` and "
                                   "`train dpo prompt_data=` read them"}


def _data_check(args: argparse.Namespace) -> int:
    from asr_rl.data.manifest import sample_problems, scan_manifest
    from asr_rl.data.pairs import preference_kind, preference_problems
    from asr_rl.data.readers import ReadOptions

    if preference_kind(args.manifest) == "text_pairs":
        return _check_text_pairs(args.manifest)
    options = read_options(args)
    scan = scan_manifest(args.manifest, check_audio=not args.no_audio, min_duration=args.min_duration,
                         max_duration=args.max_duration, text_needed_by=None if args.unlabelled else
                         "training and evaluation (`--unlabelled` accepts lines without one, for RL)", options=options)
    kind = preference_kind(scan.path)
    langs = ", ".join(f"{k} {v}" for k, v in sorted(scan.languages.items())) or "none"
    print(f"manifest:   {scan.path}")
    print(f"format:     {scan.format} ({scan.format_reason})")
    if kind:
        print(f"checked as: {_PREFERENCE_KINDS[kind]} (from the keys of its first line)")
    print(f"utterances: {len(scan.utterances)}")
    print(f"hours:      {scan.hours:.3f}")
    print(f"languages:  {langs}")
    print(f"speakers:   {len(scan.speakers)}")
    if args.unlabelled:
        print(f"unlabelled: {len(scan.unlabelled)}")
    for note in scan.notes[: args.max_notes]:
        print(f"note: {note.at(scan.path)}: {note.message}")
    if len(scan.notes) > args.max_notes:
        print(f"note: ... {len(scan.notes) - args.max_notes} more notes")
    found = scan.problems + (preference_problems(scan.utterances, kind) if kind else [])
    if args.deep:  # decode every file: what only the samples show (NaN or inf, data cut short)
        found += sample_problems(scan.utterances)
    elif not args.no_audio:
        print("samples:    not decoded: NaN or inf samples and files cut short show only with --deep")
    bad = sorted(found, key=lambda p: p.line)
    problems = [(p.at(scan.path), p.message) for p in bad]
    if args.model:
        from asr_rl.models.codec import ResponseCodec
        from asr_rl.models.tokenizer import unwritable_chars, written_texts

        tokenizer = ResponseCodec.from_pretrained(args.model).tokenizer
        problems += [(where, f"characters the model ({args.model}) cannot write: {' '.join(chars)}")
                     for where, chars in unwritable_chars(tokenizer, written_texts(scan.utterances))]
        problems += _prompt_problems(args.model, tokenizer, scan)
    print(f"bad lines:  {len(problems)}")
    for where, message in problems:
        print(f"  {where}: {message}")
    if not scan.utterances and not scan.problems:
        print(f"  {scan.path}: the manifest holds no utterances")
        return 1
    return 1 if problems else 0


def _prompt_problems(model: str, tokenizer, scan) -> list[tuple[str, str]]:
    """What training and eval refuse before any model runs: a context list the prompt cannot hold
    (with room for the longest audio and eval's 96 new tokens), as (where, message)."""
    from asr_rl.models.facts import ModelFacts
    from asr_rl.models.tokenizer import require_prompts_fit, unwritable_chars

    # a list with characters the tokenizer cannot write is reported above, with those characters
    writable = [u for u in scan.utterances if not u.context or not unwritable_chars(tokenizer, [("", ", ".join(u.context))])]
    try:
        require_prompts_fit(writable, tokenizer, ModelFacts(model).prompt_limit, 96, f"the model {model}")
    except ValueError as e:
        where, _, message = str(e).partition(": ")[2].partition(": ")
        return [(where, message)]
    return []


def _check_text_pairs(path: str) -> int:
    from asr_rl.data.prompts import scan_preferences

    pairs, problems = scan_preferences(path)
    print(f"manifest:   {path}")
    print(f"checked as: {_PREFERENCE_KINDS['text_pairs']} (from the keys of its first line)")
    print(f"pairs:      {len(pairs)}")
    print(f"bad lines:  {len(problems)}")
    for p in problems:
        print(f"  {path}:{p.line}: {p.message}")
    if not pairs and not problems:
        print(f"  {path}: the file holds no pairs")
        return 1
    return 1 if problems else 0


def _data_synth(args: argparse.Namespace) -> int:
    from asr_rl.data.synth import synthesize

    langs = None if args.langs is None else tuple(x.strip() for x in args.langs.split(",") if x.strip())
    try:
        sizes = tuple(int(x) for x in args.context_sizes.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--context-sizes {args.context_sizes!r} must be integers separated by commas, "
                         "e.g. 0,10,100") from None
    summary = synthesize(args.out, args.domain, langs=langs, n_train=args.train, n_test=args.test, seed=args.seed,
                         workers=args.workers, progress=not args.quiet, context_sizes=sizes, n_nonspeech=args.nonspeech)
    for split, info in summary.items():
        print(f"{split:<12} {info['utterances']:>6} utterances  {info['hours']:.3f} h  {info['manifest']}")
    return 0


def _data_pairs(args: argparse.Namespace) -> int:
    from asr_rl.config import load_config
    from asr_rl.rewards.config import RewardConfig
    from asr_rl.trainer.recipes.pairs import build_pairs

    reward = load_config(RewardConfig, args.reward_config) if args.reward_config else None
    r = build_pairs(args.model, args.manifest, args.out, n=args.n, temperature=args.temperature,
                    max_new_tokens=args.max_new_tokens, mode=args.mode, margin=args.margin,
                    batch_size=args.batch_size, reward_cfg=reward, seed=args.seed)
    print(f"{r.pairs} pairs from {r.utterances} utterances ({r.tied} without a pair) in {r.seconds:.1f} s -> "
          f"{args.out}")
    return 0


def _data_pseudo_label(args: argparse.Namespace) -> int:
    from asr_rl.trainer.recipes.pseudo_label import dropped_path, pseudo_label

    r = pseudo_label(args.model, args.manifest, args.out, best_of=args.best_of, reward=args.reward, mode=args.mode,
                     temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
                     min_confidence=args.min_confidence, batch_size=args.batch_size, seed=args.seed,
                     device=args.device, dtype=args.dtype, progress=not args.quiet)
    print(f"pseudo-label: {r.summary()} -> {args.out}" + (f" (dropped: {dropped_path(args.out)})" if r.dropped else ""))
    if r.bad:  # named as `data check` names them; the rest was labelled
        print(f"bad lines:  {len(r.bad)}")
        for line in r.bad:
            print(f"  {line}")
        print(f"asr-rl: error: {len(r.bad)} line(s) of {args.manifest} could not be labelled (listed above); fix "
              "them and rerun: the lines already written are kept", file=sys.stderr)
        return 1
    return 0


def _data_judge_pairs(args: argparse.Namespace) -> int:
    from collections import Counter

    from asr_rl.data.judge_pairs import make_judge_pairs, read_domain_text
    from asr_rl.utils import write_jsonl

    sentences = read_domain_text(args.text)
    rows = make_judge_pairs(sentences, args.per_sentence, args.seed)
    write_jsonl(args.out, rows)
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(Counter(r["corruption"] for r in rows).items()))
    print(f"judge-pairs: {len(rows)} pairs from {len(sentences)} sentences ({kinds}) -> {args.out}")
    return 0


def add_data_commands(sub) -> None:
    data = sub.add_parser("data", help="manifests and the demo corpus").add_subparsers(dest="data_cmd", required=True)
    _add_check(data)
    _add_synth(data)


def _add_check(data) -> None:
    check = data.add_parser("check", help="validate a manifest: count, hours, languages, bad lines")
    check.add_argument("--manifest", required=True, help="a JSONL or NeMo manifest, a `datasets` folder "
                                                         "(save_to_disk) or parquet file/folder, a Kaldi/WeNet folder")
    add_read_options(check)
    check.add_argument("--no-audio", action="store_true", help="skip opening the audio files")
    check.add_argument("--unlabelled", action="store_true",
                       help="accept lines without `text` (unlabelled audio, which RL takes) and count them")
    check.add_argument("--deep", action="store_true",
                       help="decode every audio file (slower): NaN or infinite samples, data cut short")
    check.add_argument("--min-duration", type=float, default=0.0, help="lines shorter than this many seconds are bad")
    check.add_argument("--max-duration", type=float, default=30.0, help="lines longer than this many seconds are bad")
    check.add_argument("--max-notes", type=int, default=10, help="notes (not problems) printed at most")
    check.add_argument("--model", default=None, help="also report transcripts with characters this model's tokenizer "
                                                     "cannot write")
    check.set_defaults(func=_data_check)


def _add_synth(data) -> None:
    synth = data.add_parser("synth", help="synthesise the bilingual demo corpus offline (espeak-ng)")
    synth.add_argument("--out", required=True, help="the corpus folder to write (reused when it holds this exact corpus)")
    synth.add_argument("--domain", choices=["source", "target"], default="source",
                       help="target: a domain to adapt to (held-out accents, new voices, a telephone channel): an "
                            "unlabelled pool (its transcripts aside), dev, test and a non-speech set")
    synth.add_argument("--langs", default=None, help="en,zh (default), en or zh")
    synth.add_argument("--nonspeech", type=at_least(0, "non-speech clips"), default=None,
                       help="target: the non-speech test clips (default 150); source: clips where nobody speaks "
                            "labelled \"\" added to train (default 0: the supervised control for silence)")
    synth.add_argument("--train", type=at_least(1, "source: training lines; target: the pool's lines"), default=3000,
                       help="source: training lines; target: the pool's size")
    synth.add_argument("--test", type=at_least(1, "lines per test set"), default=200,
                       help="lines per test set (and dev)")
    synth.add_argument("--seed", type=at_least(0, "a seed"), default=1, help="seeds sentences, voices and noise")
    synth.add_argument("--workers", type=at_least(1, "synthesis processes"), default=None,
                       help="synthesis processes (default: the CPU count)")
    synth.add_argument("--context-sizes", default="", help="e.g. 0,10,100: context lists (contextual biasing) on "
                                                          "training lines at these sizes, and a copy of each test "
                                                          "set per size > 0 (<set>_ctx<N>.jsonl)")
    synth.add_argument("--quiet", action="store_true", help="no progress bar")
    synth.set_defaults(func=_data_synth)

    pairs = data.add_parser("pairs", help="DPO/KTO preference pairs from a model's own N-best lists, scored by "
                                          "the reward")
    pairs.add_argument("--model", required=True, help="the audio-LLM that samples (e.g. an SFT run's final)")
    pairs.add_argument("--manifest", required=True, help="the labelled utterances to sample N-best lists for")
    pairs.add_argument("--out", required=True, help="the pair file (JSONL) to write")
    pairs.add_argument("--n", type=at_least(2, "a pair compares two hypotheses of one utterance"), default=8,
                       help="hypotheses sampled per utterance (at least 2)")
    pairs.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    pairs.add_argument("--max-new-tokens", type=int, default=96, help="longest hypothesis, in tokens")
    pairs.add_argument("--mode", choices=["best_worst", "all"], default="best_worst", help="best_worst: one pair an utterance (its best and worst); all: every ordered pair")
    pairs.add_argument("--margin", type=float, default=0.0, help="keep pairs whose scores differ by more than this")
    pairs.add_argument("--batch-size", type=at_least(1, "utterances per batch"), default=8, help="utterances decoded together")
    pairs.add_argument("--reward-config", default=None, help="YAML of reward settings (terms, term_options, file, "
                                                             "remote_url); default: the built-in terms")
    pairs.add_argument("--seed", type=int, default=0, help="sampling seed")
    pairs.set_defaults(func=_data_pairs)
    _add_pseudo_label(data)
    judge = data.add_parser("judge-pairs", help="text pairs for a judge reward model (`train rm`): domain sentences "
                                                "against copies with recognition errors; no audio needed")
    judge.add_argument("--text", required=True, help="domain sentences: a text file (one a line) or a JSONL manifest "
                                                     "(its `text`, with each line's `context`)")
    judge.add_argument("--out", required=True, help="the pair file (JSONL: prompt, chosen, rejected, corruption)")
    judge.add_argument("--per-sentence", type=at_least(1, "pairs per sentence"), default=4, help="pairs made from each sentence (the corruption kinds in turn)")
    judge.add_argument("--seed", type=int, default=0, help="seeds the corruptions")
    judge.set_defaults(func=_data_judge_pairs)


# `ReadOptions` fields as `data check` flags (their defaults are ReadOptions' own)
_READ_FLAGS = {"format": "jsonl, nemo, datasets or kaldi (default: recognised from the path)",
               "audio_column": "the audio column or JSONL key (default: audio)",
               "text_column": "the transcript column, e.g. sentence (default: text)",
               "id_column": "the utterance-id column (default: id)",
               "language_column": "the language-code column (default: language)",
               "language": "the language of rows that give none, e.g. en"}


def add_read_options(parser) -> None:
    """`--format`, `--text-column`, ... (`ReadOptions`' fields) on `parser` (data check, eval)."""
    for name, text in _READ_FLAGS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", default=None, help=text)


def read_options(args: argparse.Namespace):
    """The `ReadOptions` the flags of `add_read_options` give (unset flags: its defaults)."""
    from asr_rl.data.readers import ReadOptions

    return ReadOptions(**{f: getattr(args, f) for f in _READ_FLAGS if getattr(args, f) is not None})


def _add_pseudo_label(data) -> None:
    pl = data.add_parser("pseudo-label", help="transcripts for (unlabelled) audio from a model: greedy, or the best "
                                              "of N under a reward; writes a manifest `train sft` takes")
    pl.add_argument("model", metavar="MODEL", help="the audio-LLM that transcribes (a model folder)")
    pl.add_argument("manifest", metavar="MANIFEST", help="lines with or without `text` (a line's own text is kept "
                                                         "as `reference_text`)")
    pl.add_argument("--out", required=True, help="the manifest to write (JSONL); an existing one is resumed: its ids "
                                                 "are skipped, a half-written last line rewritten")
    pl.add_argument("--best-of", type=at_least(1, "hypotheses per utterance; 1 = greedy"), default=1,
                    help="N >= 2: N hypotheses per utterance, the one --reward scores best is kept (default 1: "
                         "greedy)")
    pl.add_argument("--reward", default=None, help="with --best-of: builtin:<term>[=<weight>],... (e.g. "
                                                   "builtin:cer,fluency=0.2; on lines without text only the terms "
                                                   "that need no transcript apply), a .py reward file, or an "
                                                   "http(s):// reward server")
    pl.add_argument("--mode", choices=["sample", "beam"], default="sample",
                    help="with --best-of: N samples at --temperature (seeded per utterance id), or the beam N-best")
    pl.add_argument("--temperature", type=float, default=1.0, help="best-of-N sampling temperature")
    pl.add_argument("--top-p", type=float, default=1.0, help="best-of-N nucleus sampling")
    pl.add_argument("--min-confidence", type=float, default=None,
                    help="drop lines whose confidence (mean token log-prob of the label under the model, "
                         "temperature 1; 0 = certain) is below this; they go to OUT's .dropped.jsonl")
    pl.add_argument("--max-new-tokens", type=int, default=96, help="longest label, in tokens")
    pl.add_argument("--batch-size", type=at_least(1, "utterances per batch"), default=8, help="utterances decoded together")
    pl.add_argument("--seed", type=int, default=0, help="sampling seed (per utterance id and sample)")
    pl.add_argument("--device", default="auto", help="cpu, cuda or auto")
    pl.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="weights dtype (auto: as the checkpoint was saved)")
    pl.add_argument("--quiet", action="store_true", help="no progress bar")
    pl.set_defaults(func=_data_pseudo_label)


def at_least(low: int, why: str):
    """An argparse `type`: an int of at least `low` (a smaller one is a usage error, exit 2)."""
    def parse(text: str) -> int:
        value = int(text)  # not an int: argparse's "invalid int value"
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low} ({why}), got {value}")
        return value

    parse.__name__ = "int"
    return parse




def seconds_at_least(low: float):
    """An argparse `type`: a finite number of seconds of at least `low` (nan, inf or less is a usage
    error, exit 2)."""
    def parse(text: str) -> float:
        value = float(text)  # not a number: argparse's "invalid float value"
        if not math.isfinite(value) or value < low:
            raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= {low:g}, got {text}")
        return value

    parse.__name__ = "float"
    return parse
