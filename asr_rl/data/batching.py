"""Batches of utterances with their audio, in a seeded, resumable order.

The order is a pure function of (seed, epoch): a resumed run that restores `DataPosition` draws
exactly the batches an uninterrupted run would have drawn. Features are not computed here: the
policy's own Hugging Face processor turns waveforms into model inputs.

Augmentation is by variant: an `Augmenter` picks, per utterance and epoch, variant 0 (the clean
audio) or one of a few augmented variants, each a pure function of (seed, utterance, variant). A
frozen encoder's states are cached by (audio path, variant), so variants repeat on purpose, and the
waveform of a batch is loaded (and augmented) lazily, only for what the cache lacks: in a pool of
decoding threads (`data.decode_workers`) when several are wanted at once, as a data loader's
workers would (soundfile, soxr and numpy release the GIL while they work, so the threads decode in
parallel on a process's other cores).
"""
from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Protocol

import numpy as np

from asr_rl.data.audio import AudioError, load_audio
from asr_rl.data.manifest import Utterance
from asr_rl.data.utterance_table import context_chars_of, durations_of


class Augmenter(Protocol):
    tag: str  # identifies the variants (settings and seed): equal tags, equal audio

    def pick(self, utterance: Utterance, epoch: int) -> int:
        """The variant of `utterance` drawn in `epoch` (0 = clean)."""

    def apply(self, waveform: np.ndarray, utterance: Utterance, variant: int, sample_rate: int) -> np.ndarray:
        """Variant `variant` of `waveform` (variant 0: unchanged)."""


_POOLS: dict[int, ThreadPoolExecutor] = {}  # decoding threads by size, one set a process
_POOLS_LOCK = threading.Lock()


def decoding_pool(workers: int) -> ThreadPoolExecutor:
    """The process's pool of `workers` decoding threads (made on first use, kept)."""
    with _POOLS_LOCK:
        if workers not in _POOLS:
            _POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix="asr-rl-decode")
        return _POOLS[workers]


class LazyWaveforms(Sequence):
    """Waveforms made on first access by `make(i)` and kept; `load` makes several at once on
    `workers` decoding threads (0 or 1: in the calling thread)."""

    def __init__(self, make: Callable[[int], np.ndarray], n: int, workers: int = 0):
        self._make, self._n, self._done, self.workers = make, n, {}, workers

    def load(self, indices: Sequence[int]) -> list[np.ndarray]:
        """The waveforms at `indices`; those not made yet are made in parallel on the decoding
        threads (the same arrays as one at a time: `make` is a pure function of the index)."""
        todo = [i for i in dict.fromkeys(indices) if i not in self._done]
        if self.workers > 1 and len(todo) > 1:
            for i, wav in zip(todo, decoding_pool(self.workers).map(self._make, todo)):
                self._done[i] = wav
        return [self[i] for i in indices]

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        if i not in self._done:
            self._done[i] = self._make(i)
        return self._done[i]


@dataclass
class AudioBatch:
    """`utterances[i]` with its float32 mono waveform `waveforms[i]` `(num_samples_i,)` (a list, or
    a `LazyWaveforms` loaded on access) and its augmentation variant `variants[i]` (0 = clean)."""

    utterances: list[Utterance]
    waveforms: Sequence[np.ndarray]
    sample_rate: int = 16000
    variants: list[int] | None = None
    augment_tag: str = ""  # which augmenter's variants these are (its settings and seed)

    def __post_init__(self) -> None:
        if self.variants is None:
            self.variants = [0] * len(self.utterances)

    def __len__(self) -> int:
        return len(self.utterances)

    def select(self, idx) -> "AudioBatch":
        idx = list(idx)
        waves = self.waveforms
        workers = getattr(waves, "workers", 0)
        return AudioBatch([self.utterances[i] for i in idx], LazyWaveforms(lambda k: waves[idx[k]], len(idx), workers),
                          self.sample_rate, [self.variants[i] for i in idx], self.augment_tag)

    def load(self, indices: Sequence[int]) -> list[np.ndarray]:
        """The waveforms at `indices`, a lazy batch's decoded in parallel (`LazyWaveforms.load`)."""
        if isinstance(self.waveforms, LazyWaveforms):
            return self.waveforms.load(indices)
        return [self.waveforms[i] for i in indices]

    @property
    def cache_keys(self) -> list[tuple[str, str]]:
        """`(audio path, variant tag)` per utterance: what a frozen encoder's states (and the prompt
        ids cached with them) depend on; the clean audio is `clean` whoever augments, variant v of an
        augmenter `<its tag>/v`; a context list adds its digest (`clean#<sha1>`), so the same audio
        with another list has a prompt of its own."""
        return [(str(u.audio), (f"{self.augment_tag}/{v}" if v else "clean") + context_digest(u.context))
                for u, v in zip(self.utterances, self.variants)]

    @property
    def contexts(self) -> list[tuple[str, ...]]:
        return [u.context for u in self.utterances]

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


