"""Sampling where the signal is: an utterance sampler that draws the utterances whose recent groups
carried a learning signal more often, and the saturated ones less, without dropping any.

A group whose rewards all tie gives every member a zero group-normalised advantage: GRPO learns
nothing from it and dynamic filtering throws it away after paying for its generation (on a converged
SFT model most groups tie; 65% in our measurement). The sampler learns from the loop's feedback
which utterances those are and spends the rollouts elsewhere (in the spirit of prioritised replay,
Schaul et al. 2016, arXiv:1511.05952, and of DAPO's dynamic sampling, arXiv:2503.14476, moved
before generation). An error shows as reward variance: with `rollout.reference_in_group` the
reference's reward tops a group whose samples all err alike, so that group does not tie.

The rule (all per utterance i, after each of its groups g is scored):

    signal_g = 1 if max(rewards_g) - min(rewards_g) > 1e-6 else 0        (0 = saturated)
    score_i  <- decay * score_i + (1 - decay) * signal_g                 (1 before any feedback)
    w_i      = floor + (1 - floor) * score_i
    draw     : batch_size distinct utterances, P(i first) = w_i / sum_j w_j

so a saturated utterance keeps weight `floor` (never 0) and an unseen one counts as informative.
Each draw is a pure function of (seed, number of draws so far, scores): `state_dict` holds those, so
a resumed run draws what an uninterrupted one would.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from asr_rl.data.batching import UtteranceSampler
from asr_rl.data.readers import ReadingDataConfig
from asr_rl.registry import Registry
from asr_rl.settings import setting

_TIE = 1e-6  # as `Group.informative`: rewards closer than this tie

# `fn(num_items, batch_size, seed, data_cfg) -> sampler` (next_indices, epoch, feedback, metrics, state)
SAMPLERS: Registry[Callable[[int, int, int, Any], Any]] = Registry("data.sampler")


@dataclass(frozen=True)
class RLDataConfig(ReadingDataConfig):
    """`data` of RL: the shared settings, how the training set is read (data/readers `ReadOptions`:
    `format`, `text_column`, ...) and the utterance sampler.

    Attributes:
        sampler: `uniform` (each utterance once an epoch, in a seeded order) or `signal` (utterances
            whose recent groups had reward variance drawn more often, saturated ones less); a name
            in `SAMPLERS`.
        sampler_floor: `signal`: the weight of a saturated utterance, against 1 for one with signal
            (or not yet seen); it is never dropped: with batch size 1 it is drawn with probability
            at least floor / (number of utterances).
        sampler_decay: `signal`: how much an utterance's earlier groups count in its score (an
            exponential average); 0 = only its latest group.
    """

    sampler: str = "uniform"
    sampler_floor: float = setting(0.1, gt=0, le=1)
    sampler_decay: float = setting(0.5, ge=0, lt=1)

    def __post_init__(self) -> None:
        super().__post_init__()
        SAMPLERS.check(self.sampler)


def group_signal(rewards: Sequence[float]) -> float:
    """1.0 when the group's rewards differ (a group-normalised advantage is non-zero), 0.0 when they
    all tie (saturated)."""
    return 1.0 if max(rewards) - min(rewards) > _TIE else 0.0


def sampling_weights(scores: np.ndarray, floor: float) -> np.ndarray:
    """w = floor + (1 - floor) * score, per utterance: in [floor, 1]."""
    return floor + (1.0 - floor) * scores


@dataclass
class SignalSampler:
    """Endless batches of `batch_size` distinct items of `num_items`, drawn by the weights of the
    module docstring; `feedback` updates them. `epoch` counts items drawn / num_items (what the
    augmenter's variant choice reads)."""

    num_items: int
    batch_size: int
    seed: int = 0
    floor: float = 0.1
    decay: float = 0.5
    draws: int = 0
    items_drawn: int = 0  # what `epoch` counts (a round may draw more or fewer than batch_size)
    scores: np.ndarray = field(default=None)
    last: np.ndarray = field(default=None)  # latest group per item: -1 none yet, 0 saturated, 1 signal

    def __post_init__(self) -> None:
        if not 0 < self.batch_size <= self.num_items:
            raise ValueError(f"batch_size {self.batch_size} must be in [1, {self.num_items}] (the items available)")
        if not (0 < self.floor <= 1 and 0 <= self.decay < 1):
            raise ValueError(f"need 0 < floor <= 1 and 0 <= decay < 1, got floor={self.floor}, decay={self.decay}")
        self.scores = np.ones(self.num_items) if self.scores is None else self.scores
        self.last = np.full(self.num_items, -1, dtype=np.int64) if self.last is None else self.last

    @property
    def epoch(self) -> int:
        return self.items_drawn // self.num_items

    def weights(self) -> np.ndarray:
        return sampling_weights(self.scores, self.floor)

    def next_indices(self, count: int | None = None, exclude: Sequence[int] = ()) -> list[int]:
        """`count` (default `batch_size`) distinct items, none of `exclude` (the items a round drew
        already) while enough others remain."""
        w = self.weights()
        if exclude and len(set(exclude)) < self.num_items:
            w = w.copy()
            w[list(exclude)] = 0.0
        k = min(self.batch_size if count is None else count, int((w > 0).sum()))
        rng = np.random.default_rng([self.seed, self.draws])
        idx = rng.choice(self.num_items, size=k, replace=False, p=w / w.sum())
        self.draws += 1
        self.items_drawn += k
        return [int(i) for i in idx]

    def signal_prior(self, index: Sequence[int]) -> list[float | None]:
        """Each item's score (the recent share of its groups with signal) as the chance that its next
        group has signal; None for an item never scored."""
        return [float(self.scores[i]) if self.last[i] >= 0 else None for i in index]

    def feedback(self, index: Sequence[int], rewards: Sequence[Sequence[float]]) -> None:
        """The scored groups of items `index` (their rewards, every member's) update the scores."""
        for i, r in zip(index, rewards, strict=True):
            signal = group_signal(r)
            self.scores[i] = self.decay * self.scores[i] + (1.0 - self.decay) * signal
            self.last[i] = int(signal)

    def metrics(self) -> dict[str, float]:
        """`sampler/saturated_share`: items whose latest group tied; `sampler/saturated_weight`: their
        share of the sampling weight (what a uniform sampler would give them is saturated_share);
        `sampler/mean_weight`: 1 = nothing skipped, floor = everything saturated."""
        w = self.weights()
        saturated = self.last == 0
        return {"sampler/saturated_share": float(saturated.mean()),
                "sampler/saturated_weight": float(w[saturated].sum() / w.sum()),
                "sampler/mean_weight": float(w.mean()), "sampler/seen_share": float((self.last >= 0).mean())}

    def state_dict(self) -> dict:
        return {"draws": self.draws, "items_drawn": self.items_drawn, "scores": self.scores.tolist(),
                "last": self.last.tolist()}

    def load_state_dict(self, state: dict) -> None:
        if len(state["scores"]) != self.num_items:
            raise ValueError(f"the sampler state is for {len(state['scores'])} items, this data has {self.num_items}: "
                             "resume with the manifest the run started with")
        self.draws = int(state["draws"])
        self.items_drawn = int(state.get("items_drawn", self.draws * self.batch_size))  # older states: whole batches
        self.scores = np.asarray(state["scores"], dtype=np.float64)
        self.last = np.asarray(state["last"], dtype=np.int64)


@SAMPLERS.register("uniform")
def _uniform(num_items: int, batch_size: int, seed: int, cfg: RLDataConfig) -> UtteranceSampler:
    return UtteranceSampler(num_items, batch_size, seed=seed, shuffle=cfg.shuffle)


@SAMPLERS.register("signal")
def _signal(num_items: int, batch_size: int, seed: int, cfg: RLDataConfig) -> SignalSampler:
    return SignalSampler(num_items, batch_size, seed=seed, floor=cfg.sampler_floor, decay=cfg.sampler_decay)


def build_sampler(cfg: RLDataConfig, num_items: int, batch_size: int, seed: int):
    """The `cfg.sampler` sampler over `num_items` items (BatchLoader's `sampler=`)."""
    return SAMPLERS.get(cfg.sampler)(num_items, batch_size, seed, cfg)


__all__ = ["RLDataConfig", "SAMPLERS", "SignalSampler", "build_sampler", "group_signal", "sampling_weights"]
