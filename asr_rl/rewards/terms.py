"""Built-in reward terms: pure functions from samples to one value per sample.

Each term is registered by name; a config combines them with weights (`reward.terms: {cer: 1.0}`).
"""
from __future__ import annotations

from collections.abc import Callable

from asr_rl.rewards.base import Sample
from asr_rl.rewards.normalize import cer, wer

TermFn = Callable[..., list[float]]
TERMS: dict[str, TermFn] = {}


def register_term(name: str):
    def wrap(fn: TermFn) -> TermFn:
        TERMS[name] = fn
        return fn
    return wrap


def get_term(name: str) -> TermFn:
    try:
        return TERMS[name]
    except KeyError:
        raise ValueError(f"unknown reward term {name!r}; valid terms: {', '.join(sorted(TERMS))}") from None


@register_term("cer")
def cer_term(samples: list[Sample], floor: float = 0.0) -> list[float]:
    """1 - CER on normalised text, floored at `floor` (CER can exceed 1 with insertions).

    >>> cer_term([Sample("call ana", "call anna")])
    [0.8888888888888888]
    """
    return [max(floor, 1.0 - cer(s.reference, s.hypothesis)) for s in samples]


@register_term("wer")
def wer_term(samples: list[Sample], floor: float = 0.0) -> list[float]:
    """1 - WER on normalised text, floored at `floor`."""
    return [max(floor, 1.0 - wer(s.reference, s.hypothesis)) for s in samples]
