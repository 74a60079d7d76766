"""Planning a round of rollouts so that dynamic filtering rarely has to refill it.

Dynamic filtering (DAPO, arXiv:2503.14476) drops the groups whose rewards tie and samples again
until the batch is full: each refill round is a whole decoding pass, and on a small model a decoding
pass costs mostly per-token overhead, nearly the same for 8 prompts as for 16. So rather than
draw `need` prompts and refill, a round draws as many as it predicts it needs: DAPO's
over-sampling, sized per prompt. Each drawn prompt i gets a probability p_i that its group has
signal (does not tie): the sampler's score for it where it has one (data/signal_sampler.py: the
recent share of its groups with signal), else the share of groups the run kept lately (`KeepRate`).
The round is large enough when

    sum_i p_i - z * sqrt(sum_i p_i (1 - p_i))  >=  need

the kept count's mean less z standard deviations (independent Bernoulli draws): with z = 1 the
round fills the batch about 5 times in 6, and a refill round is left for the rest. Kept groups
beyond `need` are dropped as before (their rewards still inform the sampler).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def enough(priors: Sequence[float | None], need: int, keep_rate: float, z: float = 1.0) -> bool:
    """Whether prompts with these chances of signal (None: `keep_rate`) are likely to give `need`
    groups with signal: the expected count less `z` standard deviations reaches `need`."""
    p = [keep_rate if q is None else min(max(q, 0.0), 1.0) for q in priors]
    return sum(p) - z * math.sqrt(sum(q * (1.0 - q) for q in p)) >= need


@dataclass
class KeepRate:
    """The share of generated groups that dynamic filtering kept, an exponential average over
    rounds (`decay`: the weight of the past); 1.0 before any round."""

    value: float = 1.0
    decay: float = 0.7
    floor: float = 0.05  # a run where nearly every group ties still draws a bounded round

    def update(self, kept: int, seen: int) -> None:
        if seen:
            self.value = max(self.floor, self.decay * self.value + (1.0 - self.decay) * kept / seen)


@dataclass
class RoundPlan:
    """How many prompts a round draws: from `need` (the groups the batch still lacks) up to
    `max_factor` x need, grown until `enough`."""

    need: int
    keep_rate: float
    max_factor: float
    z: float = 1.0

    @property
    def max_items(self) -> int:
        return max(self.need, math.ceil(self.need * self.max_factor))

    def enough(self, priors: Sequence[float | None]) -> bool:
        return enough(priors, self.need, self.keep_rate, self.z)
