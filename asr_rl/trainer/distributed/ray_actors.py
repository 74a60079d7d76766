"""The Ray actor of one trainer rank: a DeepSpeed data-parallel rank of the policy (and, colocated,
the reference model and the critic). Methods unpack their inputs and delegate to the same
functions the local backend uses (trainer/actor.py); nothing here is RL math.
"""
from __future__ import annotations

import copy
import logging
import os
import warnings
from pathlib import Path

import ray
import torch

from asr_rl.trainer.actor import critic_update, forward_logprobs, forward_values, ppo_update
from asr_rl.trainer.rollout import Experience


@ray.remote(num_cpus=1)
class TrainerRank:
    def __init__(self, rank: int, world_size: int, master_addr: str, master_port: int):
        self.rank, self.world_size = rank, world_size
        logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING)  # rank-0 logs only
        warnings.filterwarnings("ignore", category=FutureWarning)  # torch.distributed deprecations, per call
        from asr_rl.utils import quiet_transformers

        quiet_transformers()
        from asr_rl.trainer.distributed.deepspeed_strategy import init_distributed

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        init_distributed(rank, world_size, master_addr, master_port)

    def setup(self, cfg, device: str, with_critic: bool, text: bool = False) -> dict:
        """Load the policy (+ reference, + critic) and wrap the trainable models in DeepSpeed."""
        from asr_rl.models.critic import ValueModel
        from asr_rl.trainer.distributed.deepspeed_strategy import DeepSpeedStrategy
        from asr_rl.trainer.workers import total_optimizer_steps

        self.cfg = cfg
        torch.manual_seed(cfg.seed)
        self.policy = _load_policy(cfg, device, text)
        # The reference is copied before DeepSpeed partitions anything (ZeRO-3 would copy stubs).
        self.ref = copy.deepcopy(self.policy).eval().requires_grad_(False) if cfg.algo.init_kl_coef > 0 else None
        self.critic = ValueModel.from_policy(self.policy) if with_critic else None
        d, o = cfg.distributed, cfg.optim
        common = dict(weight_decay=o.weight_decay, betas=o.adam_betas, max_norm=o.max_norm,
                      total_steps=total_optimizer_steps(cfg), warmup_ratio=o.lr_warmup_ratio,
                      min_lr_ratio=o.min_lr_ratio, zero_stage=d.zero_stage, micro_batch=o.micro_train_batch_size,
                      world_size=self.world_size, bf16=d.bf16, offload_optimizer=d.adam_offload)
        self.actor = DeepSpeedStrategy(self.policy.model, [p for _, p in self.policy.trainable_parameters()],
                                       lr=o.actor_learning_rate, **common)
        self.critic_strategy = (DeepSpeedStrategy(self.critic, self.critic.trainable_parameters(),
                                                  lr=o.critic_learning_rate, **common) if self.critic else None)
        return {"pad_id": self.policy.pad_id, "rank": self.rank, "pid": os.getpid()}

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

    def train(self, exp: Experience, step: int, kl_coef: float) -> dict:
        _fault_hook(self.rank, step)
        cfg, o = self.cfg, self.cfg.optim
        train_size = (o.train_batch_size // self.world_size) if o.train_batch_size else len(exp)
        metrics = {}
        if self.critic is not None:
            self.critic.train()
            metrics.update(critic_update(self.critic, self.critic_strategy, exp, cfg.algo, o.micro_train_batch_size,
                                         train_size, seed=cfg.seed + step))
        if self.critic is None or step > cfg.freeze_critic_steps:
            self.policy.train()
            metrics.update(ppo_update(self.policy, self.actor, exp, cfg.algo, o.micro_train_batch_size, train_size,
                                      cfg.rollout.temperature, kl_coef, seed=cfg.seed + step))
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


def _fault_hook(rank: int, step: int) -> None:
    """Fault injection for tests: `ASR_RL_KILL_RANK=R:S` makes rank R exit hard at step S's update,
    like a node or process lost mid-step."""
    if os.environ.get("ASR_RL_KILL_RANK") == f"{rank}:{step}":
        os._exit(1)


def _load_policy(cfg, device: str, text: bool):
    if text:
        from asr_rl.models.text_policy import load_text_policy

        return load_text_policy(cfg.pretrain, cfg.model, device, cfg.data)
    from asr_rl.trainer.common import load_policy

    return load_policy(cfg.pretrain, cfg.model, device, cfg.data.sample_rate)
