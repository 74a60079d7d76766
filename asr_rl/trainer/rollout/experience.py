"""Rollout: sample a group of responses per prompt, score them, keep the informative groups, and
assemble the step's `Experience`.

Groups whose rewards all tie give every sample zero advantage under a group baseline: they cost a
full training pass and teach nothing, so `dynamic_filtering` drops them and samples more prompts to
refill the batch (DAPO, Yu et al. 2025, arXiv:2503.14476, "dynamic sampling").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from asr_rl.rewards.base import RewardOutput, Sample


@dataclass
class Sampled:
    """What a rollout engine returns for one prompt: n token-id lists (EOS included when emitted)
    and the engine's log-prob of each token under the distribution it sampled from (after
    temperature, top-k and top-p: vLLM's `processed_logprobs`), for the mismatch correction."""

    ids: list[list[int]]
    logps: list[list[float]] | None = None


@dataclass
class Group:
    """One prompt with its n sampled responses and (after scoring) their rewards."""

    item: Any                      # the Utterance (audio) or prompt record (text)
    prompt: Any                    # its PromptRow (ids + cached encoder states)
    responses: list[list[int]]     # n token-id lists, EOS included when emitted
    texts: list[str]
    rewards: list[float] = field(default_factory=list)
    terms: dict[str, list[float]] = field(default_factory=dict)
    rollout_logps: list[list[float]] | None = None  # the engine's per-token log-probs
    policy_version: int | None = None  # updates in the weights that sampled it (async: behind the trainer)
    off_policy: list[bool] | None = None  # per response: not sampled by the policy (None: all sampled)

    @property
    def informative(self) -> bool:
        return max(self.rewards) - min(self.rewards) > 1e-6


