"""The workers as Ray actors: a policy worker (one DeepSpeed data-parallel rank of the policy and,
colocated, the reference model and the critic: the local backend's `PolicyWorker`), and reference
and critic workers of separate groups. Nothing here is RL math.
"""
from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

import ray
import torch

from asr_rl.models.loading import build_critic, load_rl_policy
from asr_rl.trainer.rollout.engines import build_engine, engine_spec, samples_in_engine_actors
from asr_rl.trainer.rollout.experience import Experience
from asr_rl.trainer.update.ppo import forward_logprobs, forward_values
from asr_rl.trainer.update.strategy import total_optimizer_steps
from asr_rl.trainer.update.worker import train_critic


@ray.remote(num_cpus=1)
class RayPolicyWorker:
    """A DeepSpeed data-parallel rank of the policy: one `PolicyWorker` (trainer/update/worker.py)
    with DeepSpeed strategies, plus what only a distributed rank does (the weight broadcast)."""

    def __init__(self, rank: int, world_size: int, master_addr: str, master_port: int):
        from asr_rl.trainer.distributed.deepspeed_strategy import init_distributed

        self.rank, self.world_size = rank, world_size
        _quiet_worker(rank)
        init_distributed(rank, world_size, master_addr, master_port)

    def setup(self, cfg, device: str, with_ref: bool, with_critic: bool, text: bool = False) -> dict:
        """Load the policy (+ colocated reference, + colocated critic) and wrap the trainable models
        in DeepSpeed."""
        from asr_rl.trainer.distributed.deepspeed_strategy import DeepSpeedStrategy
        from asr_rl.trainer.update.worker import PolicyWorker

        self.cfg = cfg
        torch.manual_seed(cfg.seed)
        policy = load_rl_policy(cfg, cfg.pretrain, device, text)
        # The reference is copied before DeepSpeed partitions anything (ZeRO-3 would copy stubs), and
        # under ZeRO-3 shares nothing with the policy, whose tensors DeepSpeed then re-partitions.
        ref = policy.reference_copy(share_frozen=cfg.distributed.zero_stage < 3) if with_ref else None
        critic = build_critic(cfg, device, text, policy) if with_critic else None
        common = _strategy_kwargs(cfg, self.world_size)
        policy_strategy = DeepSpeedStrategy(policy.model, [p for _, p in policy.trainable_parameters()],
                                            lr=cfg.optim.actor_learning_rate, **common)
        critic_strategy = (DeepSpeedStrategy(critic, critic.trainable_parameters(), lr=cfg.optim.critic_learning_rate,
                                             **common) if critic else None)
        # the policy ranks sample with their own engine unless engine actors do
        engine = None if samples_in_engine_actors(cfg) else build_engine(cfg, policy)
        self.worker = PolicyWorker(cfg, policy, ref, critic, policy_strategy, critic_strategy, engine,
                                   rank=self.rank, world_size=self.world_size)
        self.policy, self.policy_strategy = policy, policy_strategy
        return {"pad_id": policy.pad_id, "eos_id": policy.eos_id, "rank": self.rank, "pid": os.getpid(),
                "node": ray.get_runtime_context().get_node_id()}

    def report_memory(self, longest, device: str, cache_bytes: int = 0) -> None:
        """Log this rank's estimate (ZeRO partitioning included) and warn when it will not fit."""
        self.worker.report_memory(longest, device, deepspeed=True, cache_bytes=cache_bytes)

    def encode(self, batch) -> list:
        return self.worker.encode(batch)

    def sample(self, rows: list, n: int, seeds: list[int]) -> list:
        return self.worker.sample(rows, n, seeds)

    def annotate(self, exp: Experience, need_old_logp: bool) -> dict:
        return self.worker.annotate(exp, need_old_logp)

    def train(self, exp: Experience, step: int, kl_coef: float, separate_critic: bool = False) -> dict:
        return self.worker.train(exp, step, kl_coef, separate_critic)

    def evaluate(self, utterances: list, eval_cfg) -> list:
        return self.worker.transcribe(utterances, eval_cfg)

    # --- weights -------------------------------------------------------------------------
    def prompt_embeds(self, rows: list) -> list:
        """Unpadded prompt embeddings `(P_i, H)` for engine actors fed embeddings (`EngineSpec.feed_embeds`),
        projector with the current weights."""
        import torch

        if not rows:
            with self.policy_strategy.gathered(list(self.policy.model.parameters())):
                return []
        with torch.no_grad(), self.policy_strategy.gathered(list(self.policy.model.parameters())):
            embeds, mask = self.policy.embed_rows(rows)
            return [e[m.bool()].cpu() for e, m in zip(embeds, mask)]

    def send_weights(self, host: str, port: int, world_size: int) -> int:
        """Rank 0 broadcasts to the engine actors the weights the engine's spec names
        (`EngineSpec.weights`: the LLM's, LoRA merged, or every trainable tensor); all ranks
        gather (ZeRO-3)."""
        from asr_rl.trainer.distributed.weight_sync import WeightSyncSender

        with self.policy_strategy.gathered(list(self.policy.model.parameters())):
            if self.rank != 0:
                return 0
            tensors = engine_spec(self.cfg).weights(self.policy)
            sender = WeightSyncSender(host, port, world_size)
            try:
                return sender.send(tensors)
            finally:
                sender.close()

    # --- checkpoints ---------------------------------------------------------------------
    def save_model(self, path: str) -> None:
        self.worker.save_model(path)

    def save_engine_state(self, folder: str) -> None:
        self.policy_strategy.save(Path(folder) / "deepspeed_actor")  # the folder name older checkpoints have
        if self.worker.critic_strategy is not None:
            self.worker.critic_strategy.save(Path(folder) / "deepspeed_critic")

    def load_engine_state(self, folder: str) -> None:
        self.policy_strategy.load(Path(folder) / "deepspeed_actor")
        if self.worker.critic_strategy is not None:
            self.worker.critic_strategy.load(Path(folder) / "deepspeed_critic")

    def ping(self) -> int:
        return self.rank


