"""`asr-rl` command line: parse, load config, call one function (DESIGN.md, "Commands").

Heavy imports (torch, transformers, ray, ...) happen inside the command functions so that
`asr-rl --help` and `asr-rl data check` start quickly.
"""
from __future__ import annotations

import argparse
import logging
import sys

from asr_rl.utils import setup_logging

log = logging.getLogger("asr_rl.cli")


def _data_check(args: argparse.Namespace) -> int:
    from asr_rl.data.manifest import scan_manifest

    scan = scan_manifest(args.manifest, check_audio=not args.no_audio, min_duration=args.min_duration,
                         max_duration=args.max_duration)
    langs = ", ".join(f"{k} {v}" for k, v in sorted(scan.languages.items())) or "none"
    print(f"manifest:   {scan.path}")
    print(f"utterances: {len(scan.utterances)}")
    print(f"hours:      {scan.hours:.3f}")
    print(f"languages:  {langs}")
    print(f"speakers:   {len(scan.speakers)}")
    for note in scan.notes[: args.max_notes]:
        print(f"note: {scan.path}:{note.line}: {note.message}")
    if len(scan.notes) > args.max_notes:
        print(f"note: ... {len(scan.notes) - args.max_notes} more notes")
    print(f"bad lines:  {len(scan.problems)}")
    for p in scan.problems:
        print(f"  {scan.path}:{p.line}: {p.message}")
    if not scan.utterances and not scan.problems:
        print(f"  {scan.path}: the manifest holds no utterances")
        return 1
    return 1 if scan.problems else 0


def _data_synth(args: argparse.Namespace) -> int:
    from asr_rl.data.synth import synthesize_corpus

    langs = tuple(x.strip() for x in args.langs.split(",") if x.strip())
    summary = synthesize_corpus(args.out, langs=langs, n_train=args.train, n_test=args.test, seed=args.seed,
                                workers=args.workers, progress=not args.quiet)
    for split, info in summary.items():
        print(f"{split:<12} {info['utterances']:>6} utterances  {info['hours']:.3f} h  {info['manifest']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asr-rl", description="RL fine-tuning for LLM-based speech recognition")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    data = sub.add_parser("data", help="manifests and the demo corpus").add_subparsers(dest="data_cmd", required=True)
    check = data.add_parser("check", help="validate a manifest: count, hours, languages, bad lines")
    check.add_argument("--manifest", required=True)
    check.add_argument("--no-audio", action="store_true", help="skip opening the audio files")
    check.add_argument("--min-duration", type=float, default=0.0)
    check.add_argument("--max-duration", type=float, default=30.0)
    check.add_argument("--max-notes", type=int, default=10)
    check.set_defaults(func=_data_check)

    synth = data.add_parser("synth", help="synthesise the bilingual demo corpus offline (espeak-ng)")
    synth.add_argument("--out", required=True)
    synth.add_argument("--langs", default="en,zh")
    synth.add_argument("--train", type=int, default=3000)
    synth.add_argument("--test", type=int, default=200)
    synth.add_argument("--seed", type=int, default=1)
    synth.add_argument("--workers", type=int, default=None)
    synth.add_argument("--quiet", action="store_true")
    synth.set_defaults(func=_data_synth)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    setup_logging(logging.DEBUG if args.verbose else logging.INFO)
    if extra and not getattr(args, "accepts_overrides", False):
        parser.error(f"unrecognised arguments: {' '.join(extra)}")
    args.overrides = extra
    try:
        return int(args.func(args) or 0)
    except (FileNotFoundError, FileExistsError, ValueError, RuntimeError) as e:
        # Known, user-facing failures: one clear message, no traceback (use -v for one).
        if args.verbose:
            raise
        print(f"asr-rl: error: {e}\n(run with -v for the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
