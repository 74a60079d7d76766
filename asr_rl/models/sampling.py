"""Placement-invariant sampling: each sequence draws its randomness from its own seeded generator.

With one global RNG, what a prompt samples depends on which other prompts share its batch and on
which rank generates it, so a 2-rank run could never reproduce a 1-process run, nor a resumed run
an uninterrupted one. Here sequence i adds Gumbel noise from `Generator(seed_i)` to its
temperature-scaled, top-k/top-p-filtered logits and takes the argmax: by the Gumbel-max trick that
is an exact sample from the same distribution (Gumbel 1954; Maddison et al. 2014, arXiv:1411.0030),
and it depends only on (seed_i, the logits).
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


class SeededGumbelSampler(LogitsProcessor):
    """Use with greedy decoding: argmax(filtered logits + Gumbel noise of row i's generator)."""

    def __init__(self, seeds: list[int], temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0):
        self.generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if scores.shape[0] != len(self.generators):
            raise ValueError(f"{scores.shape[0]} sequences but {len(self.generators)} seeds")
        filtered = filter_logits(scores.float(), self.temperature, self.top_k, self.top_p)
        vocab = scores.shape[-1]
        u = torch.stack([torch.rand(vocab, generator=g) for g in self.generators]).to(scores.device)
        gumbel = -torch.log(-torch.log(u.clamp(1e-20, 1.0 - 1e-7)))
        return filtered + gumbel
