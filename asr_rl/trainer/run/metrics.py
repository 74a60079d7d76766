"""One metrics interface for every trainer: a namespaced dict per step goes to the run folder's
`metrics.jsonl`, TensorBoard, optionally Weights & Biases, and (every `logging_steps`) one console
line. Only rank 0 constructs a logger (torchtune's `MetricLoggerInterface.log_dict`)."""
from __future__ import annotations

import json
import logging
import math
import time
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("asr_rl.train")


# What the one console line per step shows (everything still goes to metrics.jsonl/TensorBoard).
CONSOLE_KEYS = ("loss/total", "loss/ce", "loss/ctc", "reward/mean", "eval/cer", "eval/wer", "actor/loss",
                "critic/loss", "kl/loss", "kl/mean", "policy/entropy", "policy/clip_frac", "mwer/risk",
                "response/length_mean", "rollout/groups_filtered", "lr", "actor/lr", "time/step")


class MetricsLogger:
    def __init__(self, output_dir: str | Path, tensorboard: bool = True, wandb_project: str | None = None,
                 logging_steps: int = 1, run_name: str | None = None, resume_step: int | None = None):
        self.path = Path(output_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None:
            self._truncate_after(resume_step)
        self.logging_steps = max(1, logging_steps)
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(Path(output_dir) / "tensorboard"))
        self._wandb = None
        if wandb_project:
            import wandb  # optional dependency: only imported when asked for

            self._wandb = wandb.init(project=wandb_project, name=run_name, dir=str(output_dir))

    def _truncate_after(self, step: int) -> None:
        """On resume, drop lines of steps after the checkpoint, so the file reads as one clean run."""
        if not self.path.exists():
            return
        kept = [ln for ln in self.path.read_text(encoding="utf-8").splitlines()
                if ln.strip() and json.loads(ln).get("step", 0) <= step]
        self.path.write_text("".join(ln + "\n" for ln in kept), encoding="utf-8")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(row, step=step)
        if step % self.logging_steps == 0:
            log.info("step %d: %s", step, format_metrics(metrics, CONSOLE_KEYS))

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def format_metrics(metrics: dict[str, float], keys: tuple[str, ...] | None = None) -> str:
    items = metrics.items() if keys is None else [(k, metrics[k]) for k in keys if k in metrics]
    if not items:
        items = metrics.items()
    return ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in items)


def _plain(v):
    if hasattr(v, "item"):
        v = v.item()
    return v


@contextmanager
def timer(timings: dict[str, float], name: str):
    """Adds the wall time of the block to `timings[f"time/{name}"]` (verl's `marked_timer`)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        key = f"time/{name}"
        timings[key] = timings.get(key, 0.0) + time.perf_counter() - start


def read_metrics(path: str | Path) -> list[dict]:
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
