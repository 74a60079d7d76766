"""Several datasets in one RL run, each drawn with its own probability (OpenRLHF's `--prompt_data
a,b --prompt_data_probs 0.7,0.3`): `train_manifest=a.jsonl,b.jsonl train_manifest_probs=[0.7, 0.3]`.

Label-free adaptation forgets the home domain when it trains on the new one alone; drawing labelled
home lines beside the unlabelled target pool keeps it (each line scored by the terms it can take:
rewards/combine.py). The datasets are read one after another into one table (their lines keep their
own `source`), and `MixtureSampler` draws each slot of a round from dataset d with probability p_d,
then the line within it from that dataset's own sampler (`uniform` epochs or `signal` weights), so
a small dataset is not drowned by a large one, nor repeated beyond its share.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np


def split_paths(value: str) -> list[str]:
    """`a.jsonl,b.jsonl` -> the paths, in order (commas separate datasets, as in OpenRLHF)."""
    return [p.strip() for p in value.split(",") if p.strip()]


def check_one_dataset(value: str | None, command: str) -> None:
    """`command` (SFT) trains on one manifest: `a.jsonl,b.jsonl` is refused, saying so."""
    if value and len(split_paths(value)) > 1:
        raise ValueError(f"train_manifest={value} names {len(split_paths(value))} datasets, and {command} trains on "
                         "one manifest: join their lines into one file; several datasets drawn by shares "
                         "(train_manifest_probs) are for the RL commands")


def check_paths_distinct(paths: Sequence[str]) -> None:
    """Each dataset once: the same manifest twice would be drawn by two shares, which is one share
    said twice (give it the sum instead)."""
    import os

    seen: dict[str, str] = {}
    for p in paths:
        key = os.path.realpath(p)
        if key in seen:
            raise ValueError(f"train_manifest names {seen[key]}" + (f" (as {p})" if p != seen[key] else "") +
                             " twice: give each dataset once, with the sum of its shares in train_manifest_probs")
        seen[key] = p


def check_probs(probs: Sequence[float] | None, n: int) -> list[float]:
    """The probabilities of `n` datasets (finite, >= 0, summing to 1 as OpenRLHF's `prompt_data_probs`
    do: a list that does not is refused, not silently rescaled); one dataset needs none, several do
    (no silent default: equal shares and shares by size both surprise someone)."""
    if probs is None:
        if n > 1:
            raise ValueError(f"train_manifest names {n} datasets: give train_manifest_probs, one probability each "
                             "(e.g. [0.7, 0.3])")
        return [1.0]
    if len(probs) != n:
        raise ValueError(f"train_manifest_probs has {len(probs)} values for the {n} datasets of train_manifest")
    values = list(probs)
    if not all(isinstance(p, (int, float)) and not isinstance(p, bool) and np.isfinite(p) and p >= 0 for p in values):
        raise ValueError(f"train_manifest_probs must be finite numbers >= 0, got {values}")
    total = float(sum(values))
    if abs(total - 1.0) > 1e-6:
        scaled = ", ".join(f"{p / total:.3g}" for p in values) if total > 0 else "..."
        raise ValueError(f"train_manifest_probs must sum to 1 (one probability each dataset), got {values} (sum "
                         f"{total:g}); for these proportions give [{scaled}]")
    return [float(p) / total for p in values]


@dataclass
class MixtureSampler:
    """Draws from `parts` (one sampler per dataset, over its own indices) with probabilities `probs`;
    indices are global: dataset d's item i is `offsets[d] + i`. The sampler protocol of
    data/batching.py (`next_indices`, `signal_prior`, `feedback`, `epoch`, state)."""

    parts: list
    probs: list[float]
    batch_size: int
    seed: int = 0
    draws: int = 0
    drawn: list[int] = field(default_factory=list)  # items drawn per dataset
    offsets: list[int] = field(init=False)

    def __post_init__(self) -> None:
        sizes = [p.num_items for p in self.parts]
        self.offsets = list(np.cumsum([0, *sizes[:-1]]))
        self.drawn = self.drawn or [0] * len(self.parts)
        self.num_items = sum(sizes)

    def _part(self, index: int) -> tuple[int, int]:
        d = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return d, int(index - self.offsets[d])

    def next_indices(self, count: int | None = None, exclude: Sequence[int] = ()) -> list[int]:
        """`count` (default `batch_size`) items: each slot's dataset drawn by `probs` (a dataset
        whose items this call used up is skipped), then that many items from its sampler."""
        k = self.batch_size if count is None else count
        rng = np.random.default_rng([self.seed, self.draws])
        excluded = [self._part(i) for i in exclude]
        room = np.array([p.num_items for p in self.parts]) - np.bincount([d for d, _ in excluded], minlength=len(self.parts))
        counts = np.zeros(len(self.parts), dtype=int)
        for _ in range(min(k, int(room.sum()))):
            p = np.where(counts < room, self.probs, 0.0)
            if not p.sum():
                break
            counts[rng.choice(len(p), p=p / p.sum())] += 1
        self.draws += 1
        out = []
        for d, c in enumerate(counts):
            local = [i for e, i in excluded if e == d]
            for _ in range(c):  # one at a time: an epoch sampler then drops no tail (each line once an epoch)
                local += self.parts[d].next_indices(1, exclude=local)
            out += [int(self.offsets[d]) + i for i in local[len(local) - c:]]
            self.drawn[d] += int(c)
        return [out[int(i)] for i in rng.permutation(len(out))]

    def signal_prior(self, index: Sequence[int]) -> list[float | None]:
        return [self.parts[d].signal_prior([i])[0] for d, i in map(self._part, index)]

    def feedback(self, index: Sequence[int], rewards: Sequence[Sequence[float]]) -> None:
        for g, r in zip(index, rewards, strict=True):
            d, i = self._part(g)
            self.parts[d].feedback([i], [r])

    @property
    def epoch(self) -> int:
        return sum(self.drawn) // self.num_items

    def metrics(self) -> dict[str, float]:
        """`data/share_<d>`: dataset d's share of the items drawn so far; each part's own metrics with `_<d>`."""
        total = max(sum(self.drawn), 1)
        out = {f"data/share_{d}": n / total for d, n in enumerate(self.drawn)}
        for d, part in enumerate(self.parts):
            out.update({f"{k}_{d}": v for k, v in part.metrics().items()})
        return out

    def state_dict(self) -> dict:
        return {"draws": self.draws, "drawn": list(self.drawn), "parts": [p.state_dict() for p in self.parts]}

    def load_state_dict(self, state: dict) -> None:
        if len(state.get("parts", ())) != len(self.parts):
            raise ValueError(f"the sampler state is for {len(state.get('parts', ()))} datasets, this run has "
                             f"{len(self.parts)}: resume with the train_manifest the run started with")
        self.draws, self.drawn = int(state["draws"]), [int(n) for n in state["drawn"]]
        for part, s in zip(self.parts, state["parts"]):
            part.load_state_dict(s)


def build_mixture(make_part: Callable[[int, int, int], object], sizes: Sequence[int], probs: Sequence[float],
                  batch_size: int, seed: int) -> MixtureSampler:
    """A `MixtureSampler` over datasets of `sizes`; `make_part(num_items, batch_size, seed)` builds each
    dataset's own sampler (seeded apart: seed + d)."""
    parts = [make_part(n, min(batch_size, n), seed + d) for d, n in enumerate(sizes)]
    return MixtureSampler(parts, list(probs), batch_size, seed)
