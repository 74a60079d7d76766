"""The reward contract (docs/rewards.md).

A reward gets the batch of samples and returns one reward per sample, optional scores in [0, 1]
and per-term values for logging (torchtune's `RewardOutput`, TRL's plain-callable signature).
Rewards never return a silent 0 for a failure: a reward that raises, returns NaN or the wrong
count stops the step with an error naming the reward, the sample and the cause.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Sample:
    """One sampled response with everything a reward may look at.

    Attributes:
        hypothesis: the transcript (the response after the `<asr_text>` marker, or the whole
            response for text tasks).
        reference: the reference transcript (or the prompt set's `label`); None on an unlabelled
            line (terms that need a reference skip it), "" where nobody speaks.
        language: the reference language code (`en`, `zh`, ...), or None.
        keywords: keywords/hotwords of the reference.
        prompt: the prompt text (text path) or the utterance id (audio path).
        response: the raw decoded response (language tag and markers included).
        predicted_language: the language the model wrote in its tag (a name such as `English`), or None.
        well_formed: the response had the model's expected structure (e.g. an `<asr_text>` section).
        duration: audio seconds, when known.
        group_id: index of the prompt this sample belongs to (samples of one group share it).
        context: the context list the prompt named (contextual biasing: the user's hotwords).
        audio: the utterance's audio reference (a path, or a path with its segment), for terms
            that listen (rewards/acoustic.py); None on the text path.
        metadata: any other manifest/prompt-set fields.
    """

    hypothesis: str
    reference: str | None
    language: str | None = None
    keywords: tuple[str, ...] = ()
    prompt: str = ""
    response: str = ""
    predicted_language: str | None = None
    well_formed: bool = True
    duration: float | None = None
    group_id: int = 0
    context: tuple[str, ...] = ()
    audio: str | None = None
    metadata: dict = field(default_factory=dict, compare=False, hash=False)


@dataclass
class RewardOutput:
    """Per-sample rewards, optional scores in [0, 1], and per-term values for logging."""

    rewards: list[float]
    scores: list[float] | None = None
    terms: dict[str, list[float]] = field(default_factory=dict)
    extra_logs: dict[str, float] = field(default_factory=dict)

    def log(self, prefix: str = "reward") -> dict[str, float]:
        """Mean of the reward, its std, and the mean of each term: `reward/mean`, `reward/cer`, ..."""
        n = max(len(self.rewards), 1)
        mean = sum(self.rewards) / n
        out = {f"{prefix}/mean": mean,
               f"{prefix}/std": math.sqrt(sum((r - mean) ** 2 for r in self.rewards) / n)}
        for name, values in self.terms.items():
            finite = [v for v in values if v is not None]
            if finite:
                out[f"{prefix}/{name}"] = sum(finite) / len(finite)
        out.update({f"{prefix}/{k}": v for k, v in self.extra_logs.items()})
        return out


class RewardError(RuntimeError):
    """A reward failed; the message names the reward, the sample index and the cause."""


class Reward(Protocol):
    name: str

    def __call__(self, samples: list[Sample]) -> RewardOutput: ...


def check_output(name: str, out: RewardOutput, n: int) -> RewardOutput:
    """Validate what a reward returned: the right count, finite numbers (never a silent 0)."""
    if len(out.rewards) != n:
        raise RewardError(f"reward {name!r} returned {len(out.rewards)} rewards for {n} samples")
    for i, r in enumerate(out.rewards):
        if isinstance(r, bool) or not isinstance(r, (int, float)):
            raise RewardError(f"reward {name!r} returned {r!r} ({type(r).__name__}) for sample {i}; expected a number")
        if not math.isfinite(r):
            raise RewardError(f"reward {name!r} returned {r} for sample {i}; rewards must be finite")
    if out.scores is not None and len(out.scores) != n:
        raise RewardError(f"reward {name!r} returned {len(out.scores)} scores for {n} samples")
    out.rewards = [float(r) for r in out.rewards]
    return out