def context_digest(context: tuple[str, ...]) -> str:
    """"" for no context; else `#` and 12 hex digits of the list's SHA-1 (order matters: it is the prompt's)."""
    return "#" + hashlib.sha1("\x1f".join(context).encode()).hexdigest()[:12] if context else ""


def load_utterance(u: Utterance, sample_rate: int = 16000) -> np.ndarray:
    """`u`'s audio (`load_audio`); an AudioError names its manifest line as well as the file."""
    try:
        return load_audio(u.audio, sample_rate)
    except AudioError as e:
        raise AudioError(f"{u.source or u.id}: {e}") from None


def load_batch(utterances: list[Utterance], sample_rate: int = 16000) -> AudioBatch:
    """Read the audio of `utterances` (mono, resampled to `sample_rate`) now."""
    return AudioBatch(list(utterances), [load_utterance(u, sample_rate) for u in utterances], sample_rate)


def lazy_batch(utterances: list[Utterance], sample_rate: int = 16000, augmenter: Augmenter | None = None,
               epoch: int = 0, workers: int = 0) -> AudioBatch:
    """A batch whose audio is read (and augmented) when first used, several at once on `workers`
    decoding threads; variants drawn by `augmenter`."""
    utts = list(utterances)
    variants = [augmenter.pick(u, epoch) for u in utts] if augmenter else [0] * len(utts)

    def make(i: int) -> np.ndarray:
        wav = load_utterance(utts[i], sample_rate)
        return augmenter.apply(wav, utts[i], variants[i], sample_rate) if augmenter and variants[i] else wav

    return AudioBatch(utts, LazyWaveforms(make, len(utts), workers), sample_rate, variants,
                      augmenter.tag if augmenter else "")


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
    _cached: tuple[int, np.ndarray] | None = field(default=None, init=False, repr=False)

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

    def _epoch_order(self, epoch: int) -> np.ndarray:
        """`_order(epoch)`, drawn once per epoch (not once per batch: O(corpus) work a step)."""
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, self._order(epoch))
        return self._cached[1]

    def next_indices(self, count: int | None = None, exclude: Sequence[int] = ()) -> list[int]:
        """The next `count` (default `batch_size`) items of the epoch's order; an epoch's tail shorter
        than that starts the next epoch. `exclude` is for samplers that draw with weights: the
        epoch order never repeats an item within an epoch."""
        k = self.batch_size if count is None else min(count, self.num_items)
        if self.position.index + k > self.num_items:
            self.position = DataPosition(self.position.epoch + 1, 0)
        start = self.position.index
        idx = self._epoch_order(self.position.epoch)[start:start + k]
        self.position = DataPosition(self.position.epoch, start + k)
        return [int(i) for i in idx]

    def signal_prior(self, index: Sequence[int]) -> list[float | None]:
        """What this sampler knows of each item's chance to give a group with signal: nothing."""
        return [None] * len(index)

    @property
    def epoch(self) -> int:
        return self.position.epoch

    def feedback(self, index, rewards) -> None:
        """Scored groups change nothing here (`SignalSampler` learns from them)."""

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict:
        return asdict(self.position)

    def load_state_dict(self, state: dict) -> None:
        self.position = DataPosition(**state)


# Prompt positions per second of audio after a Whisper-style encoder (50 frames/s) and the adapter's
# 2x pooling: what makes a context list's characters comparable with the audio's seconds.
POSITIONS_PER_SECOND = 25.0


