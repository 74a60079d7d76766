"""The two interfaces of the RL loop: `Workers`, the backend the loop calls (loop.py), and
`RolloutEngine`, what samples the responses (trainer/rl/engines.py keeps the registry of them).

`LocalWorkers` (workers.py) and `RayWorkers` (distributed/ray_workers.py) implement `Workers`;
`HFRolloutEngine` (engines.py) and `VLLMRolloutEngine` (distributed/vllm_engine.py) implement
`RolloutEngine`.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

import torch

from asr_rl.trainer.rl.rollout import Experience, Sampled


@runtime_checkable
class Workers(Protocol):
    """The backend of an RL run, as the loop sees it. Experience travels whole; a backend shards
    it over its ranks by whole groups (`group_multiple`: the kept groups per step are a multiple
    of it)."""

    pad_id: int
    eos_id: int
    group_multiple: int

    def report_memory(self, longest, device: str) -> None:
        """Log one policy rank's memory estimate for the longest utterance, before the first step."""

    def evaluate(self, manifest: str, eval_cfg) -> dict[str, float]:
        """Decode a dev manifest; `eval/*` metrics."""

    def encode(self, batch) -> list:
        """Prompt rows (`PromptRow`) for a batch."""

    def sample(self, rows: list, n: int, seeds: list[int]) -> list[Sampled]:
        """n responses per prompt row with the engine's log-probs; one seed per response."""

    def submit(self, rows: list, n: int, seeds: list[int]):
        """Start sampling as `sample` does; returns a handle at once where the engines run apart
        (engine actors), else after sampling."""

    def collect(self, handle) -> tuple[list[Sampled], int]:
        """The samples of a `submit`, and the weights version (updates applied) that produced them."""

    def decode(self, ids: list[int]) -> str: ...

    def parse(self, text: str, language: str | None): ...

    def target_ids(self, texts: list[str], languages: list[str | None]) -> list[list[int]]:
        """Reference transcripts as response token ids (EOS included), in the policy's target
        encoding (`rollout.reference_in_group`)."""

    def annotate(self, exp: Experience, need_old_logp: bool) -> None:
        """Fill `old_logp`, `ref_logp` and `values` as the run needs them."""

    def train(self, exp: Experience, step: int, kl_coef: float) -> dict[str, float]:
        """One policy (and critic) update on the experience; metrics averaged over ranks."""

    def sync_weights(self, version: int) -> None:
        """The rollout engine gets the updated weights (`version` updates applied)."""

    def save_model(self, path) -> None: ...

    def save_engine_state(self, folder) -> None:
        """Optimiser state the backend keeps outside `state_dict` (DeepSpeed's own checkpoint)."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict, ckpt) -> None:
        """Restore weights and optimiser state (the loop then syncs the engine)."""

    def shutdown(self) -> None: ...


@runtime_checkable
class RolloutEngine(Protocol):
    """Samples n responses per prompt for one policy. An engine is built on a policy
    (`build(policy, cfg)`, the registry entry) and reads the weights from it or holds its own copy.

    In process (the local backend, Ray trainer ranks) the loop calls `generate`, then
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
        """Apply weights received from trainer rank 0 (an engine actor), named as the spec's
        `weights` function names them; returns how many tensors were applied."""

    def close(self) -> None:
        """Release what the engine holds (processes, memory, exported folders)."""


class EmbedsRolloutEngine(RolloutEngine, Protocol):
    """An engine whose actors are fed prompt embeddings (`EngineSpec.feed_embeds`): it serves only
    the causal LLM, the trainer ranks build the embeddings (audio states cached there)."""

    def generate_from_embeds(self, prompt_embeds: list[torch.Tensor], n: int, rollout,
                             seeds: list[int] | None) -> list[Sampled]:
        """As `generate`, from unpadded prompt embeddings `[(P_i, H)]`."""


__all__ = ["Workers", "RolloutEngine", "EmbedsRolloutEngine"]
