"""`asr-rl` command line: parse, load config, call one function (docs/commands.md).

Heavy imports (torch, transformers, ray, ...) happen inside the command functions so that
`asr-rl --help` and `asr-rl data check` start quickly.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

from asr_rl.cli_data import add_data_commands, add_read_options, at_least, read_options, seconds_at_least
from asr_rl.utils import Deferred, setup_logging

log = logging.getLogger("asr_rl.cli")


def _model_info(args: argparse.Namespace) -> int:
    import json

    from asr_rl.models.info import format_info, model_info

    info = model_info(args.path)
    print(json.dumps(info, indent=1, ensure_ascii=False) if args.json else format_info(info))
    return 0


def _model_init(args: argparse.Namespace) -> int:
    from asr_rl.models.builders import init_model

    out = init_model(args.arch, args.size, args.tokenizer_from, args.out, seed=args.seed, encoder=args.encoder,
                     tokenizer=args.tokenizer)
    print(f"wrote {args.arch} ({args.size}) to {out}")
    return 0


def _preference_commands() -> dict[str, list[str]]:
    """The `train` commands of the preference recipe and the presets each applies: `dpo` trains on
    pairs (`loss_type` picks the paired loss), and every unpaired loss is a command of its own
    (`train kto`), from the registry's `PreferenceSpec.paired`."""
    from asr_rl.algos.preference_losses import PREFERENCE_LOSSES

    return {"dpo": [], **{name: [f"loss_type={name}"] for name in PREFERENCE_LOSSES.where(paired=False)}}


def _train_commands() -> list[str]:
    from asr_rl.trainer.recipes.rl import PRESETS

    return ["sft", *PRESETS, *_preference_commands(), "rm", "scorer"]


def train_config(algo: str, config: str | None, overrides: list[str]):
    """(the loaded config, the function that trains with it) of `asr-rl train ALGO`: what a command
    line means, checked (unknown keys, bad values) before anything runs."""
    from asr_rl.config import load_config

    preference = _preference_commands()
    if algo == "sft":
        from asr_rl.trainer.configs.rl import SFTConfig
        from asr_rl.trainer.recipes.presets import load_with_checkpoint_presets
        from asr_rl.trainer.recipes.sft import train_sft

        return load_with_checkpoint_presets(SFTConfig, "sft", config, overrides), train_sft
    if algo in preference:
        from asr_rl.trainer.configs.preference import DPOConfig
        from asr_rl.trainer.recipes.dpo import train_dpo

        return load_config(DPOConfig, config, overrides, presets=preference[algo]), train_dpo
    if algo == "rm":
        from asr_rl.trainer.configs.preference import RMConfig
        from asr_rl.trainer.recipes.rm import train_rm

        return load_config(RMConfig, config, overrides), train_rm
    if algo == "scorer":
        from asr_rl.trainer.recipes.scorer import ScorerConfig, train_scorer

        return load_config(ScorerConfig, config, overrides), train_scorer
    from asr_rl.trainer.recipes.rl import load_rl_config, run_rl

    return load_rl_config(algo, config, overrides), lambda cfg: run_rl(cfg, algo)


