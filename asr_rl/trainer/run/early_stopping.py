"""Early stopping on a dev metric: its settings (flat keys of a trainer's config, as in the HF
Trainer's `early_stopping_patience`) and the patience count, a pure state machine that `StepEnd`
(run/step_end.py) feeds every evaluation and saves in each checkpoint.

How it combines with the schedule's decay (a run's end is not known in advance): the dev curve of
a constant or slowly decaying rate plateaus above where an annealed rate ends, and the gains come as
the rate anneals (BENCHMARKS.md, the SFT pilots). So when patience runs out, `early_stopping_decay_steps` > 0 does
not stop the run: it anneals the rate from where it is to the floor over that many steps and ends
the run there (the WSD recipe: a stable phase as long as dev improves, then a short decay branched
off it; Hu et al. 2024, arXiv:2404.06395; Hägele et al. 2024, arXiv:2405.18392 find a decay branched
off anywhere matches a cosine planned for that length). The decay starts from the current weights
and optimiser state, not from the best ones: at a constant rate dev is noisy, and the decay is what
settles it. Evaluations go on during the decay (the best weights are kept as ever); patience does
not stop it. With 0 the run stops when patience runs out.

After the decay the run ends, unless `early_stopping_plateau_patience` > 0: then it trains on at the
floor rate and ends once that many evaluations in a row (counted from the last improvement, which
may fall in the decay) bring no improvement. That is the plateau, and its last window is the
equal-time control for whatever follows the SFT: dev flat over `plateau_patience * eval_steps` more
steps of cross-entropy says what more SFT would have given an RL stage of that length.
"""
from __future__ import annotations

from dataclasses import dataclass
from asr_rl.trainer.configs.early_stopping import EarlyStoppingConfig


@dataclass(frozen=True)
class Verdict:
    """What one evaluation decided: `improved` (save the best weights), `decay_steps` (> 0: begin a
    decay of that many steps now), `stop` (end the run at this step)."""

    improved: bool
    decay_steps: int
    stop: bool


@dataclass
class EarlyStopping:
    """The patience count over a run's evaluations; `state_dict()` goes into every checkpoint, so a
    resumed run stops where an uninterrupted one would.

    Attributes:
        patience, min_delta, metric, decay_steps, plateau_patience: the settings (EarlyStoppingConfig).
        greater_is_better: a metric to maximise (an accuracy); the SFT metrics are error rates.
        best, best_step: the best value and the step it was reached at.
        bad_evals: evaluations since the last improvement.
        decay_end: the step a decay begun by running out of patience ends at (and the run with it,
            unless `plateau_patience` > 0).
    """

    patience: int
    min_delta: float = 0.0
    metric: str = "eval/cer"
    decay_steps: int = 0
    plateau_patience: int = 0
    greater_is_better: bool = False
    best: float | None = None
    best_step: int | None = None
    bad_evals: int = 0
    decay_end: int | None = None

    @classmethod
    def from_config(cls, cfg: EarlyStoppingConfig) -> EarlyStopping | None:
        """The tracker of `cfg`'s settings; None when early stopping is off."""
        if not cfg.early_stopping_patience:
            return None
        return cls(cfg.early_stopping_patience, cfg.early_stopping_min_delta, cfg.early_stopping_metric,
                   cfg.early_stopping_decay_steps, cfg.early_stopping_plateau_patience)

    @property
    def best_key(self) -> str:
        """The metrics key of the best value: "eval/cer" -> "eval/best_cer"."""
        head, _, tail = self.metric.rpartition("/")
        return f"{head}/best_{tail}" if head else f"best_{tail}"

    def update(self, step: int, value: float, max_steps: int) -> Verdict:
        """Count the evaluation of `step`; `max_steps` bounds a decay."""
        gain = None if self.best is None else (value - self.best if self.greater_is_better else self.best - value)
        improved = gain is None or gain > self.min_delta
        if improved:
            self.best, self.best_step, self.bad_evals = value, step, 0
        else:
            self.bad_evals += 1
        decay = 0
        if self.bad_evals >= self.patience and self.decay_end is None and self.decay_steps > 0 and step < max_steps:
            decay = min(self.decay_steps, max_steps - step)
            self.decay_end = step + decay
        return Verdict(improved, decay, self.done(step))

    def begin_decay(self, step: int, steps: int) -> None:
        """A decay of `steps` begun at `step` for another reason than patience (the time cap)."""
        self.decay_end = step + steps

    def done(self, step: int) -> bool:
        """Whether the run ends at `step`: patience ran out (with no decay to run), or the decay ended
        (and, with `plateau_patience`, that many evaluations since the best brought no improvement)."""
        if self.decay_end is not None:
            return step >= self.decay_end and self.bad_evals >= self.plateau_patience
        return self.bad_evals >= self.patience and self.decay_steps == 0

    def state_dict(self) -> dict:
        return {"best": self.best, "best_step": self.best_step, "bad_evals": self.bad_evals,
                "decay_end": self.decay_end}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.best_step = state["best"], state["best_step"]
        self.bad_evals, self.decay_end = state["bad_evals"], state["decay_end"]


__all__ = ["EarlyStopping", "Verdict"]
