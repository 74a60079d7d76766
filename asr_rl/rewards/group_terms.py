"""Reward terms that score a sample against the other samples of its utterance (registered in
terms.py with `needs_group`): no transcript and no grammar, in any language.

`consensus` is the agreement of a transcript with its group, the reward of test-time RL (TTRL,
Zuo et al. 2025, arXiv:2504.16084: the majority answer of the samples as the pseudo-label). With h_i
the normalised transcripts of a group of n and d the normalised edit distance (Levenshtein distance
over the longer length, in [0, 1]):

  mbr:       r_i = 1 - mean_{j != i} d(h_i, h_j)      (agreement; the highest is the group's
                                                        minimum-Bayes-risk choice)
  majority:  r_i = 1[h_i = y],  y the most frequent h  (TTRL's exact-match vote; ties: seen first)

and with `confidence`, r_i is weighted by how much the group agrees (AQA-TTRL, arXiv:2510.05478):
the majority's share of the votes, or the MBR choice's agreement. Under GRPO's per-group std
normalisation a factor common to a group cancels on its own; it weighs this term against the others
in the sum (silence, acoustic, language), and the update itself under estimators that do not divide
by the std (dr_grpo, rloo).
"""
from __future__ import annotations

from collections import Counter

from rapidfuzz import process
from rapidfuzz.distance import Levenshtein

from asr_rl.rewards.base import Sample
from asr_rl.rewards.groups import group_indices
from asr_rl.rewards.normalize import normalize_text

MODES = ("mbr", "majority")
UNITS = ("char", "word")


def consensus_options(options: dict) -> None:
    if options.get("mode", "mbr") not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {options['mode']!r}")
    if options.get("unit", "char") not in UNITS:
        raise ValueError(f"unit must be one of {', '.join(UNITS)}, got {options['unit']!r}")


def agreement(texts: list[str], unit: str = "char") -> list[float]:
    """1 - the mean normalised edit distance of each text to the others (1.0 for a group of one).

    >>> agreement(["call anna", "call anna", "call ana"])
    [0.9444444444444444, 0.9444444444444444, 0.8888888888888888]
    """
    seqs = [t.split() if unit == "word" else t for t in texts]
    n = len(seqs)
    if n < 2:
        return [1.0] * n
    # all pairs in C (rapidfuzz); the diagonal is 0, so a row's sum is its distance to the others
    dist = process.cdist(seqs, seqs, scorer=Levenshtein.normalized_distance, dtype=float)
    return [float(1.0 - row.sum() / (n - 1)) for row in dist]


def _group_scores(texts: list[str], mode: str, unit: str, confidence: bool) -> list[float]:
    if mode == "majority":
        top, votes = Counter(texts).most_common(1)[0]
        scores, weight = [float(t == top) for t in texts], votes / len(texts)
    else:
        scores = agreement(texts, unit)
        weight = max(scores)
    return [s * weight for s in scores] if confidence else scores


def consensus_term(samples: list[Sample], mode: str = "mbr", unit: str = "char",
                   confidence: bool = False) -> list[float]:
    """Agreement of each transcript with the other samples of its utterance (module docstring):
    `mode` mbr (1 - mean normalised edit distance, in `unit` char or word) or majority (TTRL's vote);
    `confidence` weighs it by the group's agreement (AQA-TTRL). Needs whole groups of >= 2 samples.

    >>> g = [Sample(h, None, group_id=0) for h in ("call anna", "call anna", "call bob")]
    >>> [round(r, 3) for r in consensus_term(g)], consensus_term(g, mode="majority")
    ([0.778, 0.778, 0.556], [1.0, 1.0, 0.0])
    >>> [round(r, 3) for r in consensus_term(g, mode="majority", confidence=True)]
    [0.667, 0.667, 0.0]
    """
    out = [0.0] * len(samples)
    for gid, rows in group_indices(samples).items():
        if len(rows) < 2:
            raise ValueError(f"the consensus term scores a sample against the other samples of its utterance, and "
                             f"utterance {samples[rows[0]].prompt!r} (group {gid}) has only {len(rows)} here: sample "
                             "n >= 2 an utterance, and hand the term whole groups")
        texts = [normalize_text(samples[i].hypothesis) for i in rows]
        for i, r in zip(rows, _group_scores(texts, mode, unit, confidence)):
            out[i] = r
    return out


__all__ = ["agreement", "consensus_options", "consensus_term"]