@ray.remote(num_cpus=1)
class RayReferenceWorker:
    """The frozen reference model in its own process (`colocate_actor_ref=false`): reference
    log-probs of a shard of experience. Inference only: no optimizer, no process group."""

    def __init__(self, rank: int, cfg, device: str, text: bool):
        _quiet_worker(rank)
        torch.manual_seed(cfg.seed)
        self.rank, self.cfg = rank, cfg
        self.ref = load_rl_policy(cfg, cfg.pretrain, device, text).eval().requires_grad_(False)

    def annotate(self, exp: Experience) -> dict:
        return {"ref_logp": forward_logprobs(self.ref, exp, self.cfg.optim.micro_train_batch_size,
                                             self.cfg.rollout.temperature)}


@ray.remote(num_cpus=1)
class RayCriticWorker:
    """One DeepSpeed data-parallel rank of the critic in its own group (`colocate_all=false` or
    `colocate_critic=false`): values for a shard of experience, and the critic update on it."""

    def __init__(self, rank: int, world_size: int, master_addr: str, master_port: int, cfg, device: str,
                 text: bool):
        from asr_rl.trainer.distributed.deepspeed_strategy import DeepSpeedStrategy, init_distributed

        _quiet_worker(rank)
        self.rank, self.world_size, self.cfg = rank, world_size, cfg
        init_distributed(rank, world_size, master_addr, master_port)
        torch.manual_seed(cfg.seed)
        self.critic = build_critic(cfg, device, text)
        self.strategy = DeepSpeedStrategy(self.critic, self.critic.trainable_parameters(),
                                          lr=cfg.optim.critic_learning_rate, **_strategy_kwargs(cfg, world_size))

    def annotate(self, exp: Experience) -> dict:
        with self.strategy.gathered(list(self.critic.parameters())):
            return {"values": forward_values(self.critic, exp, self.cfg.optim.micro_train_batch_size)}

    def train(self, exp: Experience, step: int) -> dict:
        o = self.cfg.optim
        train_size = (o.train_batch_size // self.world_size) if o.train_batch_size else len(exp)
        return train_critic(self.critic, self.strategy, exp, self.cfg, train_size, step)

    def save_engine_state(self, folder: str) -> None:
        self.strategy.save(Path(folder) / "deepspeed_critic")

    def load_engine_state(self, folder: str) -> None:
        self.strategy.load(Path(folder) / "deepspeed_critic")


def _quiet_worker(rank: int) -> None:
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING)  # rank-0 logs only
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch.distributed deprecations, per call
    from asr_rl.utils import quiet_transformers

    quiet_transformers()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))


def _strategy_kwargs(cfg, world_size: int) -> dict:
    d, o = cfg.distributed, cfg.optim
    return dict(optim_cfg=o, total_steps=total_optimizer_steps(cfg), zero_stage=d.zero_stage,
                micro_batch=o.micro_train_batch_size, world_size=world_size, bf16=d.bf16,
                offload_optimizer=d.adam_offload)