def _train(args: argparse.Namespace) -> int:
    cfg, train = train_config(args.algo, args.config, args.overrides)
    out = train(cfg)
    print(f"final model: {out}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from asr_rl.evaluation.evaluate import check_num_beams, parse_test_sets, run_eval
    from asr_rl.evaluation.verifier import verifier_from_args

    if (args.model is None) == (args.compare is None):
        raise ValueError("asr-rl eval takes --model DIR, or --compare A B (model or eval output folders)")
    check_num_beams(args.num_beams)
    sets, contexts = parse_test_sets(args.test_set or [], args.context_file or [])
    verifier = verifier_from_args(args.verifier, args.verifier_pass)
    if args.compare:
        from asr_rl.evaluation.compare import run_compare

        if args.rerank is not None or args.vad_filter:
            raise ValueError("--rerank and --vad-filter decode a --model; --compare two eval folders of such "
                             "decodes instead")

        run_compare(*args.compare, test_sets=sets or None, output=args.output, n_resamples=args.resamples,
                    seed=args.seed, eval_kwargs=dict(batch_size=args.batch_size, num_beams=args.num_beams,
                                                     device=args.device, max_new_tokens=args.max_new_tokens,
                                                     progress=not args.quiet, dtype=args.dtype,
                                                     contexts=contexts, options=read_options(args)),
                    verifier=verifier)
        return 0
    if not sets:
        raise ValueError("asr-rl eval --model needs at least one --test-set NAME=PATH.jsonl")
    report = run_eval(args.model, sets, output=args.output, batch_size=args.batch_size, num_beams=args.num_beams,
                      device=args.device, max_new_tokens=args.max_new_tokens, progress=not args.quiet,
                      dtype=args.dtype, contexts=contexts, verifier=verifier, options=read_options(args),
                      decode=_decode(args))
    failed = [name for name, m in report.items() if m.failed and not m.utterances]
    if failed:  # a table of "-" is not a result: the caller's script must see it
        print(f"asr-rl: error: every utterance of {', '.join(failed)} failed (their lines and causes are in the "
              "warnings above)", file=sys.stderr)
        return 1
    return 0


def _decode(args: argparse.Namespace):
    """eval's `decode`: greedy or beam (None), `--rerank`'s, either behind `--vad-filter`'s gate."""
    rerank = _rerank(args)
    if not args.vad_filter:
        if args.vad_min_speech is not None:
            raise ValueError("--vad-min-speech sets the gate of --vad-filter: give --vad-filter too")
        return rerank
    import dataclasses

    from asr_rl.evaluation.vad_filter import VadFilter

    gate = VadFilter(rerank, args.num_beams)  # the silence term's min_speech unless --vad-min-speech
    return gate if args.vad_min_speech is None else dataclasses.replace(gate, min_speech=args.vad_min_speech)


def _rerank(args: argparse.Namespace):
    """`--rerank N --reward SPEC` (both or neither): eval's `decode`, N samples reranked by the reward
    (trainer/recipes/rerank.py)."""
    if (args.rerank is None) != (args.reward is None):
        raise ValueError("--rerank N and --reward SPEC go together: N samples an utterance, the one SPEC scores "
                         "best kept")
    if args.rerank is None:
        return None
    if args.num_beams != 1:
        raise ValueError("--rerank samples; --num-beams is for greedy/beam decoding: give one of them")
    import functools

    from asr_rl.trainer.recipes.rerank import Rerank, rerank_transcribe

    return functools.partial(rerank_transcribe, Rerank(args.rerank, args.reward, args.temperature, args.seed))


def _report(args: argparse.Namespace) -> int:
    from asr_rl.evaluation.report import write_report

    path = write_report(args.runs, args.output)
    print(path.read_text(encoding="utf-8"))
    return 0


def _reward_serve(args: argparse.Namespace) -> int:
    from asr_rl.rewards.server import serve

    serve(args.reward, host=args.host, port=args.port, token=args.token or os.environ.get("ASR_RL_REWARD_TOKEN"))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asr-rl", description="RL fine-tuning for LLM-based speech recognition")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for add_commands in (add_data_commands, _add_model_commands, _add_run_commands, _add_reward_commands):
        add_commands(sub)
    return parser


def _builders():
    from asr_rl.models import builders  # imports the families (torch): only when a help text is read

    return builders


def _add_model_commands(sub) -> None:
    model = sub.add_parser("model", help="model folders").add_subparsers(dest="model_cmd", required=True)
    init = model.add_parser("init", help="a new audio-LLM (pretrained or random encoder) with an offline tokenizer")
    # the families are the registry's (models/families/); unknown names fail there, naming the valid ones
    init.add_argument("--arch", default="qwen2_audio", help=Deferred(lambda: _builders().arch_help()))
    init.add_argument("--encoder", default="default", help=Deferred(lambda: _builders().encoder_help()))
    init.add_argument("--size", default="tiny", help="tiny | small; tiny-real (qwen3_asr, qwen2_audio, qwen2_5_omni: "
                                                     "tiny on the released BPE and ids); qwen3_asr also 0.6b | 1.7b "
                                                     "(the real dimensions and vocabulary, random weights)")
    init.add_argument("--tokenizer-from", required=True, nargs="+", help="manifest(s) whose texts make the vocabulary")
    init.add_argument("--tokenizer", default=None, choices=["char", "qwen"],
                      help="char: characters of --tokenizer-from's texts; qwen: Qwen's released byte-level BPE "
                           "(qwen3_asr, qwen2_audio, qwen2_5_omni), built offline. Default: qwen for tiny-real, "
                           "0.6b and 1.7b, char otherwise")
    init.add_argument("--out", required=True, help="the model folder to write")
    init.add_argument("--seed", type=int, default=0, help="seeds the random weights")
    init.set_defaults(func=_model_init)
    info = model.add_parser("info", help="family, sizes, what is frozen by default, the prompt one utterance gets")
    info.add_argument("path", metavar="DIR", help="a model folder")
    info.add_argument("--json", action="store_true", help="print JSON instead of text")
    info.set_defaults(func=_model_info)


def _add_run_commands(sub) -> None:
    """train, eval and report."""
    train = sub.add_parser("train", help="sft | grpo | ppo | dpo | kto | rm | scorer; then --config FILE and key=value "
                                         "overrides")
    train.add_argument("algo", metavar="ALGO", choices=Deferred(_train_commands),
                       help=Deferred(lambda: " | ".join(_train_commands())))
    train.add_argument("--config", default=None, help="YAML config; key=value overrides follow")
    train.set_defaults(func=_train, accepts_overrides=True)

    ev = sub.add_parser("eval", help="CER/WER, keyword recall, language accuracy per test set; --compare A B: "
                                     "paired bootstrap intervals and error breakdown")
    ev.add_argument("--model", default=None, help="the model folder to decode with")
    ev.add_argument("--compare", nargs=2, metavar=("A", "B"), default=None,
                    help="instead of --model: B against A, each a model folder (decoded) or an eval --output "
                         "folder (its hypotheses reused)")
    ev.add_argument("--test-set", action="append", help="NAME=PATH (repeatable): a JSONL or NeMo manifest, a "
                                                        "`datasets` folder or parquet, a Kaldi folder; with --compare "
                                                        "of two eval folders, optional: default the sets both hold")
    ev.add_argument("--context-file", action="append", help="NAME=PATH: a context list (one word or phrase a "
                                                            "line) for test set NAME's lines that carry none")
    ev.add_argument("--verifier", default=None, help="a reward file (PATH.py) checking each transcript: its pass "
                                                     "rate and mean reward per set")
    ev.add_argument("--verifier-pass", type=float, default=None, help="--verifier: a line passes at this reward "
                                                                      "or above (1.0)")
    ev.add_argument("--resamples", type=at_least(1, "bootstrap resamples"), default=1000,
                    help="--compare: bootstrap resamples")
    ev.add_argument("--seed", type=int, default=0, help="--compare: bootstrap seed; --rerank: sampling seed")
    ev.add_argument("--rerank", type=int, default=None, metavar="N",
                    help="N sampled transcripts an utterance, the one --reward scores best kept (no training; "
                         "the reward never sees the transcript)")
    ev.add_argument("--reward", default=None, help="--rerank: builtin:<terms>, a .py reward file, acoustic:DIR or "
                                                   "judge:DIR")
    ev.add_argument("--temperature", type=float, default=1.0, help="--rerank: sampling temperature")
    ev.add_argument("--vad-filter", action="store_true",
                    help="an empty transcript, not decoded, where a voice-activity detector (silero-vad) hears "
                         "nobody speak (as faster-whisper's vad_filter)")
    ev.add_argument("--vad-min-speech", type=seconds_at_least(0.0), default=None, metavar="SECONDS",
                    help="--vad-filter: seconds of detected speech below which nobody speaks (the silence "
                         "reward term's default; lower it where quiet or clipped speech is missed)")
    ev.add_argument("--output", default=None, help="write report.json, report.md and <set>.hyps.jsonl here")
    ev.add_argument("--batch-size", type=int, default=16, help="utterances decoded together")
    ev.add_argument("--num-beams", type=int, default=1, help="beam width (1: greedy)")
    ev.add_argument("--max-new-tokens", type=int, default=96, help="longest transcript, in tokens")
    ev.add_argument("--device", default="auto", help="cpu, cuda or auto")
    ev.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                    help="weights dtype (auto: as the checkpoint was saved)")
    ev.add_argument("--quiet", action="store_true", help="no progress bar")
    add_read_options(ev)  # test sets in any format READERS reads: --format, --text-column, --language, ...
    ev.set_defaults(func=_eval)

    rep = sub.add_parser("report", help="comparison table and plots from runs and evaluations")
    rep.add_argument("--runs", nargs="+", required=True,
                     help="training run folders (metrics.jsonl) and/or eval folders (report.json)")
    rep.add_argument("--output", required=True, help="the folder for report.md, report.html and the plots")
    rep.set_defaults(func=_report)


