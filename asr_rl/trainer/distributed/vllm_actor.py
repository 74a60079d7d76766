"""vLLM rollout engines as Ray actors (`backend=ray`, `rollout.engine=vllm`).

Trainer ranks build the prompt embeddings (audio encoder + projector run on the trainer side, once
per utterance) and the engines sample from them. After every update trainer rank 0 broadcasts the
trainable LLM weights to all engines over a dedicated gloo group (NCCL on GPUs in a full
deployment), gathered parameter by parameter under ZeRO-3, and each engine reloads them and resets
its prefix cache.
"""
from __future__ import annotations

import ray

from asr_rl.trainer.distributed.actor_group import RankFailed, free_port


@ray.remote(num_cpus=0)
class VLLMEngineActor:
    def __init__(self, cfg, text: bool):
        from asr_rl.utils import quiet_transformers

        quiet_transformers()
        from asr_rl.trainer.common import load_rl_policy

        policy = load_rl_policy(cfg, cfg.pretrain, "cpu", text)
        from asr_rl.trainer.distributed.vllm_engine import VLLMRolloutEngine

        self.cfg = cfg
        self.engine = VLLMRolloutEngine(policy, cfg)

    def generate(self, embeds: list, n: int, seeds: list[int]) -> list:
        return self.engine.generate_from_embeds(embeds, n, self.cfg.rollout, seeds)

    def receive_weights(self, host: str, port: int, rank: int, world_size: int) -> int:
        from asr_rl.trainer.distributed.vllm_engine import WeightSyncReceiver

        receiver = WeightSyncReceiver(host, port, rank, world_size)
        try:
            return self.engine.load_weights(receiver.receive())
        finally:
            receiver.close()


class VLLMEngineGroup:
    """`vllm_num_engines` engine actors; prompts are split across them, weights go to all."""

    def __init__(self, cfg, ranks: list, text: bool = False):
        self.ranks = ranks
        self.engines = [VLLMEngineActor.remote(cfg, text) for _ in range(cfg.distributed.vllm_num_engines)]
        self._get([e.__ray_ready__.remote() for e in self.engines], "start")

    def _get(self, refs: list, what: str) -> list:
        try:
            return ray.get(refs)
        except ray.exceptions.RayActorError as e:
            raise RankFailed(f"a vLLM engine actor died during `{what}` ({type(e).__name__}); the last "
                             "checkpoint is intact; resume with resume=auto") from None

    def generate(self, workers, rows: list, n: int, seeds: list[int]) -> list:
        embeds = workers.prompt_embeds(rows)
        k = len(self.engines)
        size = (len(rows) + k - 1) // k
        refs = [e.generate.remote(embeds[s:s + size], n, seeds[s * n:(s + size) * n])
                for e, s in zip(self.engines, range(0, len(rows), size))]
        return [g for part in self._get(refs, "generate") for g in part]

    def sync(self, workers) -> None:
        """Rank 0 sends over a fresh gloo group; every rank joins (ZeRO-3 gathers the weights)."""
        port = free_port()
        world = 1 + len(self.engines)
        recv = [e.receive_weights.remote("127.0.0.1", port, i + 1, world) for i, e in enumerate(self.engines)]
        workers._all("send_weights", [("127.0.0.1", port, world)] * len(self.ranks))
        self._get(recv, "weight sync")

    def shutdown(self) -> None:
        for e in self.engines:
            ray.kill(e)
