"""The policy worker.

`PolicyWorker` is everything one process of the policy does in an RL step: the policy with its
colocated KL reference and critic, their optimisers (a `LocalStrategy`, or DeepSpeed on a Ray
actor) and a rollout engine. The local backend holds one in process (trainer/driver/local.py);
every policy rank of the Ray backend wraps one in a Ray actor (trainer/distributed/ray_workers.py),
so encoding, sampling, log-prob passes and the update are written once.
"""
from __future__ import annotations

import logging

from asr_rl.trainer.update.ppo import critic_update, forward_logprobs, forward_values, ppo_update
from asr_rl.trainer.run.memory import peak_memory_gib
from asr_rl.trainer.rollout.experience import Experience, Sampled

log = logging.getLogger("asr_rl.train")


class PolicyWorker:
    """One process's share of the policy side of a step.

    Args:
        cfg: the RLConfig.
        policy, ref, critic: the models (`ref`/`critic` None when not colocated or not needed).
        policy_strategy, critic_strategy: how gradients are applied (`backward`, `step`, `gathered`).
        engine: the `RolloutEngine` this rank samples with (trainer/rollout/engines.py); None where
            engine workers sample instead (Ray: `samples_in_engine_actors`).
        rank, world_size: this rank among the policy's data-parallel ranks.
    """

    def __init__(self, cfg, policy, ref, critic, policy_strategy, critic_strategy=None, engine=None, rank: int = 0,
                 world_size: int = 1):
        self.cfg, self.policy, self.ref, self.critic = cfg, policy, ref, critic
        self.policy_strategy, self.critic_strategy = policy_strategy, critic_strategy
        self.engine = engine
        self.rank, self.world_size = rank, world_size

    def full_weights(self):
        """Context in which the policy's weights are whole (ZeRO-3 gathers; every rank enters)."""
        return self.policy_strategy.gathered(list(self.policy.model.parameters()))

    # --- rollout -------------------------------------------------------------------------
    def encode(self, batch) -> list:
        return self.policy.encode_batch(batch)

    def sample(self, rows: list, n: int, seeds: list[int]) -> list[Sampled]:
        if self.engine is None:
            r = self.cfg.rollout
            raise RuntimeError(f"policy rank {self.rank} has no rollout engine: engine actors sample "
                               f"(rollout.engine={r.engine}, async_enable={r.async_enable})")
        self.policy.eval()
        with self.full_weights():  # entered by every rank (ZeRO-3 gathers together), an empty shard's too
            return self.engine.generate(rows, n, self.cfg.rollout, seeds) if rows else []

    # --- experience ----------------------------------------------------------------------
    def annotate(self, exp: Experience, need_old_logp: bool) -> dict:
        """Old log-probs (policy before the update), reference log-probs and critic values."""
        micro, temp = self.cfg.optim.micro_train_batch_size, self.cfg.rollout.temperature
        out = {}
        if need_old_logp:
            with self.full_weights():
                out["old_logp"] = forward_logprobs(self.policy, exp, micro, temp)
        if self.ref is not None:
            out["ref_logp"] = forward_logprobs(self.ref, exp, micro, temp)
        if self.critic is not None:
            with self.critic_strategy.gathered(list(self.critic.parameters())):
                out["values"] = forward_values(self.critic, exp, micro)
        return out

    def train(self, exp: Experience, step: int, kl_coef: float, separate_critic: bool = False) -> dict:
        """The critic update (when colocated), then the policy's, unless the critic is still
        warming up (`freeze_critic_steps`)."""
        cfg, o = self.cfg, self.cfg.optim
        train_size = (o.train_batch_size // self.world_size) if o.train_batch_size else len(exp)
        metrics = {}
        if self.critic is not None:
            metrics.update(train_critic(self.critic, self.critic_strategy, exp, cfg, train_size, step))
        if not (self.critic is not None or separate_critic) or step > cfg.freeze_critic_steps:
            self.policy.train()
            metrics.update(ppo_update(self.policy, self.policy_strategy, exp, cfg.algo, o.micro_train_batch_size, train_size,
                                      cfg.rollout.temperature, kl_coef, seed=cfg.seed + step))
        metrics["memory/peak_gib"] = peak_memory_gib()  # of this process (GPU memory on CUDA)
        return metrics

    # --- evaluation, memory, checkpoints -----------------------------------------------------
    def transcribe(self, utterances: list, eval_cfg) -> list:
        from asr_rl.evaluation.evaluate import transcribe

        was_training = self.policy.training
        with self.full_weights():
            out = transcribe(self.policy, utterances, eval_cfg.eval_batch_size, eval_cfg.num_beams,
                             eval_cfg.eval_max_new_tokens) if utterances else []
        self.policy.train(was_training)
        return out

    def report_memory(self, longest, device: str, deepspeed: bool = False, cache_bytes: int = 0) -> None:
        from asr_rl.trainer.run.memory import prompt_length, rank_estimate, report_memory

        prompt_len = prompt_length(self.policy, longest, self.cfg.data.sample_rate)
        report_memory(rank_estimate(self.cfg, self.policy, reference=self.ref is not None, prompt_len=prompt_len,
                                    world_size=self.world_size, deepspeed=deepspeed, cache_bytes=cache_bytes), device)

    def save_model(self, path) -> None:
        """Every rank enters (ZeRO-3 gathers); rank 0 writes the HF folder."""
        with self.full_weights():
            if self.rank == 0:
                self.policy.save_pretrained(path)


def train_critic(critic, strategy, exp: Experience, cfg, train_size: int, step: int) -> dict:
    critic.train()
    return critic_update(critic, strategy, exp, cfg.algo, cfg.optim.micro_train_batch_size, train_size,
                         seed=cfg.seed + step)


__all__ = ["PolicyWorker", "train_critic"]
