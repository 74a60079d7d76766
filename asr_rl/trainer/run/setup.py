"""What every trainer does first: the run folder checked and locked, the checkpoint to resume from
found, seed and threads set; and its metrics logger, which claims the folder when the run starts."""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from asr_rl.config import RunConfig
from asr_rl.trainer.run.checkpoint import cleanup_stale_temps, list_checkpoints, resolve_resume
from asr_rl.trainer.run.metrics import MetricsLogger
from asr_rl.trainer.run.folder import RunLock, check_paths, check_run_folder, claim_run_folder
from asr_rl.utils import seed_everything

log = logging.getLogger("asr_rl.train")


@dataclass
class RunContext:
    """A run folder held for one run (its lock), and where the run resumes from. `start()` claims
    the folder when the run is about to start (`make_logger` calls it); `close()` (or leaving a
    `with` block) releases the lock."""

    output_dir: Path
    resume_from: Path | None
    device: str
    lock: RunLock | None = None
    claim: Callable[[], None] | None = None

    def start(self) -> None:
        if self.claim is not None:
            self.claim()
            self.claim = None

    def close(self) -> None:
        if self.lock is not None:
            self.lock.release()

    def __enter__(self) -> "RunContext":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def setup_run(cfg: RunConfig) -> RunContext:
    """Paths checked, the output folder locked and checked for this run (run/folder.py), and the
    checkpoint to resume from found; threads and seed set. Nothing in the folder is deleted or
    rewritten until `RunContext.start()`."""
    from asr_rl.evaluation.evaluate import resolve_device

    check_paths(cfg)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    lock = RunLock(out)
    try:
        cleanup_stale_temps(out)
        command = type(cfg).__name__.removesuffix("Config").lower()
        has_checkpoints = bool(list_checkpoints(out)) or (out / "final").is_dir()
        check_run_folder(cfg, command, has_checkpoints)
        torch.set_num_threads(max(1, cfg.num_threads))
        seed_everything(cfg.seed)
        resume = resolve_resume(out, cfg.resume)
    except BaseException:
        lock.release()
        raise
    if resume is not None:
        log.info("resuming from %s", resume)
    return RunContext(out, resume, resolve_device(cfg.device), lock,
                      functools.partial(claim_run_folder, cfg, command, has_checkpoints))


def make_logger(cfg: RunConfig, ctx: RunContext, resume_step: int | None) -> MetricsLogger:
    """The run's metrics logger; the run starts here, so the folder is claimed first."""
    ctx.start()
    return MetricsLogger(ctx.output_dir, tensorboard=cfg.logging.tensorboard, wandb_project=cfg.logging.wandb_project,
                         logging_steps=cfg.logging.logging_steps, run_name=ctx.output_dir.name,
                         resume_step=resume_step)


