"""Pieces every trainer shares: run-folder setup, policy loading with freezing/LoRA, optimiser and
learning-rate schedule."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from asr_rl.config import RunConfig
from asr_rl.trainer.checkpoint import cleanup_stale_temps, list_checkpoints, resolve_resume
from asr_rl.trainer.metrics import MetricsLogger
from asr_rl.trainer.run_folder import RunLock, check_paths, claim_run_folder
from asr_rl.utils import seed_everything

log = logging.getLogger("asr_rl.train")


@dataclass
class RunContext:
    output_dir: Path
    resume_from: Path | None
    device: str


# The run folders this process holds: a later run of the same process into the same folder (tests,
# notebooks) takes the lock over; another process is refused while one is held.
_HELD_LOCKS: dict[Path, RunLock] = {}


def setup_run(cfg: RunConfig) -> RunContext:
    """Paths checked, then the output folder locked and claimed for this run (run_folder.py), its
    resolved config written, and the checkpoint to resume from found; threads and seed set."""
    from asr_rl.evaluation.evaluate import resolve_device

    check_paths(cfg)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    held = _HELD_LOCKS.pop(out.resolve(), None)
    if held is not None:
        held.release()
    _HELD_LOCKS[out.resolve()] = RunLock(out)
    cleanup_stale_temps(out)
    claim_run_folder(cfg, type(cfg).__name__.removesuffix("Config").lower(),
                     has_checkpoints=bool(list_checkpoints(out)) or (out / "final").is_dir())
    torch.set_num_threads(max(1, cfg.num_threads))
    seed_everything(cfg.seed)
    resume = resolve_resume(out, cfg.resume)
    if resume is not None:
        log.info("resuming from %s", resume)
    return RunContext(out, resume, resolve_device(cfg.device))


def make_logger(cfg: RunConfig, ctx: RunContext, resume_step: int | None) -> MetricsLogger:
    return MetricsLogger(ctx.output_dir, tensorboard=cfg.logging.tensorboard, wandb_project=cfg.logging.wandb_project,
                         logging_steps=cfg.logging.logging_steps, run_name=ctx.output_dir.name,
                         resume_step=resume_step)


def load_policy(path: str | Path | None, model_cfg, device: str = "cpu", sample_rate: int = 16000,
                freeze_encoder: bool | None = None):
    """The audio policy from `path` with the config's freezing and (optional) LoRA applied. The
    encoder is frozen when `freeze_encoder` (or else `model_cfg.freeze_encoder`) says so, and by
    default when the checkpoint's encoder is pretrained."""
    from asr_rl.models.audio_policy import AudioPolicy
    from asr_rl.models.builders import encoder_is_pretrained

    if not path:
        raise ValueError("`pretrain` is not set: give the starting model folder, e.g. pretrain=exp/sft/final")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[model_cfg.dtype]
    policy = AudioPolicy.from_pretrained(path, device=device, dtype=dtype, force_language=model_cfg.force_language,
                                         sample_rate=sample_rate)
    patterns = tuple(model_cfg.freeze_patterns)
    freeze = next(f for f in (freeze_encoder, model_cfg.freeze_encoder, encoder_is_pretrained(path)) if f is not None)
    if freeze:
        patterns += policy.spec.frozen_by_default()
    if patterns:
        frozen = policy.freeze(patterns)
        log.info("froze %d parameter tensors (%s)", len(frozen), ", ".join(patterns))
    if policy.encoder_frozen and model_cfg.encoder_cache:
        policy.use_encoder_cache(model_cfg.encoder_cache)
    if model_cfg.lora_rank > 0:
        from asr_rl.models.lora import add_lora

        add_lora(policy, model_cfg.lora_rank, model_cfg.lora_alpha, model_cfg.lora_target_modules)
    n_train = sum(p.numel() for _, p in policy.trainable_parameters())
    n_all = sum(p.numel() for p in policy.model.parameters())
    log.info("policy %s: %.2fM parameters, %.2fM trainable", path, n_all / 1e6, n_train / 1e6)
    return policy


def load_rl_policy(cfg, path: str | Path | None, device: str, text: bool):
    """The RL policy (audio, or text for the text RLHF path) from `path`, with the run's model settings."""
    if text:
        from asr_rl.models.text_policy import load_text_policy

        return load_text_policy(path, cfg.model, device, cfg.data)
    return load_policy(path, cfg.model, device, cfg.data.sample_rate, freeze_encoder=True)  # RL: always frozen


def build_critic(cfg, device: str, text: bool, policy=None):
    """The PPO critic from `critic_pretrain`, else from a copy of `policy` (or of `pretrain` when
    there is none: a critic in a process of its own)."""
    from asr_rl.models.critic import ValueModel

    if cfg.critic_pretrain or policy is None:
        return ValueModel(load_rl_policy(cfg, cfg.critic_pretrain or cfg.pretrain, device, text))
    return ValueModel.from_policy(policy)


def build_optimizer(params, lr: float, weight_decay: float, betas: tuple[float, ...]) -> torch.optim.Optimizer:
    """AdamW with no weight decay on biases and norms (1-D tensors)."""
    params = [p for p in params if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=tuple(betas))


def build_scheduler(optimizer, max_steps: int, warmup_ratio: float, min_lr_ratio: float):
    """Linear warmup, then cosine decay to `min_lr_ratio` of the peak (OpenRLHF's
    `cosine_with_min_lr`)."""
    warmup = int(math.ceil(warmup_ratio * max_steps))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