def prompt_length(item) -> float:
    """What bucketing sorts by: an utterance's seconds of audio plus its context list's characters
    in seconds of audio positions (a 100-item list is as long as ~30 s of audio); 0 for other items."""
    return float(prompt_lengths([item])[0])


def prompt_lengths(items) -> np.ndarray:
    """`prompt_length` of each item `(n,)`; a packed table's from its columns (the index's
    durations: no row decoded, no audio opened)."""
    return durations_of(items) + context_chars_of(items) / POSITIONS_PER_SECOND


class BatchLoader:
    """Seeded batches from a list of utterances (a lazily loaded `AudioBatch` each, with
    augmentation variants from `augmenter`) or of other items (given to `make_batch`, e.g. text
    prompts); `state_dict` makes it resumable. `sampler` replaces the seeded epochs (e.g. a
    `SignalSampler`, data/signal_sampler.py, which `feedback` informs)."""

    def __init__(self, utterances: list, batch_size: int, seed: int = 0, shuffle: bool = True,
                 sample_rate: int = 16000, bucket_batches: int = 0, make_batch=None,
                 augmenter: Augmenter | None = None, sampler=None, decode_workers: int = 0):
        self.utterances = utterances
        self.decode_workers = decode_workers
        self.sample_rate = sample_rate
        self.make_batch = make_batch
        self.augmenter = augmenter
        lengths = prompt_lengths(utterances) if bucket_batches > 0 else None
        self.sampler = sampler if sampler is not None else UtteranceSampler(
            len(utterances), batch_size, seed=seed, shuffle=shuffle, lengths=lengths, bucket_batches=bucket_batches)
        # item -> (item, index) of the items drawn lately, for `feedback` (16 batches: more than an
        # asynchronous loop's lag and its refill rounds); a map of the whole set would cost ~100
        # bytes an item, and a packed table's items are made when drawn
        self._drawn: dict[int, tuple[object, int]] = {}
        self._keep_drawn = max(4096, 16 * batch_size)

    def next_batch(self, enough: Callable[[list], bool] | None = None, max_items: int = 0, first: int = 0):
        """The sampler's next batch; with `enough`, a batch grown a few items at a time from `first`
        items until `enough(priors)` holds for the sampler's `signal_prior` of the items drawn, or
        `max_items` are drawn (trainer/rollout/refill.py plans a round of rollouts this way)."""
        index = self.sampler.next_indices(first or None)
        step = max(1, self.sampler.batch_size // 4)
        while enough is not None and len(index) < max_items and not enough(self.sampler.signal_prior(index)):
            index += self.sampler.next_indices(min(step, max_items - len(index)), exclude=index)
        items = [self.utterances[i] for i in index]
        self._remember(items, index)
        if self.make_batch is not None:
            return self.make_batch(items)
        return lazy_batch(items, self.sample_rate, self.augmenter, self.epoch, self.decode_workers)

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def feedback(self, items: list, rewards: list[list[float]]) -> None:
        """Each drawn item's scored group (`rewards[k]`, all its members') back to the sampler."""
        try:
            index = [self._drawn[id(item)][1] for item in items]
        except KeyError:
            raise ValueError("feedback names an item this loader did not draw") from None
        self.sampler.feedback(index, rewards)

    def _remember(self, items: list, index: list[int]) -> None:
        for item, i in zip(items, index):
            self._drawn.pop(id(item), None)  # re-inserted last: the dict keeps the order drawn
            self._drawn[id(item)] = (item, i)  # the item held: its id() stays its own
        while len(self._drawn) > self._keep_drawn:
            del self._drawn[next(iter(self._drawn))]

    def metrics(self) -> dict[str, float]:
        """The sampler's `sampler/*` logs (none for the uniform one)."""
        return self.sampler.metrics()

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)


def iter_batches(utterances: list[Utterance], batch_size: int, sample_rate: int = 16000):
    """One ordered pass (for evaluation), the last batch possibly smaller."""
    for start in range(0, len(utterances), batch_size):
        yield load_batch(utterances[start:start + batch_size], sample_rate)
