"""The end of every trainer's step, written once: checkpoint every `save_steps` (and at the last
step), then evaluate every `eval_steps` (and at the last step), then log the step's metrics; the
progress bar and the `max_minutes` stop come with it. SFT, DPO/KTO, RM and the RL loop call it."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

from tqdm import tqdm

from asr_rl.config import RunConfig

log = logging.getLogger("asr_rl.train")


def due(every: int, step: int) -> bool:
    """Whether a task done every `every` steps (<= 0: never) falls on `step`."""
    return every > 0 and step % every == 0


class StepEnd:
    """`end(step, metrics, step_start, save, evaluate)` after each optimiser step; it returns True
    when the run stops there (`max_steps` or `max_minutes` reached).

    Args:
        first_step: the step the run starts after (a resumed run's checkpoint step).
        desc: the progress bar's label.
        postfix: a metric shown on the progress bar (e.g. "loss/total"), under its first part's name.
    """

    def __init__(self, cfg: RunConfig, logger, first_step: int, desc: str, postfix: str | None = None):
        self.cfg, self.logger, self.postfix = cfg, logger, postfix
        self.start = time.perf_counter()
        self.bar = tqdm(total=cfg.max_steps, initial=first_step, desc=desc, disable=not cfg.logging.progress_bar)

    def __call__(self, step: int, metrics: dict, step_start: float, save: Callable[[], None],
                 evaluate: Callable[[], dict] | None = None) -> bool:
        now = time.perf_counter()
        metrics["time/step"] = now - step_start
        metrics["time/elapsed_min"] = (now - self.start) / 60
        out_of_time = 0 < self.cfg.max_minutes <= metrics["time/elapsed_min"]
        last = step >= self.cfg.max_steps or out_of_time
        if last or due(self.cfg.save_steps, step):
            save()  # before the evaluation: a failing evaluation cannot lose the step's update
        if evaluate is not None and (last or due(self.cfg.eval_steps, step)):
            metrics.update(evaluate())
        self.logger.log(step, metrics)
        self.bar.update(1)
        if self.postfix in metrics:
            self.bar.set_postfix({self.postfix.split("/")[0]: f"{metrics[self.postfix]:.3f}"})
        if out_of_time:
            log.info("max_minutes %.1f reached at step %d", self.cfg.max_minutes, step)
        return last

    def close(self) -> None:
        self.bar.close()
        self.logger.close()


__all__ = ["StepEnd", "due"]
