"""Paired bootstrap of a corpus-level error-rate difference between two systems on one test set.

Both systems transcribed the same utterances, so the utterances are resampled together (a paired
bootstrap, Koehn 2004, "Statistical significance tests for machine translation evaluation";
Bisani & Ney 2004, "Bootstrap estimates for confidence intervals in ASR performance evaluation").
On every resample each system's error rate is corpus-level, sum(errors) / sum(reference units), as
`asr-rl eval` computes it, not a mean of per-utterance rates (which would weigh a two-character
utterance like a fifty-character one).

Blocks: resampling utterances assumes they are independent, which they are not when one speaker
reads many of them; a block bootstrap resamples whole blocks (speakers) and keeps all their
utterances (as Bisani & Ney suggest for speaker-correlated errors). `speaker_blocks` makes the
blocks from a manifest's optional `speaker` field: an utterance without a speaker is a block of its
own, and when no utterance has one there is no speaker bootstrap (None).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class PairedBootstrap:
    """B against A on one set. Rates are fractions (0.05 = 5 %); `delta` = cer_b - cer_a, negative
    when B makes fewer errors; `relative` = delta / cer_a (None when A makes no error).

    Attributes:
        delta_ci, relative_ci: the `level` percentile interval over the resamples.
        p_improvement: share of resamples where B's rate is strictly below A's, Bisani & Ney's
            "probability of improvement" (ties count as none, so p(A, B) + p(B, A) + ties = 1).
        resamples: resamples with a rate (one drawing only empty references has none and is left
            out); blocks: how many units are resampled (utterances or speakers).
    """

    cer_a: float
    cer_b: float
    delta: float
    delta_ci: tuple[float, float]
    relative: float | None
    relative_ci: tuple[float, float] | None
    p_improvement: float
    resamples: int
    blocks: int
    level: float

    def to_dict(self) -> dict:
        return asdict(self)


def paired_bootstrap(errors_a: Sequence[float], errors_b: Sequence[float], units: Sequence[float],
                     n_resamples: int = 1000, seed: int = 0, blocks: Sequence[int] | None = None,
                     level: float = 0.95) -> PairedBootstrap:
    """Bootstrap distribution of B's error rate minus A's.

    Args:
        errors_a, errors_b: ``(n,)`` edit counts (S + D + I) of each utterance for A and for B.
        units: ``(n,)`` reference length of each utterance (characters for CER).
        n_resamples: R, the number of resamples.
        seed: seeds numpy's generator; the same seed draws the same resamples whatever the errors.
        blocks: ``(n,)`` block index in ``[0, k)`` of each utterance (e.g. its speaker), or None for
            one block per utterance. A resample draws k blocks with replacement.
        level: coverage of the percentile intervals.
    """
    ea, eb, n = (np.asarray(x, dtype=np.float64) for x in (errors_a, errors_b, units))
    if not (ea.shape == eb.shape == n.shape) or ea.ndim != 1 or len(ea) == 0:
        raise ValueError(f"errors_a, errors_b and units must be 1-d of one length > 0, got shapes "
                         f"{ea.shape}, {eb.shape}, {n.shape}")
    if n.sum() <= 0:
        raise ValueError("the references hold no units: there is no error rate to compare")
    if n_resamples < 1 or not 0 < level < 1:
        raise ValueError(f"n_resamples must be >= 1 and 0 < level < 1, got {n_resamples} and {level}")
    idx = np.arange(len(ea)) if blocks is None else np.asarray(blocks, dtype=np.int64)
    k = int(idx.max()) + 1
    # per-block sums (k, 3); a resample is a count of draws per block: (R, k) @ (k, 3) -> (R, 3)
    ea_k, eb_k, n_k = (np.bincount(idx, weights=x, minlength=k) for x in (ea, eb, n))
    sums = _resampled_sums(np.stack([ea_k, eb_k, n_k], axis=1), n_resamples, seed)  # (R, 3)
    ok = sums[:, 2] > 0  # a resample of only empty references has no rate: left out
    cer_a_r, cer_b_r = sums[ok, 0] / sums[ok, 2], sums[ok, 1] / sums[ok, 2]
    diff = cer_b_r - cer_a_r
    cer_a, cer_b = ea.sum() / n.sum(), eb.sum() / n.sum()
    tails = [50 * (1 - level), 50 * (1 + level)]
    has_a = cer_a_r > 0
    rel_ci = _interval(diff[has_a] / cer_a_r[has_a], tails) if has_a.any() else None
    return PairedBootstrap(
        cer_a=float(cer_a), cer_b=float(cer_b), delta=float(cer_b - cer_a), delta_ci=_interval(diff, tails),
        relative=float((cer_b - cer_a) / cer_a) if cer_a > 0 else None,
        relative_ci=rel_ci if cer_a > 0 else None, p_improvement=float(np.mean(cer_b_r < cer_a_r)),
        resamples=int(ok.sum()), blocks=k, level=level)


def _resampled_sums(per_block: np.ndarray, n_resamples: int, seed: int, chunk: int = 256) -> np.ndarray:
    """``(R, c)`` column sums of `per_block` ``(k, c)`` over R resamples of its k rows with
    replacement. A resample is how often each block is drawn (multinomial counts); drawn in chunks
    so that memory stays at ``chunk * k`` counts for large sets."""
    k = len(per_block)
    rng = np.random.default_rng(seed)
    parts = [rng.multinomial(k, np.full(k, 1.0 / k), size=min(chunk, n_resamples - start)) @ per_block
             for start in range(0, n_resamples, chunk)]
    return np.concatenate(parts, axis=0)


def _interval(values: np.ndarray, tails: list[float]) -> tuple[float, float]:
    lo, hi = np.percentile(values, tails)
    return float(lo), float(hi)


def speaker_blocks(speakers: Sequence[str | None]) -> np.ndarray | None:
    """``(n,)`` block index per utterance: one block per distinct speaker, in order of first
    appearance; an utterance without a speaker is its own block. None when no utterance has one.

    >>> speaker_blocks(["s1", None, "s2", "s1"]).tolist()
    [0, 1, 2, 0]
    """
    if all(s is None for s in speakers):
        return None
    ids: dict[object, int] = {}
    return np.array([ids.setdefault(s if s is not None else ("utt", i), len(ids))
                     for i, s in enumerate(speakers)], dtype=np.int64)
