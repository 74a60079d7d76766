"""Rollout engines as Ray actors, apart from the policy ranks: an engine whose registry spec asks
for actors of its own (vLLM), or any engine when rollouts run asynchronously (`rollout.async_enable`).

Each actor holds its own copy of the policy and builds `rollout.engine` on it (trainer/rollout/engines.py).
What it is fed and which weights it receives are the engine's `EngineSpec`: prompt embeddings that
the policy ranks build (the audio states are cached there; vLLM serves only the LLM) or prompt
rows its own policy copy embeds; the LLM's weights, LoRA merged, or every trainable tensor. After
every update policy rank 0 broadcasts over a dedicated gloo group (NCCL on GPUs in a full
deployment), gathered parameter by parameter under ZeRO-3.

An actor runs one call at a time, in order: a weight sync queued behind a generation waits for it,
so a batch submitted before an update is sampled with the weights before it. `version` is the
number of updates the engines' weights have (the trainer's step at the last sync); `submit`
stamps each batch with the version that will generate it.
"""
from __future__ import annotations

from dataclasses import dataclass

import ray

from asr_rl.trainer.distributed.actor_group import RankFailed, free_port
from asr_rl.trainer.rollout.engines import build_engine, engine_spec


@ray.remote(num_cpus=0)
class RolloutEngineActor:
    def __init__(self, cfg, text: bool):
        from asr_rl.utils import quiet_transformers

        quiet_transformers()
        from asr_rl.models.loading import load_rl_policy

        self.cfg = cfg
        self.policy = load_rl_policy(cfg, cfg.pretrain, "cpu", text).eval()
        self.engine = build_engine(cfg, self.policy)
        self._generate = (self.engine.generate_from_embeds if engine_spec(cfg).feed_embeds
                          else self.engine.generate)

    def generate(self, prompts: list, n: int, seeds: list[int]) -> list:
        """`prompts`: what the engine's spec feeds it, prompt embeddings `(P_i, H)` or prompt rows."""
        return self._generate(prompts, n, self.cfg.rollout, seeds)

    def receive_weights(self, host: str, port: int, rank: int, world_size: int) -> int:
        from asr_rl.trainer.distributed.weight_sync import WeightSyncReceiver

        receiver = WeightSyncReceiver(host, port, rank, world_size)
        try:
            tensors = receiver.receive()
        finally:
            receiver.close()
        return self.engine.load_weights(tensors)


@dataclass
class Pending:
    """A submitted batch: the actors' results and the weights version that generates it."""

    refs: list
    version: int


class EngineGroup:
    """`vllm_num_engines` engine actors; a batch's prompts are split across them, weights go to all."""

    def __init__(self, cfg, ranks: list, text: bool = False):
        self.ranks, self.spec = ranks, engine_spec(cfg)
        self.engines = [RolloutEngineActor.remote(cfg, text) for _ in range(cfg.distributed.vllm_num_engines)]
        self._get([e.__ray_ready__.remote() for e in self.engines], "start")
        self.version = 0

    def _get(self, refs: list, what: str) -> list:
        try:
            return ray.get(refs)
        except ray.exceptions.RayActorError as e:
            raise RankFailed(f"a rollout engine actor died during `{what}` ({type(e).__name__}); the last "
                             "checkpoint is intact; resume with resume=auto") from None

    def submit(self, workers, rows: list, n: int, seeds: list[int]) -> Pending:
        """Start sampling (returns at once); an engine fed embeddings gets the policy ranks'."""
        prompts = workers.prompt_embeds(rows) if self.spec.feed_embeds else rows
        k = len(self.engines)
        size = (len(rows) + k - 1) // k
        refs = [e.generate.remote(prompts[s:s + size], n, seeds[s * n:(s + size) * n])
                for e, s in zip(self.engines, range(0, len(rows), size))]
        return Pending(refs, self.version)

    def collect(self, pending: Pending) -> list:
        return [g for part in self._get(pending.refs, "generate") for g in part]

    def sync(self, workers, version: int) -> None:
        """Rank 0 sends over a fresh gloo group; every rank joins (ZeRO-3 gathers the weights)."""
        port = free_port()
        world = 1 + len(self.engines)
        recv = [e.receive_weights.remote("127.0.0.1", port, i + 1, world) for i, e in enumerate(self.engines)]
        workers._all("send_weights", [("127.0.0.1", port, world)] * len(self.ranks))
        self._get(recv, "weight sync")
        self.version = version

    def shutdown(self) -> None:
        for e in self.engines:
            ray.kill(e)


__all__ = ["RolloutEngineActor", "EngineGroup", "Pending"]
