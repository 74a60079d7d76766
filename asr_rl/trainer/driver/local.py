"""The local backend: the policy worker (with its reference, critic and rollout engine) in this
process. `RLTrainer` (loop.py) calls it through the roles of roles.py; the Ray backend
(trainer/distributed/ray_backend.py) places the same `PolicyWorker` code on Ray actors, so the loop
does not know where workers run.
"""
from __future__ import annotations

import logging

import torch

from asr_rl.evaluation.during_training import evaluate_during_training
from asr_rl.trainer.configs.rl import RLConfig
from asr_rl.trainer.rollout.engines import build_engine
from asr_rl.trainer.update.worker import PolicyWorker
from asr_rl.trainer.rollout.experience import Experience, Sampled
from asr_rl.trainer.update.strategy import make_strategy

log = logging.getLogger("asr_rl.train")


class LocalBackend:
    """Every role (roles.py `Backend`) over one in-process `PolicyWorker`; its engine is
    `rollout.engine` built on the policy (trainer/rollout/engines.py) unless one is given."""

    group_multiple = 1

    def __init__(self, cfg: RLConfig, policy, critic=None, engine=None):
        self.cfg = cfg
        ref = policy.reference_copy() if cfg.algo.init_kl_coef > 0 else None
        policy_strategy = make_strategy([p for _, p in policy.trainable_parameters()], cfg, cfg.optim.actor_learning_rate)
        critic_strategy = (make_strategy(critic.trainable_parameters(), cfg, cfg.optim.critic_learning_rate)
                           if critic is not None else None)
        engine = engine if engine is not None else build_engine(cfg, policy)
        self.worker = PolicyWorker(cfg, policy, ref, critic, policy_strategy, critic_strategy, engine)
        self.policy, self.ref, self.critic, self.engine = policy, ref, critic, self.worker.engine
        self.version = 0  # updates in the weights the engine samples with

    @property
    def pad_id(self) -> int:
        return self.policy.pad_id

    @property
    def eos_id(self) -> int:
        return self.policy.eos_id

    def report_memory(self, longest, device: str, cache_bytes: int = 0) -> None:
        self.worker.report_memory(longest, device, cache_bytes=cache_bytes)

    def evaluate(self, manifest: str, eval_cfg, options=None) -> dict[str, float]:
        return evaluate_during_training(self.policy, manifest, eval_cfg, options)

    # --- rollout -------------------------------------------------------------------------
    def encode(self, batch) -> list:
        return self.worker.encode(batch)

    def sample(self, prompt_rows: list, n: int, seeds: list[int]) -> list[Sampled]:
        return self.worker.sample(prompt_rows, n, seeds)

    def submit(self, prompt_rows: list, n: int, seeds: list[int]):
        return self.sample(prompt_rows, n, seeds), self.version  # in process: sampled at once

    def collect(self, handle) -> tuple[list[Sampled], int]:
        return handle

    def decode(self, ids: list[int]) -> str:
        return self.policy.decode_ids(torch.as_tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))[0]

    def parse(self, text: str, language: str | None):
        return self.policy.parse(text, language)

    def target_ids(self, texts: list[str], languages: list) -> list[list[int]]:
        return self.policy.codec.target_rows(texts, languages)

    # --- experience ----------------------------------------------------------------------
    def annotate(self, exp: Experience, need_old_logp: bool) -> None:
        for key, value in self.worker.annotate(exp, need_old_logp).items():
            setattr(exp, key, value)

    def train(self, exp: Experience, step: int, kl_coef: float) -> dict[str, float]:
        return self.worker.train(exp, step, kl_coef)

    def sync_weights(self, version: int) -> None:
        self.engine.sync_weights()
        self.version = version

    # --- checkpoints ---------------------------------------------------------------------
    def save_model(self, path) -> None:
        self.worker.save_model(path)

    def save_engine_state(self, folder) -> None:
        pass  # the optimiser state is in `state_dict`

    def state_dict(self) -> dict:
        from asr_rl.trainer.run.checkpoint import policy_resume_weights

        state = {"actor": self.worker.policy_strategy.state_dict(), "policy": policy_resume_weights(self.policy)}
        if self.critic is not None:
            state["critic"] = {"weights": self.critic.state_dict(), **self.worker.critic_strategy.state_dict()}
        return state

    def load_state_dict(self, state: dict, ckpt) -> None:
        from asr_rl.trainer.run.checkpoint import restore_policy_weights

        restore_policy_weights(self.policy, ckpt, state.get("policy"))
        self.worker.policy_strategy.load_state_dict(state["actor"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"]["weights"])
            self.worker.critic_strategy.load_state_dict(state["critic"])

    def shutdown(self) -> None:
        self.engine.close()  # vLLM: shuts down and deletes its exported folder
