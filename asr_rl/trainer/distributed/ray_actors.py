"""The Ray actors: a trainer rank (a DeepSpeed data-parallel rank of the policy and, colocated, the
reference model and the critic), and the reference and critic ranks of separate groups. Methods
unpack their inputs and delegate to the same functions the local backend uses (trainer/actor.py,
trainer/common.py); nothing here is RL math.
"""
from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

import ray
import torch

from asr_rl.trainer.actor import critic_update, forward_logprobs, forward_values, ppo_update
from asr_rl.trainer.memory import peak_memory_gib
from asr_rl.trainer.common import build_critic, load_rl_policy
from asr_rl.trainer.rollout import Experience


@ray.remote(num_cpus=1)
class TrainerRank:
    def __init__(self, rank: int, world_size: int, master_addr: str, master_port: int):
        from asr_rl.trainer.distributed.deepspeed_strategy import init_distributed

        self.rank, self.world_size = rank, world_size
        _quiet_worker(rank)
        init_distributed(rank, world_size, master_addr, master_port)

    def setup(self, cfg, device: str, with_ref: bool, with_critic: bool, text: bool = False) -> dict:
        """Load the policy (+ colocated reference, + colocated critic) and wrap the trainable models
        in DeepSpeed."""
        from asr_rl.trainer.distributed.deepspeed_strategy import DeepSpeedStrategy

        self.cfg = cfg
        torch.manual_seed(cfg.seed)
        self.policy = load_rl_policy(cfg, cfg.pretrain, device, text)
        # The reference is copied before DeepSpeed partitions anything (ZeRO-3 would copy stubs), and
        # under ZeRO-3 shares nothing with the policy, whose tensors DeepSpeed then re-partitions.
        self.ref = (self.policy.reference_copy(share_frozen=cfg.distributed.zero_stage < 3) if with_ref else None)
        self.critic = build_critic(cfg, device, text, self.policy) if with_critic else None
        common = _strategy_kwargs(cfg, self.world_size)
        self.actor = DeepSpeedStrategy(self.policy.model, [p for _, p in self.policy.trainable_parameters()],
                                       lr=cfg.optim.actor_learning_rate, **common)
        self.critic_strategy = (DeepSpeedStrategy(self.critic, self.critic.trainable_parameters(),
                                                  lr=cfg.optim.critic_learning_rate, **common) if self.critic else None)
        return {"pad_id": self.policy.pad_id, "rank": self.rank, "pid": os.getpid()}

    def report_memory(self, longest, device: str) -> None:
        """Log this rank's estimate (ZeRO partitioning included) and warn when it will not fit."""
        from asr_rl.trainer.memory import prompt_length, rank_estimate, report_memory

        prompt_len = prompt_length(self.policy, longest, self.cfg.data.sample_rate)
        report_memory(rank_estimate(self.cfg, self.policy, reference=self.ref is not None, prompt_len=prompt_len,
                                    world_size=self.world_size, deepspeed=True), device)

    # --- rollout -------------------------------------------------------------------------
    def encode(self, batch) -> list:
        return self.policy.encode_batch(batch)

    def sample(self, rows: list, n: int, seeds: list[int]) -> list:
        from asr_rl.trainer.workers import HFRolloutEngine

        self.policy.eval()
        with self.actor.gathered(list(self.policy.model.parameters())):
            return HFRolloutEngine(self.policy).generate(rows, n, self.cfg.rollout, seeds)

    # --- experience ----------------------------------------------------------------------
    def annotate(self, exp: Experience, need_old_logp: bool) -> dict:
        micro, temp = self.cfg.optim.micro_train_batch_size, self.cfg.rollout.temperature
        out = {}
        if need_old_logp:
            with self.actor.gathered(list(self.policy.model.parameters())):
                out["old_logp"] = forward_logprobs(self.policy, exp, micro, temp)
        if self.ref is not None:
            out["ref_logp"] = forward_logprobs(self.ref, exp, micro, temp)
        if self.critic is not None:
            with self.critic_strategy.gathered(list(self.critic.parameters())):
                out["values"] = forward_values(self.critic, exp, micro)
        return out

    def train(self, exp: Experience, step: int, kl_coef: float, separate_critic: bool = False) -> dict:
        _fault_hook(self.rank, step)
        cfg, o = self.cfg, self.cfg.optim
        train_size = (o.train_batch_size // self.world_size) if o.train_batch_size else len(exp)
        metrics = {}
        if self.critic is not None:
            metrics.update(_train_critic(self.critic, self.critic_strategy, exp, cfg, train_size, step))
        has_critic = self.critic is not None or separate_critic
        if not has_critic or step > cfg.freeze_critic_steps:  # PPO warm-up trains the critic alone
            self.policy.train()
            metrics.update(ppo_update(self.policy, self.actor, exp, cfg.algo, o.micro_train_batch_size, train_size,
                                      cfg.rollout.temperature, kl_coef, seed=cfg.seed + step))
        metrics["memory/peak_gib"] = peak_memory_gib()  # of this rank (GPU memory on CUDA); the mean over ranks
        return metrics

    def evaluate(self, utterances: list, eval_cfg) -> list:
        from asr_rl.evaluation.evaluate import transcribe

        with self.actor.gathered(list(self.policy.model.parameters())):
            return transcribe(self.policy, utterances, eval_cfg.eval_batch_size, eval_cfg.num_beams,
                              eval_cfg.eval_max_new_tokens) if utterances else []

    # --- weights -------------------------------------------------------------------------
    def named_llm_weights(self) -> list:
        """The policy's trainable weights (full, gathered under ZeRO-3) for the rollout engine."""
        params = [(n, p) for n, p in self.policy.model.named_parameters() if p.requires_grad]
        with self.actor.gathered([p for _, p in params]):
            return [(n, p.detach().cpu().clone()) for n, p in params] if self.rank == 0 else []

    def prompt_embeds(self, rows: list) -> list:
        """Unpadded prompt embeddings `(P_i, H)` for a vLLM engine (projector with the current weights)."""
        import torch

        if not rows:
            with self.actor.gathered(list(self.policy.model.parameters())):
                return []
        with torch.no_grad(), self.actor.gathered(list(self.policy.model.parameters())):
            embeds, mask = self.policy.embed_rows(rows)
            return [e[m.bool()].cpu() for e, m in zip(embeds, mask)]

    def send_weights(self, host: str, port: int, world_size: int) -> int:
        """Rank 0 broadcasts the LLM weights (LoRA merged) to the engines; all ranks gather (ZeRO-3)."""
        from asr_rl.trainer.distributed.vllm_engine import WeightSyncSender, llm_named_weights

        with self.actor.gathered(list(self.policy.model.parameters())):
            if self.rank != 0:
                return 0
            sender = WeightSyncSender(host, port, world_size)
            try:
                return sender.send(llm_named_weights(self.policy))
            finally:
                sender.close()

    def state_digest(self) -> dict:
        """Full trainable parameters (gathered), for tests that compare ranks and backends."""
        params = [(n, p) for n, p in self.policy.model.named_parameters() if p.requires_grad]
        with self.actor.gathered([p for _, p in params]):
            return {n: p.detach().cpu().clone() for n, p in params}

    # --- checkpoints ---------------------------------------------------------------------
    def save_model(self, path: str) -> None:
        """Every rank enters (ZeRO-3 gathers); rank 0 writes the HF folder."""
        with self.actor.gathered(list(self.policy.model.parameters())):
            if self.rank == 0:
                self.policy.save_pretrained(path)

    def save_engine_state(self, folder: str) -> None:
        self.actor.save(Path(folder) / "deepspeed_actor")
        if self.critic_strategy is not None:
            self.critic_strategy.save(Path(folder) / "deepspeed_critic")

    def load_engine_state(self, folder: str) -> None:
        self.actor.load(Path(folder) / "deepspeed_actor")
        if self.critic_strategy is not None:
            self.critic_strategy.load(Path(folder) / "deepspeed_critic")

    def ping(self) -> int:
        return self.rank


@ray.remote(num_cpus=1)
class ReferenceRank:
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
class CriticRank:
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
        return _train_critic(self.critic, self.strategy, exp, self.cfg, train_size, step)

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


def _fault_hook(rank: int, step: int) -> None:
    """Fault injection for tests: `ASR_RL_KILL_RANK=R:S` makes rank R exit hard at step S's update,
    like a node or process lost mid-step."""
    if os.environ.get("ASR_RL_KILL_RANK") == f"{rank}:{step}":
        os._exit(1)


def _strategy_kwargs(cfg, world_size: int) -> dict:
    from asr_rl.trainer.workers import total_optimizer_steps

    d, o = cfg.distributed, cfg.optim
    return dict(weight_decay=o.weight_decay, betas=o.adam_betas, max_norm=o.max_norm,
                total_steps=total_optimizer_steps(cfg), warmup_ratio=o.lr_warmup_ratio, min_lr_ratio=o.min_lr_ratio,
                zero_stage=d.zero_stage, micro_batch=o.micro_train_batch_size, world_size=world_size, bf16=d.bf16,
                offload_optimizer=d.adam_offload)


def _train_critic(critic, strategy, exp: Experience, cfg, train_size: int, step: int) -> dict:
    critic.train()
    return critic_update(critic, strategy, exp, cfg.algo, cfg.optim.micro_train_batch_size, train_size,
                         seed=cfg.seed + step)
