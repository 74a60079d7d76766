"""The roles the RL loop (loop.py) calls, one protocol each, and `Backend`, all of them on one
object: where the workers of each role run is the backend's business, not the loop's.

Words used throughout the trainer:
- a *worker* holds a model (or a shard of it, one data-parallel rank) and does one role: the
  policy worker (trainer/update/worker.py) samples, scores log-probs and updates; the reference and
  critic workers score; engine and reward workers sample and score apart from them;
- a *backend* places the workers: `LocalBackend` (local.py) in this process, `RayBackend`
  (trainer/distributed/ray_backend.py) as Ray actors (the word *actor* is kept for Ray's class;
  the RL policy is the *policy*, also where OpenRLHF says actor, except in its option names);
- a *rank* is only a worker's index among the policy's data-parallel workers.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from asr_rl.trainer.rollout.experience import Experience, Sampled


@runtime_checkable
class RolloutRole(Protocol):
    """Prompts in, sampled responses out (the rollout engine's side of a step)."""

    pad_id: int
    eos_id: int

    def encode(self, batch) -> list:
        """Prompt rows (`PromptRow`) for a batch."""

    def sample(self, rows: list, n: int, seeds: list[int]) -> list[Sampled]:
        """n responses per prompt row with the engine's log-probs; one seed per response."""

    def submit(self, rows: list, n: int, seeds: list[int]):
        """Start sampling as `sample` does; returns a handle at once where the engines run apart
        (engine workers), else after sampling."""

    def collect(self, handle) -> tuple[list[Sampled], int]:
        """The samples of a `submit`, and the weights version (updates applied) that produced them."""

    def decode(self, ids: list[int]) -> str: ...

    def parse(self, text: str, language: str | None): ...

    def target_ids(self, texts: list[str], languages: list[str | None]) -> list[list[int]]:
        """Reference transcripts as response token ids (EOS included), in the policy's target
        encoding (`rollout.reference_in_group`)."""


@runtime_checkable
class TrainRole(Protocol):
    """Log-probs, values and the update (policy, reference and critic workers). Experience travels
    whole; a backend shards it over its ranks by whole groups (`group_multiple`: the kept groups
    per step are a multiple of it)."""

    group_multiple: int

    def report_memory(self, longest, device: str, cache_bytes: int = 0) -> None:
        """Log one policy worker's memory estimate for the longest utterance and an encoder cache
        of `cache_bytes` in RAM, before the first step."""

    def annotate(self, exp: Experience, need_old_logp: bool) -> None:
        """Fill `old_logp`, `ref_logp` and `values` as the run needs them."""

    def train(self, exp: Experience, step: int, kl_coef: float) -> dict[str, float]:
        """One policy (and critic) update on the experience; metrics averaged over ranks."""

    def sync_weights(self, version: int) -> None:
        """The rollout engine gets the updated weights (`version` updates applied)."""

    def evaluate(self, manifest: str, eval_cfg, options=None) -> dict[str, float]:
        """Decode a dev manifest (read with `options`: the training set's reading options) with the
        current policy; `eval/*` metrics."""


@runtime_checkable
class CheckpointRole(Protocol):
    """What a checkpoint holds of the workers, and how a resume puts it back."""

    def save_model(self, path) -> None: ...

    def save_engine_state(self, folder) -> None:
        """Optimiser state the backend keeps outside `state_dict` (DeepSpeed's own checkpoint)."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict, ckpt) -> None:
        """Restore weights and optimiser state (the loop then syncs the engine)."""


@runtime_checkable
class Backend(RolloutRole, TrainRole, CheckpointRole, Protocol):
    """Every role of an RL run on one object (the scoring role is the reward, rewards/pipeline.py)."""

    def shutdown(self) -> None: ...


__all__ = ["RolloutRole", "TrainRole", "CheckpointRole", "Backend"]