def _add_reward_commands(sub) -> None:
    reward = sub.add_parser("reward", help="reward server").add_subparsers(dest="reward_cmd", required=True)
    srv = reward.add_parser("serve", help="serve a reward over OpenRLHF's /get_reward protocol")
    srv.add_argument("--reward", default="builtin:asr", help="builtin:asr, builtin:cer,keyword=0.5,... (term[=weight]), judge:DIR "
                                                         "(a reward model trained on `data judge-pairs`), acoustic:DIR "
                                                         "(an acoustic scorer from `train scorer`) or PATH.py")
    srv.add_argument("--host", default="127.0.0.1", help="bind address (127.0.0.1 unless told otherwise)")
    srv.add_argument("--port", type=int, default=5000, help="the port to listen on")
    srv.add_argument("--token", default=None, help="require `Authorization: Bearer TOKEN` (or $ASR_RL_REWARD_TOKEN)")
    srv.set_defaults(func=_reward_serve)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    setup_logging(logging.DEBUG if args.verbose else logging.INFO)
    if extra and not getattr(args, "accepts_overrides", False):
        parser.error(f"unrecognised arguments: {' '.join(extra)}")
    args.overrides = extra
    try:
        return int(args.func(args) or 0)
    except (FileNotFoundError, FileExistsError, ValueError, RuntimeError, FloatingPointError, OSError) as e:
        # Known, user-facing failures: one clear message, no traceback (use -v for one).
        if args.verbose:
            raise
        print(f"asr-rl: error: {e}\n(run with -v for the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