@dataclass
class Experience:
    """Everything the update needs for B prompts x n samples (rows b*n .. b*n+n-1 = group b).

    Attributes:
        groups: the B groups, in row order.
        response_ids: `(B*n, T)` right-padded response ids.
        response_mask: `(B*n, T)` 1 for response tokens.
        rewards: `(B*n,)` sequence rewards.
        old_logp / ref_logp / values / advantages / returns: `(B*n, T)`, filled by later stages.
        rollout_logp: `(B*n, T)` the rollout engine's log-probs (0 at padding), None when unknown.
        off_policy: `(B*n,)` bool, the rows the policy did not sample (a group's reference
            transcript, `add_references`); None when every row is sampled.
    """

    groups: list[Group]
    group_size: int
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    rewards: torch.Tensor
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    values: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    rollout_logp: torch.Tensor | None = None
    off_policy: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    @property
    def policy_versions(self) -> list[int | None]:
        """Per group, the updates in the weights that sampled it (the trainer is at `step - 1`)."""
        return [g.policy_version for g in self.groups]

    @property
    def prompt_rows(self) -> list:
        return [g.prompt for g in self.groups]

    def subset_groups(self, group_idx) -> "Experience":
        """The experience of groups `group_idx` (for sharding over data-parallel ranks)."""
        group_idx = list(group_idx)
        rows = torch.as_tensor([g * self.group_size + j for g in group_idx for j in range(self.group_size)],
                               dtype=torch.long)
        pick = lambda t: None if t is None else t[rows]  # noqa: E731
        return Experience([self.groups[g] for g in group_idx], self.group_size, self.response_ids[rows],
                          self.response_mask[rows], self.rewards[rows], pick(self.old_logp), pick(self.ref_logp),
                          pick(self.values), pick(self.advantages), pick(self.returns), pick(self.rollout_logp),
                          pick(self.off_policy))

    def select(self, seq_idx: list[int]) -> "MicroBatch":
        """Sequences `seq_idx` with the prompt rows they need and the index mapping them."""
        groups = sorted({i // self.group_size for i in seq_idx})
        pos = {g: k for k, g in enumerate(groups)}
        index = torch.as_tensor([pos[i // self.group_size] for i in seq_idx], dtype=torch.long)
        idx = torch.as_tensor(seq_idx, dtype=torch.long)
        pick = lambda t: None if t is None else t[idx]  # noqa: E731
        return MicroBatch([self.groups[g].prompt for g in groups], index, self.response_ids[idx],
                          self.response_mask[idx], pick(self.old_logp), pick(self.ref_logp), pick(self.values),
                          pick(self.advantages), pick(self.returns), [self.groups[g].item for g in groups],
                          pick(self.rollout_logp), pick(self.off_policy))


@dataclass
class MicroBatch:
    prompt_rows: list
    prompt_index: torch.Tensor  # (m,) row of `prompt_rows` each sequence belongs to
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    old_logp: torch.Tensor | None
    ref_logp: torch.Tensor | None
    values: torch.Tensor | None
    advantages: torch.Tensor | None
    returns: torch.Tensor | None
    items: list = field(default_factory=list)  # the prompts' Utterances (references for `algo.sft_coef`)
    rollout_logp: torch.Tensor | None = None
    off_policy: torch.Tensor | None = None  # (m,) bool, see `Experience.off_policy`


def build_experience(groups: list[Group], group_size: int, pad_id: int) -> Experience:
    rows = [r for g in groups for r in g.responses]
    width = max(1, max(len(r) for r in rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.as_tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    rewards = torch.as_tensor([r for g in groups for r in g.rewards], dtype=torch.float32)
    rollout_logp = None
    if all(g.rollout_logps is not None for g in groups):
        rollout_logp = torch.zeros((len(rows), width), dtype=torch.float32)
        for i, lp in enumerate(lp for g in groups for lp in g.rollout_logps):
            rollout_logp[i, : len(lp)] = torch.as_tensor(lp, dtype=torch.float32)
    off_policy = None
    if any(g.off_policy for g in groups):
        off_policy = torch.as_tensor([o for g in groups for o in (g.off_policy or [False] * len(g.responses))])
    return Experience(groups, group_size, ids, mask, rewards, rollout_logp=rollout_logp, off_policy=off_policy)


def add_references(groups: list[Group], references: list[list[int]], decode) -> None:
    """Each group gets its utterance's reference transcript as a last, off-policy member (LUFFY's
    off-policy guidance, arXiv:2504.14945; `rollout.reference_in_group`), to be scored with the
    samples: `references[b]` are its token ids in the policy's target encoding (EOS included),
    `decode(ids)` its text. Its engine log-probs do not exist: 0 (the loss leaves such rows out
    of the rollout correction)."""
    for g, ref in zip(groups, references, strict=True):
        g.off_policy = [False] * len(g.responses) + [True]
        g.responses = [*g.responses, list(ref)]
        g.texts = [*g.texts, decode(ref)]
        if g.rollout_logps is not None:
            g.rollout_logps = [*g.rollout_logps, [0.0] * len(ref)]


def make_samples(groups: list[Group], parse) -> list[Sample]:
    """Reward inputs for every response; `parse(text, language)` -> (language, transcript, well_formed)."""
    samples = []
    for gid, g in enumerate(groups):
        item = g.item
        for text in g.texts:
            lang, transcript, ok = parse(text, getattr(item, "language", None))
            samples.append(Sample(
                hypothesis=transcript, reference=item.text if hasattr(item, "text") else getattr(item, "label", ""),
                language=getattr(item, "language", None), keywords=tuple(getattr(item, "keywords", ()) or ()),
                prompt=getattr(item, "prompt_text", None) or getattr(item, "id", ""), response=text,
                predicted_language=lang, well_formed=ok, duration=getattr(item, "duration", None), group_id=gid,
                context=tuple(getattr(item, "context", ()) or ()), audio=_audio_ref(item),
                metadata=dict(getattr(item, "meta", {}) or {})))
    return samples


def _audio_ref(item) -> str | None:
    """The audio reference a listening reward term opens (`load_audio`'s argument), as a string."""
    audio = getattr(item, "audio", None)
    return None if audio is None else str(audio)


def attach_rewards(groups: list[Group], out: RewardOutput) -> None:
    """Split a flat RewardOutput back onto the groups (in sample order)."""
    k = 0
    for g in groups:
        n = len(g.texts)
        g.rewards = out.rewards[k:k + n]
        g.terms = {name: vals[k:k + n] for name, vals in out.terms.items()}
        k += n


def merge_reward_outputs(groups: list[Group], extra_logs: dict[str, float] | None = None) -> RewardOutput:
    """The rewards of the sampled members, for the logs (a reference member is left out: the curve
    is the policy's)."""
    terms: dict[str, list[float]] = {}
    rewards: list[float] = []
    for g in groups:
        keep = [not o for o in g.off_policy] if g.off_policy else [True] * len(g.rewards)
        rewards += [r for r, k in zip(g.rewards, keep) if k]
        for name, vals in g.terms.items():
            terms.setdefault(name, []).extend(v for v, k in zip(vals, keep) if k)
    return RewardOutput(rewards, terms=terms, extra_logs=extra_logs or {})
