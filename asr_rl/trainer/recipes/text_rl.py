"""The text RLHF path: the same loop over a text policy and a prompt set (`prompt_data=`).

PPO with a critic and a reward model (`reward_pretrain=`), or GRPO/RLOO/REINFORCE++ with reward
functions, files or servers, on the local or the Ray backend.
"""
from __future__ import annotations

from pathlib import Path

from asr_rl.trainer.config import RLConfig


def train_text_rl(algo: str, cfg: RLConfig) -> Path:
    from asr_rl.data.batching import BatchLoader
    from asr_rl.data.prompts import PromptBatch, read_prompts
    from asr_rl.trainer.run.setup import setup_run
    from asr_rl.trainer.recipes.rl import make_reward, run_loop

    ctx = setup_run(cfg)
    items = read_prompts(cfg.prompt_data, cfg.data.input_key, cfg.data.label_key)
    loader = BatchLoader(items, cfg.rollout.rollout_batch_size, seed=cfg.seed, shuffle=cfg.data.shuffle,
                         make_batch=PromptBatch)
    workers = build_text_workers(cfg, ctx)
    return run_loop(cfg, ctx, loader, workers, make_reward(cfg, ctx.device))


def build_text_workers(cfg: RLConfig, ctx):
    if cfg.backend == "ray":
        from asr_rl.trainer.distributed.ray_workers import RayWorkers

        return RayWorkers(cfg, ctx, text=True)
    from asr_rl.models.loading import build_critic, load_rl_policy
    from asr_rl.trainer.rl.workers import LocalWorkers

    policy = load_rl_policy(cfg, cfg.pretrain, ctx.device, text=True)
    critic = build_critic(cfg, ctx.device, True, policy) if cfg.algo.spec.needs_critic else None
    return LocalWorkers(cfg, policy, critic)
