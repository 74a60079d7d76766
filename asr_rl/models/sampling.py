"""Placement-invariant sampling: each sequence draws its randomness from its own seeded counter.

With one global RNG, what a prompt samples depends on which other prompts share its batch and on
which rank generates it, so a 2-rank run could never reproduce a 1-process run, nor a resumed run
an uninterrupted one. Here sequence i draws one uniform u keyed by (seed_i, decoding step) from a
counter-based hash and takes the token where u falls in the cumulative distribution of its
temperature-scaled, top-k/top-p-filtered probabilities (inverse-CDF sampling: exact for any
distribution, Devroye 1986, ch. II.2), so the draw depends only on (seed_i, the logits) and costs
one hash per sequence and step, not one per vocabulary entry.

`SeededGumbelSampler` is the earlier form, kept as the reference the tests compare with: Gumbel
noise keyed by (seed_i, step, token) on every vocabulary entry, then the argmax (the Gumbel-max
trick, Gumbel 1954; Maddison et al. 2014, arXiv:1411.0030): the same distribution, other draws, and
a hash for each of the vocabulary's entries at every step (at 152k entries it dominated rollouts).
"""
from __future__ import annotations

import hashlib

import torch
from transformers import LogitsProcessor


def sequence_seed(*parts: object) -> int:
    """A stable 63-bit seed from any parts (run seed, step, utterance id, sample index)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def filter_logits(scores: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Temperature, then top-k, then nucleus (top-p) filtering, as HF's warpers apply them."""
    scores = scores / temperature
    if top_k and top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False, dim=-1)
        cum = sorted_scores.softmax(-1).cumsum(-1)
        remove_sorted = cum <= (1 - top_p)
        remove_sorted[..., -1:] = False  # always keep the most likely token
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        scores = scores.masked_fill(remove, float("-inf"))
    return scores


def _signed(c: int) -> int:
    return c - (1 << 64) if c >= (1 << 63) else c


_GOLDEN, _MIX1, _MIX2 = _signed(0x9E3779B97F4A7C15), _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def splitmix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64 finaliser (Steele et al. 2014) on int64 tensors; multiplication wraps mod 2^64."""
    z = x + _GOLDEN
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    return z ^ _shr(z, 31)


def counter_uniform(seeds: torch.Tensor, step: int, vocab: int) -> torch.Tensor:
    """`(B, vocab)` uniforms in (0, 1): a pure function of (seed_b, step, token), computed at once
    for the whole batch (a counter-based RNG, like Philox, without per-row generator objects), on
    `seeds.device`: integer arithmetic, so a GPU draws the same numbers as the CPU."""
    row = splitmix64(seeds * 0x2545F4914F6CDD1D + step)
    z = splitmix64(row[:, None] + torch.arange(vocab, dtype=torch.int64, device=seeds.device)[None, :])
    return _unit(z)


def step_uniform(seeds: torch.Tensor, step: int) -> torch.Tensor:
    """`(B,)` uniforms in (0, 1), one per sequence: a pure function of (seed_b, step), keyed apart
    from `counter_uniform`'s per-token stream."""
    return _unit(splitmix64(splitmix64(seeds * 0x2545F4914F6CDD1D + step) ^ 0x5DEECE66D))


def _unit(z: torch.Tensor) -> torch.Tensor:
    """The top 53 bits of int64 hashes as float64 in (0, 1)."""
    return (_shr(z, 11).double() + 0.5) / float(1 << 53)


class SeededSampler:
    """One decoding step per `draw`: each row's token by inverse CDF at its own `step_uniform`."""

    def __init__(self, seeds: list[int], temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0):
        self.seeds = torch.as_tensor([int(s) for s in seeds], dtype=torch.int64)
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.step = 0

    def select(self, rows: torch.Tensor) -> None:
        """Keep the seeds of `rows` (the sequences still decoding)."""
        self.seeds = self.seeds[rows.to(self.seeds.device)]

    def draw(self, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`(B, V)` logits -> `(B,)` sampled tokens and their `(B,)` log-probs under the filtered
        distribution they were drawn from (vLLM's `processed_logprobs`)."""
        if scores.shape[0] != len(self.seeds):
            raise ValueError(f"{scores.shape[0]} sequences but {len(self.seeds)} seeds")
        self.seeds = self.seeds.to(scores.device)
        logp = torch.log_softmax(filter_logits(scores.float(), self.temperature, self.top_k, self.top_p), dim=-1)
        # the CDF in float64: a float32 running sum over 152k entries drifts by more than the
        # smallest probabilities it must resolve
        cdf = logp.double().exp().cumsum(-1)
        u = step_uniform(self.seeds, self.step) * cdf[:, -1]
        self.step += 1
        tokens = torch.searchsorted(cdf, u[:, None], right=True).squeeze(-1).clamp(max=scores.shape[-1] - 1)
        # u sits in a zero-probability gap only through rounding: take the nearest token with mass
        tokens = torch.where(torch.isfinite(logp.gather(-1, tokens[:, None]).squeeze(-1)), tokens, logp.argmax(-1))
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


class SeededGumbelSampler(LogitsProcessor):
    """Use with greedy decoding: argmax(filtered logits + Gumbel noise keyed by (seed_i, step))."""

    def __init__(self, seeds: list[int], temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0):
        self.seeds = torch.as_tensor([int(s) for s in seeds], dtype=torch.int64)
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.step = 0

    def select(self, rows: torch.Tensor) -> None:
        """Keep the seeds of `rows` (the sequences still decoding)."""
        self.seeds = self.seeds[rows.to(self.seeds.device)]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        return self._perturbed(filter_logits(scores.float(), self.temperature, self.top_k, self.top_p))

    def draw(self, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One decoding step: `(B,)` sampled tokens and their `(B,)` log-probs under the filtered
        distribution they were drawn from (vLLM's `processed_logprobs`)."""
        filtered = filter_logits(scores.float(), self.temperature, self.top_k, self.top_p)
        tokens = self._perturbed(filtered).argmax(-1)
        return tokens, torch.log_softmax(filtered, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)

    def _perturbed(self, filtered: torch.Tensor) -> torch.Tensor:
        if filtered.shape[0] != len(self.seeds):
            raise ValueError(f"{filtered.shape[0]} sequences but {len(self.seeds)} seeds")
        # on the logits' device: on a GPU, hashing B x 152k counters on the CPU each step (and
        # copying them over) took most of a 0.6B rollout (63 tokens/s on an H200)
        self.seeds = self.seeds.to(filtered.device)
        u = counter_uniform(self.seeds, self.step, filtered.shape[-1])
        self.step += 1
        return filtered + (-torch.log(-torch.log(u))).float()
