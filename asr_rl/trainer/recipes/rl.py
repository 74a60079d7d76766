"""`asr-rl train grpo|ppo`: build the pieces from a config and run the loop.

setup -> data -> policy (+ reference, critic) -> reward -> workers (local or Ray) -> loop.fit.
Audio (`train_manifest=`) or text RLHF (`prompt_data=`: a text policy and a prompt set, PPO with a
critic and a reward model or the group estimators with reward functions): the same workers, engine
and loop.
`grpo` defaults to the group-normalised estimator with the KL in the loss; `ppo` to GAE with a
critic and the KL as a reward penalty (OpenRLHF's defaults for each).
"""
from __future__ import annotations

import logging
from pathlib import Path

from asr_rl.trainer.configs.rl import RLConfig
from asr_rl.trainer.recipes.presets import load_with_checkpoint_presets

log = logging.getLogger("asr_rl.train")

# Algorithm presets applied before the file and overrides (which win).
PRESETS = {
    "grpo": [],
    "ppo": ["algo.advantage_estimator=gae", "algo.use_kl_loss=false", "rollout.n_samples_per_prompt=1",
            "rollout.dynamic_filtering=false"],
}
TRAINS_CRITIC = {"grpo": False, "ppo": True}  # the command a critic estimator (gae) must be run with


def load_rl_config(algo: str, config: str | None, overrides: list[str]) -> RLConfig:
    if algo not in PRESETS:
        raise ValueError(f"unknown algorithm {algo!r}; choose one of {', '.join(PRESETS)}")
    cfg = load_with_checkpoint_presets(RLConfig, "rl", config, overrides, PRESETS[algo])
    if cfg.algo.spec.needs_critic and not TRAINS_CRITIC[algo]:
        raise ValueError(f"advantage_estimator={cfg.algo.advantage_estimator} needs a critic: use `asr-rl train ppo`")
    return cfg


def train_rl(algo: str, config: str | None, overrides: list[str]) -> Path:
    return run_rl(load_rl_config(algo, config, overrides), algo)


def run_rl(cfg: RLConfig, algo: str) -> Path:
    """The text path for a prompt set alone (`prompt_data` without `train_manifest`), else audio."""
    if cfg.prompt_data and not cfg.train_manifest:
        return run_text_rl(cfg, algo)
    return run_audio_rl(cfg, algo)


def run_audio_rl(cfg: RLConfig, algo: str = "grpo") -> Path:
    """The run's facts gathered once (`RunPlan`) and checked in one line (`preflight`) before any
    model loads; then the loader, the workers and the loop."""
    from asr_rl.data.augment import VariantAugmenter
    from asr_rl.data.batching import BatchLoader
    from asr_rl.models.loading import require_audio_llm
    from asr_rl.trainer.run.plan import RunPlan, preflight
    from asr_rl.trainer.run.setup import setup_run

    plan = RunPlan(cfg)
    require_audio_llm(plan.model, hint="; a text LM trains on prompts: prompt_data=PATH without train_manifest")
    with setup_run(cfg) as ctx:
        preflight(cfg, plan)
        loader = BatchLoader(plan.utts, cfg.rollout.rollout_batch_size, seed=cfg.seed, shuffle=cfg.data.shuffle,
                             sample_rate=cfg.data.sample_rate, augmenter=VariantAugmenter(cfg.augment, cfg.seed),
                             decode_workers=cfg.data.decode_workers, sampler=datasets_sampler(cfg, plan.sizes))
        workers = build_backend(cfg, ctx, algo)  # starts Ray first when backend=ray
        workers.report_memory(plan.longest, ctx.device, plan.cache.ram_bytes)  # before the first step
        eval_fn = (lambda: workers.evaluate(cfg.eval_manifest, cfg.eval, cfg.data)) if cfg.eval_manifest else None
        return run_loop(cfg, ctx, loader, workers, make_reward(cfg), eval_fn)


