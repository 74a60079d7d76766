"""Contextual-biasing error rates: how a model does on the words of its context list, and off them.

Le et al. 2021 (arXiv:2104.02194), "Contextualized streaming end-to-end speech recognition with
trie-based deep biasing and shallow fusion", split WER by the biasing list:
- B-WER: edits on reference words that are in the context list, over the number of such words; an
  inserted word counts here when it is a listed word.
- U-WER: the same for every other word.
Here a list item may be a phrase ("living room", "张伟"): the reference units inside an occurrence
of an item are biased. Units are those each language is scored in (words; characters for the
languages written without spaces, `CHARACTER_SCORED`), on the shared normalised text, aligned by
jiwer. False biasing counts listed items the hypothesis holds more often than the reference does
(a listed name forced in where the speaker said another word).
"""
from __future__ import annotations

from dataclasses import dataclass

import jiwer

from asr_rl.evaluation.breakdown import scoring_unit, units


@dataclass
class BiasCounts:
    """Edits and reference units of one utterance (or a sum of them), on and off its context list."""

    biased_errors: int = 0
    biased_ref: int = 0
    unbiased_errors: int = 0
    unbiased_ref: int = 0
    false_biasing: int = 0

    def __add__(self, other: BiasCounts) -> BiasCounts:
        return BiasCounts(*(a + b for a, b in zip(self.astuple(), other.astuple())))

    def astuple(self) -> tuple[int, ...]:
        return (self.biased_errors, self.biased_ref, self.unbiased_errors, self.unbiased_ref, self.false_biasing)

    @property
    def b_wer(self) -> float | None:
        return self.biased_errors / self.biased_ref if self.biased_ref else None

    @property
    def u_wer(self) -> float | None:
        return self.unbiased_errors / self.unbiased_ref if self.unbiased_ref else None


def occurrences(tokens: list[str], phrase: list[str]) -> list[int]:
    """Start positions of `phrase` in `tokens` (overlaps allowed).

    >>> occurrences("call anna or anna".split(), ["anna"]), occurrences(list("打开打开"), list("打开"))
    ([1, 3], [0, 2])
    """
    n = len(phrase)
    return [i for i in range(len(tokens) - n + 1) if n and tokens[i:i + n] == phrase]


def covered(tokens: list[str], phrases: list[list[str]]) -> list[bool]:
    """Per token: whether it lies inside an occurrence of any phrase."""
    mark = [False] * len(tokens)
    for phrase in phrases:
        for start in occurrences(tokens, phrase):
            mark[start:start + len(phrase)] = [True] * len(phrase)
    return mark


def bias_counts(reference: str, hypothesis: str, context: tuple[str, ...] | list[str], language: str) -> BiasCounts:
    """B-WER and U-WER counts of one utterance (module docstring).

    >>> c = bias_counts("call grace now", "call ben now", ["grace", "ben"], "en")
    >>> (c.biased_errors, c.biased_ref, c.unbiased_errors, c.unbiased_ref, c.false_biasing)
    (1, 1, 0, 2, 1)
    """
    unit = scoring_unit(language)
    ref, hyp = units(reference, unit), units(hypothesis, unit)
    phrases = [p for p in (units(item, unit) for item in context) if p]
    ref_marked, hyp_marked = covered(ref, phrases), covered(hyp, phrases)
    counts = BiasCounts(biased_ref=sum(ref_marked), unbiased_ref=len(ref) - sum(ref_marked))
    counts.false_biasing = sum(max(0, len(occurrences(hyp, p)) - len(occurrences(ref, p))) for p in phrases)
    if not ref or not hyp:  # all deleted, or all inserted
        counts.biased_errors = sum(ref_marked) if ref else sum(hyp_marked)
        counts.unbiased_errors = (len(ref) - sum(ref_marked)) if ref else (len(hyp) - sum(hyp_marked))
        return counts
    for chunk in jiwer.process_words(" ".join(ref), " ".join(hyp)).alignments[0]:
        if chunk.type in ("substitute", "delete"):
            marks = ref_marked[chunk.ref_start_idx:chunk.ref_end_idx]
        elif chunk.type == "insert":
            marks = hyp_marked[chunk.hyp_start_idx:chunk.hyp_end_idx]
        else:
            continue
        counts.biased_errors += sum(marks)
        counts.unbiased_errors += len(marks) - sum(marks)
    return counts


__all__ = ["BiasCounts", "bias_counts", "covered", "occurrences"]
