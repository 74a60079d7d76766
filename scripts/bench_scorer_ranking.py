"""Benchmark: does the acoustic scorer hear which name or digit was said? (issue 46, point 1)

    python scripts/bench_scorer_ranking.py exp/scorer/demo/final data/demo_corpus_3000_target/dev.jsonl

For each labelled English line holding a contact name or a digit word (the first 150 English lines),
one such word is swapped for another of its kind: a sentence the command grammar passes just as
well. Prints how often the `acoustic` term (rewards/acoustic.py) scores the true transcript above
the swapped one, per kind, and the mean scores.
"""
from __future__ import annotations

import argparse
import random

import torch


def pairs(utts, names: set[str], digits: list[str], seed: int = 0):
    """(true, swapped, kind) for each line with a name or a digit word."""
    rng = random.Random(seed)
    for u in utts:
        words = u.text.lower().split()
        slots = [i for i, w in enumerate(words) if w in names or w in digits]
        if not slots:
            continue
        i = rng.choice(slots)
        kind, pool = ("name", sorted(names)) if words[i] in names else ("digit", digits)
        swapped = words[:i] + [rng.choice([w for w in pool if w != words[i]])] + words[i + 1:]
        yield u, " ".join(swapped), kind


def main() -> None:
    from asr_rl.data.manifest import read_manifest
    from asr_rl.data.synth.grammar_en import NAMES, number_words
    from asr_rl.rewards.acoustic import AcousticTerm
    from asr_rl.rewards.base import Sample

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scorer")
    ap.add_argument("manifest")
    ap.add_argument("--lines", type=int, default=150)
    args = ap.parse_args()
    torch.set_num_threads(1)
    term = AcousticTerm(args.scorer)
    utts = [u for u in read_manifest(args.manifest) if u.text and u.language == "en"][:args.lines]
    found = list(pairs(utts, set(NAMES), [number_words(d) for d in range(10)]))
    samples = [Sample(h, None, audio=str(u.audio), group_id=g) for g, (u, wrong, _) in enumerate(found)
               for h in (u.text, wrong)]
    scores = term.scores(samples)
    print(f"{'kind':<6} {'lines':>6} {'true above swapped':>19} {'mean true':>10} {'mean swapped':>13}")
    for kind in ("name", "digit"):
        rows = [k for k, (_, _, c) in enumerate(found) if c == kind]
        above = sum(scores[2 * k] > scores[2 * k + 1] for k in rows)
        print(f"{kind:<6} {len(rows):6d} {100 * above / max(1, len(rows)):18.1f}% "
              f"{sum(scores[2 * k] for k in rows) / max(1, len(rows)):10.3f} "
              f"{sum(scores[2 * k + 1] for k in rows) / max(1, len(rows)):13.3f}")


if __name__ == "__main__":
    main()