def datasets_sampler(cfg: RLConfig, sizes: list[int]):
    """`data.sampler` over one dataset; over several, a `MixtureSampler` of one such sampler each,
    drawn by `train_manifest_probs`."""
    from asr_rl.data.mixture import build_mixture, check_probs
    from asr_rl.data.signal_sampler import build_sampler

    b = cfg.rollout.rollout_batch_size
    if len(sizes) == 1:
        return build_sampler(cfg.data, sizes[0], b, cfg.seed)
    return build_mixture(lambda n, batch, seed: build_sampler(cfg.data, n, batch, seed), sizes,
                         check_probs(cfg.train_manifest_probs, len(sizes)), b, cfg.seed)


def run_text_rl(cfg: RLConfig, algo: str = "grpo") -> Path:
    """The text RLHF path: the same loop over a text policy and a prompt set (`prompt_data=`)."""
    from asr_rl.data.batching import BatchLoader
    from asr_rl.data.prompts import PromptBatch, read_prompts
    from asr_rl.data.signal_sampler import build_sampler
    from asr_rl.trainer.run.setup import setup_run

    with setup_run(cfg) as ctx:
        items = read_prompts(cfg.prompt_data, cfg.data.input_key, cfg.data.label_key)
        loader = BatchLoader(items, cfg.rollout.rollout_batch_size, seed=cfg.seed, shuffle=cfg.data.shuffle,
                             make_batch=PromptBatch,
                             sampler=build_sampler(cfg.data, len(items), cfg.rollout.rollout_batch_size, cfg.seed))
        workers = build_backend(cfg, ctx, algo, text=True)
        return run_loop(cfg, ctx, loader, workers, make_reward(cfg, ctx.device))


def run_loop(cfg: RLConfig, ctx, loader, workers, reward_fn, eval_fn=None) -> Path:
    """Resume if asked, fit, save the final model; the workers are shut down whatever happens."""
    from asr_rl.trainer.run.setup import make_logger
    from asr_rl.trainer.driver.loop import RLTrainer

    try:
        trainer = RLTrainer(cfg, workers, reward_fn, loader, None, ctx.output_dir, eval_fn)
        if ctx.resume_from is not None:
            trainer.restore(ctx.resume_from)
        trainer.logger = make_logger(cfg, ctx, resume_step=trainer.step_no)
        trainer.fit()
        return trainer.save_final()
    finally:
        workers.shutdown()
        getattr(reward_fn, "shutdown", lambda: None)()


def make_reward(cfg: RLConfig, device: str = "cpu"):
    """The run's reward (rewards/pipeline.py chooses which), in this process or, for a local reward
    on the Ray backend with `reward.num_workers` > 0, in a pool of Ray reward workers that each
    build the same reward."""
    from asr_rl.rewards import pipeline

    if cfg.backend == "ray" and cfg.reward.num_workers > 0 and not (cfg.reward.remote_url or cfg.reward_pretrain):
        from asr_rl.trainer.distributed.ray_rewards import RayRewardPool

        return RayRewardPool(cfg.reward, cfg.reward.num_workers)
    return pipeline.make_reward(cfg.reward, cfg.reward_pretrain, device)


def build_backend(cfg: RLConfig, ctx, algo: str, text: bool = False):
    """The policy (audio or `text`), critic and `rollout.engine`: in process, or Ray actor groups."""
    if cfg.backend == "ray":
        from asr_rl.trainer.distributed.ray_backend import RayBackend

        return RayBackend(cfg, ctx, algo, text)
    from asr_rl.models.loading import build_critic, load_rl_policy
    from asr_rl.trainer.driver.local import LocalBackend

    policy = load_rl_policy(cfg, cfg.pretrain, ctx.device, text=text)
    critic = build_critic(cfg, ctx.device, text, policy) if cfg.algo.spec.needs_critic else None
    return LocalBackend(cfg, policy, critic)  # builds the engine from the registry


__all__ = ["train_rl", "run_audio_rl", "run_text_rl", "load_rl_config", "build_backend"]
