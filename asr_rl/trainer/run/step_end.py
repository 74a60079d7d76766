"""The end of every trainer's step, written once: checkpoint every `save_steps` (and at the last
step), evaluate every `eval_steps` (and at the last step), then log the step's metrics; the
progress bar, the `max_minutes` stop and early stopping on dev (run/early_stopping.py) come with it.
SFT, DPO/KTO, RM and the RL loop call it."""
from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from asr_rl.config import RunConfig
from asr_rl.trainer.run.early_stopping import EarlyStopping

log = logging.getLogger("asr_rl.train")


def due(every: int, step: int) -> bool:
    """Whether a task done every `every` steps (<= 0: never) falls on `step`."""
    return every > 0 and step % every == 0


def elapsed_at(output_dir, step: int) -> float:
    """Minutes a run had trained by `step` (the last `time/elapsed_min` its metrics log holds at or
    before it; 0 for a fresh run or one without a log)."""
    from asr_rl.trainer.run.metrics import read_metrics

    if step <= 0 or not output_dir or not (Path(output_dir) / "metrics.jsonl").is_file():
        return 0.0
    rows = read_metrics(output_dir)
    return max((r.get("time/elapsed_min", 0.0) for r in rows if r.get("step", 0) <= step), default=0.0)


class StepEnd:
    """`end(step, metrics, step_start, save, evaluate)` after each optimiser step; it returns True
    when the run stops there (`max_steps` or `max_minutes` reached, or early stopping's end).

    Without early stopping the checkpoint comes before the evaluation, so that a failing evaluation
    cannot lose the step's update. With it the evaluation comes first: the checkpoint holds the
    evaluation's verdict (`state_dict()`: best value, evaluations since it, a decay begun), so a run
    resumed from it counts on where an uninterrupted one would; a failing evaluation then costs the
    steps since the checkpoint before (the resumed run does them again).

    Args:
        first_step: the step the run starts after (a resumed run's checkpoint step).
        desc: the progress bar's label.
        postfix: a metric shown on the progress bar (e.g. "loss/total"), under its first part's name.
        early_stopping: the patience count (None: off); the trainer saves `state_dict()` in its
            checkpoints and gives it back with `load_state_dict`.
        save_best: `save_best(info=...)` writes the weights as the best on dev (`info`: step,
            metric, value); called whenever an evaluation improves on the best.
        decay_now: `decay_now(n)` anneals the rate to its floor over the next n steps
            (`LocalStrategy.decay_now`); called when patience runs out and a decay follows, or when
            `max_minutes` would cut the planned decay (`_reserve_decay`).
        decaying: `decaying()` says whether such a decay has begun (`LocalStrategy.decaying`).
    """

    def __init__(self, cfg: RunConfig, logger, first_step: int, desc: str, postfix: str | None = None,
                 early_stopping: EarlyStopping | None = None, save_best: Callable[..., object] | None = None,
                 decay_now: Callable[[int], None] | None = None, decaying: Callable[[], bool] | None = None,
                 fit_schedule: Callable[[int, int], bool] | None = None):
        self.cfg, self.logger, self.postfix = cfg, logger, postfix
        self.early, self.save_best, self.decay_now, self.decaying = early_stopping, save_best, decay_now, decaying
        self.fit_schedule, self.fitted = fit_schedule, False  # the schedule laid out anew for the cap (once)
        self.step = first_step
        self.cap_decay_end: int | None = None  # where a decay the time cap began ends (WSD: the run ends there)
        self.ends: deque[float] = deque([time.perf_counter()], maxlen=1001)  # recent step ends: the pace
        # a resumed run's clock goes on from its checkpoint: `max_minutes` and the logged time axis
        # (asr-rl report, the RL-vs-SFT comparisons by minute) count the whole run
        self.start = time.perf_counter() - 60 * elapsed_at(cfg.output_dir, first_step)
        self.bar = tqdm(total=cfg.max_steps, initial=first_step, desc=desc, disable=not cfg.logging.progress_bar)

    @property
    def done(self) -> bool:
        """Whether early stopping ended the run at the current step (a resumed run may start there)."""
        return self.early is not None and self.early.done(self.step)

    def __call__(self, step: int, metrics: dict, step_start: float, save: Callable[[], None],
                 evaluate: Callable[[], dict] | None = None) -> bool:
        self.step = step
        now = time.perf_counter()
        metrics["time/step"] = now - step_start
        metrics["time/elapsed_min"] = (now - self.start) / 60
        self._reserve_decay(step, metrics, now)
        out_of_time = 0 < self.cfg.max_minutes <= metrics["time/elapsed_min"]
        # the step an early-stopping decay ends at is evaluated and checkpointed (the run may end there)
        decay_over = self.early is not None and step == self.early.decay_end
        cap_decay_over = self.early is None and self.cap_decay_end is not None and step >= self.cap_decay_end
        if cap_decay_over and not out_of_time:
            log.info("the decay the time cap began ended at step %d with %.1f min of max_minutes left: the run ends "
                     "here (more steps at the floor rate would add little)", step,
                     self.cfg.max_minutes - metrics["time/elapsed_min"])
        last = step >= self.cfg.max_steps or out_of_time or cap_decay_over
        save_due = last or decay_over or due(self.cfg.save_steps, step)
        if save_due and self.early is None:
            save()  # before the evaluation: a failing evaluation cannot lose the step's update
        stop = False
        if evaluate is not None and (last or decay_over or due(self.cfg.eval_steps, step)):
            metrics.update(evaluate())
            stop = self.early is not None and self._judge(step, metrics)
        if self.early is not None and (save_due or stop):
            save()  # after the evaluation, whose verdict the checkpoint holds
        self.logger.log(step, metrics)
        self.bar.update(1)
        if self.postfix in metrics:
            self.bar.set_postfix({self.postfix.split("/")[0]: f"{metrics[self.postfix]:.3f}"})
        if out_of_time:
            log.info("max_minutes %.1f reached at step %d", self.cfg.max_minutes, step)
        return last or stop

    def _reserve_decay(self, step: int, metrics: dict, now: float) -> None:
        """Start the planned decay (early stopping's, else WSD's) at the latest when the time
        `max_minutes` leaves is what the decay takes at this run's pace (evaluations and saves
        included, over as many recent steps as the decay has: a warm cache's, not the first epoch's): a
        slower host then decays sooner instead of being cut before its decay, which is where most of
        the gain comes. Logged (and `schedule/decay_for_time_cap` in the metrics) when it moves the
        schedule. First, when the steps the cap holds cannot hold the warm-up and that decay, the
        schedule is laid out over those steps (`fit_schedule`; `schedule/planned_for_time_cap`)."""
        self.ends.append(now)
        if self.cfg.max_minutes <= 0 or len(self.ends) < 4:
            return
        n = self._planned_decay(step)
        recent = list(self.ends)[-min(max(n, 3), 1000) - 1:]
        pace = (recent[-1] - recent[0]) / (len(recent) - 1)
        left = 60 * (self.cfg.max_minutes - metrics["time/elapsed_min"])
        holds = step + int(left / pace) if pace > 0 else self.cfg.max_steps
        if (self.fit_schedule is not None and not self.fitted and holds < self.cfg.max_steps
                and self.fit_schedule(holds, n)):
            self.fitted = True
            log.warning("max_minutes %g holds about %d steps at %.2f s a step, too few for the warm-up and the %d-step "
                        "decay planned over max_steps=%d: the schedule is planned over %d steps instead (its warm-up "
                        "reaches the peak rate)", self.cfg.max_minutes, holds, pace, n, self.cfg.max_steps, holds)
            metrics["schedule/planned_for_time_cap"] = holds
        if n == 0 or self.decay_now is None or left > n * pace:
            return
        planned, fits = n, max(1, int(left / pace)) if pace > 0 else n
        if fits >= 0.9 * n:  # the time left is (about) what the decay takes: the check's own step of slack
            fits = n
        n = max(1, min(n, fits, self.cfg.max_steps - step))
        if self.early is not None:
            self.early.begin_decay(step, n)
        else:
            self.cap_decay_end = step + n
        self.decay_now(n)
        metrics["schedule/decay_for_time_cap"] = step
        if n < planned:  # the cap leaves less than the planned decay: the shorter decay it can still give
            log.warning("max_minutes %g: %.1f min left hold %d steps at %.2f s a step, fewer than the %d-step decay "
                        "planned: decaying the rate over %d steps from step %d (the time cap shortened the decay; "
                        "raise max_minutes or lower max_steps for the planned one)", self.cfg.max_minutes, left / 60,
                        fits, pace, planned, n, step)
            return
        log.info("max_minutes %g: %.1f min left, what the %d-step decay takes at %.2f s a step: decaying the rate "
                 "from step %d, earlier than planned (the time cap changed the schedule)", self.cfg.max_minutes,
                 left / 60, n, pace, step)

    def _planned_decay(self, step: int) -> int:
        """Steps of the decay still to come: early stopping's `decay_steps`, or WSD's last
        `lr_decay_ratio` of `max_steps` when it has not begun by `step`; 0 once a decay runs."""
        if self.decaying is not None and self.decaying():
            return 0
        if self.early is not None and self.early.decay_steps:
            return self.early.decay_steps if self.early.decay_end is None else 0
        optim = getattr(self.cfg, "optim", None)
        if getattr(optim, "lr_scheduler", None) == "warmup_stable_decay":
            n = math.ceil(optim.lr_decay_ratio * self.cfg.max_steps)
            return n if step < self.cfg.max_steps - n else 0
        return 0

    def _judge(self, step: int, metrics: dict) -> bool:
        """Early stopping's verdict on this evaluation, acted on; True when the run ends here."""
        es = self.early
        if es.metric not in metrics:
            raise KeyError(f"early_stopping_metric {es.metric} is not among the evaluation's metrics "
                           f"({', '.join(k for k in metrics if k.startswith('eval/'))})")
        verdict = es.update(step, float(metrics[es.metric]), self.cfg.max_steps)
        if verdict.improved and self.save_best is not None:
            self.save_best(info={"step": step, "metric": es.metric, "value": es.best})
        if verdict.decay_steps:
            then = (f"then at the floor until {es.plateau_patience} evaluations bring no improvement"
                    if es.plateau_patience else "then ending")
            log.info("%s: no improvement in %d evaluations at step %d (best %.4g at step %d): decaying the rate "
                     "over %d steps, %s", es.metric, es.bad_evals, step, es.best, es.best_step, verdict.decay_steps,
                     then)
            if self.decay_now is not None:
                self.decay_now(verdict.decay_steps)
        metrics[es.best_key] = es.best
        metrics["early_stopping/bad_evals"] = es.bad_evals
        if verdict.stop:
            log.info("early stopping at step %d: best %s %.4g at step %d", step, es.metric, es.best, es.best_step)
        return verdict.stop

    def state_dict(self) -> dict | None:
        return self.early.state_dict() if self.early is not None else None

    def load_state_dict(self, state: dict | None) -> None:
        """A checkpoint's early-stopping state (None: one saved without early stopping, which starts afresh)."""
        if self.early is not None and state is not None:
            self.early.load_state_dict(state)

    def close(self) -> None:
        self.bar.close()
        self.logger.close()


__all__ = ["StepEnd", "due"]
