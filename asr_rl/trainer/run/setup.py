"""Pieces every trainer shares: run-folder setup, policy loading with freezing/LoRA, optimiser and
learning-rate schedule."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from asr_rl.config import RunConfig
from asr_rl.trainer.run.checkpoint import cleanup_stale_temps, list_checkpoints, resolve_resume
from asr_rl.trainer.run.metrics import MetricsLogger
from asr_rl.trainer.run.folder import RunLock, check_paths, claim_run_folder
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


