"""The local backend: policy, reference, critic and rollout engine in one process.

`RLTrainer` (loop.py) talks to its workers only through the `Workers` interface (interfaces.py);
the Ray backend (`trainer/distributed/ray_workers.py`) implements it over actor groups, so the loop
does not know how ranks are placed. Both run the same `PolicyRank` code.
"""
from __future__ import annotations

import logging

import torch

from asr_rl.trainer.config import RLConfig
from asr_rl.trainer.rl.engines import build_engine
from asr_rl.trainer.rl.rank import PolicyRank
from asr_rl.trainer.rl.rollout import Experience, Sampled
from asr_rl.trainer.strategy import LocalStrategy

log = logging.getLogger("asr_rl.train")


def make_strategy(params, cfg: RLConfig, lr: float) -> LocalStrategy:
    """The actor's or the critic's optimiser (`lr`: its peak rate) over the whole run's steps."""
    return LocalStrategy.from_config(params, cfg.optim, total_optimizer_steps(cfg), lr)


def total_optimizer_steps(cfg: RLConfig) -> int:
    """Optimiser steps of the whole run (for the LR schedule): epochs x minibatches per rollout."""
    total = cfg.rollout.rollout_batch_size * cfg.rollout.group_size
    return cfg.max_steps * cfg.algo.max_epochs * (total // (cfg.optim.train_batch_size or total))


class LocalWorkers:
    """The `Workers` interface (interfaces.py) over one in-process `PolicyRank`; its engine is
    `rollout.engine` built on the policy (trainer/rl/engines.py) unless one is given."""

    group_multiple = 1

    def __init__(self, cfg: RLConfig, policy, critic=None, engine=None):
        self.cfg = cfg
        ref = policy.reference_copy() if cfg.algo.init_kl_coef > 0 else None
        actor = make_strategy([p for _, p in policy.trainable_parameters()], cfg, cfg.optim.actor_learning_rate)
        critic_strategy = (make_strategy(critic.trainable_parameters(), cfg, cfg.optim.critic_learning_rate)
                           if critic is not None else None)
        engine = engine if engine is not None else build_engine(cfg, policy)
        self.rank = PolicyRank(cfg, policy, ref, critic, actor, critic_strategy, engine)
        self.policy, self.ref, self.critic, self.engine = policy, ref, critic, self.rank.engine
        self.version = 0  # updates in the weights the engine samples with

    @property
    def pad_id(self) -> int:
        return self.policy.pad_id

    @property
    def eos_id(self) -> int:
        return self.policy.eos_id

    def report_memory(self, longest, device: str) -> None:
        self.rank.report_memory(longest, device)

    def evaluate(self, manifest: str, eval_cfg) -> dict[str, float]:
        from asr_rl.trainer.recipes.sft import evaluate_during_training

        return evaluate_during_training(self.policy, manifest, eval_cfg)

    # --- rollout -------------------------------------------------------------------------
    def encode(self, batch) -> list:
        return self.rank.encode(batch)

    def sample(self, prompt_rows: list, n: int, seeds: list[int]) -> list[Sampled]:
        return self.rank.sample(prompt_rows, n, seeds)

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
        for key, value in self.rank.annotate(exp, need_old_logp).items():
            setattr(exp, key, value)

    def train(self, exp: Experience, step: int, kl_coef: float) -> dict[str, float]:
        return self.rank.train(exp, step, kl_coef)

    def sync_weights(self, version: int) -> None:
        self.engine.sync_weights()
        self.version = version

    # --- checkpoints ---------------------------------------------------------------------
    def save_model(self, path) -> None:
        self.rank.save_model(path)

    def save_engine_state(self, folder) -> None:
        pass  # the optimiser state is in `state_dict`

    def state_dict(self) -> dict:
        from asr_rl.trainer.run.checkpoint import policy_resume_weights

        state = {"actor": self.rank.actor.state_dict(), "policy": policy_resume_weights(self.policy)}
        if self.critic is not None:
            state["critic"] = {"weights": self.critic.state_dict(), **self.rank.critic_strategy.state_dict()}
        return state

    def load_state_dict(self, state: dict, ckpt) -> None:
        from asr_rl.trainer.run.checkpoint import restore_policy_weights

        restore_policy_weights(self.policy, ckpt, state.get("policy"))
        self.rank.actor.load_state_dict(state["actor"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"]["weights"])
            self.rank.critic_strategy.load_state_dict(state["critic"])

    def shutdown(self) -> None:
        self.engine.close()  # vLLM: shuts down and deletes its exported folder
