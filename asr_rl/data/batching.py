"""Batches of utterances with their audio, in a seeded, resumable order.

The order is a pure function of (seed, epoch): a resumed run that restores `DataPosition` draws
exactly the batches an uninterrupted run would have drawn. Features are not computed here: the
policy's own Hugging Face processor turns waveforms into model inputs.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from asr_rl.data.audio import load_audio
from asr_rl.data.manifest import Utterance


@dataclass
class AudioBatch:
    """`utterances[i]` with its float32 mono waveform `waveforms[i]` `(num_samples_i,)`."""

    utterances: list[Utterance]
    waveforms: list[np.ndarray]
    sample_rate: int = 16000

    def __len__(self) -> int:
        return len(self.utterances)

    def select(self, idx) -> "AudioBatch":
        idx = list(idx)
        return AudioBatch([self.utterances[i] for i in idx], [self.waveforms[i] for i in idx], self.sample_rate)

    @property
    def items(self) -> list[Utterance]:
        return self.utterances

    @property
    def texts(self) -> list[str]:
        return [u.text for u in self.utterances]

    @property
    def languages(self) -> list[str]:
        return [u.language for u in self.utterances]

    @property
    def durations(self) -> list[float]:
        return [len(w) / self.sample_rate for w in self.waveforms]


def load_batch(utterances: list[Utterance], sample_rate: int = 16000) -> AudioBatch:
    """Read the audio of `utterances` (mono, resampled to `sample_rate`)."""
    return AudioBatch(list(utterances), [load_audio(u.audio, sample_rate) for u in utterances], sample_rate)


@dataclass
class DataPosition:
    """Where the sampler is: the epoch and the index into that epoch's permutation."""

    epoch: int = 0
    index: int = 0


@dataclass
class UtteranceSampler:
    """Endless seeded batches over `num_items` items, `batch_size` at a time.

    Each epoch is a fresh permutation drawn from `seed + epoch` (or the natural order when
    `shuffle` is off); an epoch's tail smaller than a batch is dropped so every batch is full, which
    keeps GRPO's per-step shapes (and DeepSpeed's micro-batches) constant.

    With `lengths` and `bucket_batches` > 0, each run of `bucket_batches` batches of the permutation
    is sorted by length before it is cut into batches, and the batches are shuffled: batches hold
    utterances of similar duration, so padding (which the conv front end and the LLM pay for) shrinks.
    """

    num_items: int
    batch_size: int
    seed: int = 0
    shuffle: bool = True
    lengths: list[float] | None = None
    bucket_batches: int = 0
    position: DataPosition = field(default_factory=DataPosition)

    def __post_init__(self) -> None:
        if self.num_items < 1:
            raise ValueError("cannot sample from an empty set of utterances")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.batch_size > self.num_items:
            raise ValueError(f"batch_size {self.batch_size} is larger than the {self.num_items} utterances available")

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_items)
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(self.num_items)
        if self.lengths is None or self.bucket_batches <= 0:
            return order
        pool = self.bucket_batches * self.batch_size
        usable = (self.num_items // self.batch_size) * self.batch_size
        order = order[:usable]
        lengths = np.asarray(self.lengths)
        for start in range(0, usable, pool):
            chunk = order[start:start + pool]
            order[start:start + pool] = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches = order.reshape(-1, self.batch_size)
        return batches[rng.permutation(len(batches))].reshape(-1)

    def next_indices(self) -> list[int]:
        if self.position.index + self.batch_size > self.num_items:
            self.position = DataPosition(self.position.epoch + 1, 0)
        start = self.position.index
        idx = self._order(self.position.epoch)[start:start + self.batch_size]
        self.position = DataPosition(self.position.epoch, start + self.batch_size)
        return [int(i) for i in idx]

    def state_dict(self) -> dict:
        return asdict(self.position)

    def load_state_dict(self, state: dict) -> None:
        self.position = DataPosition(**state)


class BatchLoader:
    """Seeded batches from a list of utterances (an `AudioBatch` each) or of other items (given to
    `make_batch`, e.g. text prompts); `state_dict` makes it resumable."""

    def __init__(self, utterances: list, batch_size: int, seed: int = 0, shuffle: bool = True,
                 sample_rate: int = 16000, bucket_batches: int = 0, make_batch=None):
        self.utterances = utterances
        self.sample_rate = sample_rate
        self.make_batch = make_batch or (lambda items: load_batch(items, self.sample_rate))
        lengths = [u.duration or 0.0 for u in utterances] if bucket_batches > 0 else None
        self.sampler = UtteranceSampler(len(utterances), batch_size, seed=seed, shuffle=shuffle, lengths=lengths,
                                        bucket_batches=bucket_batches)

    def next_batch(self):
        return self.make_batch([self.utterances[i] for i in self.sampler.next_indices()])

    @property
    def epoch(self) -> int:
        return self.sampler.position.epoch

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)


def iter_batches(utterances: list[Utterance], batch_size: int, sample_rate: int = 16000):
    """One ordered pass (for evaluation), the last batch possibly smaller."""
    for start in range(0, len(utterances), batch_size):
        yield load_batch(utterances[start:start + batch_size], sample_rate)
