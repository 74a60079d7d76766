"""The `early_stopping_*` keys a trainer's config inherits (the patience count that reads them is
trainer/run/early_stopping.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from asr_rl.settings import setting


@dataclass(frozen=True)
class EarlyStoppingConfig:
    """Early stopping on dev (`eval_manifest` every `eval_steps`); a trainer's config inherits these
    keys. The best weights on dev are kept as `<output_dir>/best/` (with `best.json`: step, metric,
    value); `final/` holds the last weights (after the decay, when there is one).

    Attributes:
        early_stopping_patience: evaluations in a row without an improvement of more than
            `early_stopping_min_delta` after which patience runs out; 0 = off (no `best/` either).
        early_stopping_min_delta: the least change of the metric that counts as an improvement (a
            tie never does); it also decides which weights are the best (Keras' semantics).
        early_stopping_metric: the dev metric watched, lower is better.
        early_stopping_decay_steps: when patience runs out, anneal the rate to `optim.min_lr_ratio`
            over this many more steps (within `max_steps`), then end; 0 = end at once. Pairs with
            `optim.lr_scheduler=warmup_stable_decay`, whose stable phase early stopping watches.
        early_stopping_plateau_patience: after the decay, train on at the floor rate until this many
            evaluations in a row bring no improvement (the plateau), then end; 0 = end with the decay.
    """

    early_stopping_patience: int = setting(0, ge=0, note="0 = off")
    early_stopping_min_delta: float = setting(0.0, ge=0)
    early_stopping_metric: Literal["eval/cer", "eval/wer"] = "eval/cer"
    early_stopping_decay_steps: int = setting(0, ge=0, note="0 = stop when patience runs out")
    early_stopping_plateau_patience: int = setting(0, ge=0, note="0 = end when the decay ends")

    def check_early_stopping(self, eval_manifest: str | None, eval_steps: int) -> None:
        """Settings that need others (called by the owning config's `__post_init__`)."""
        if self.early_stopping_patience and (not eval_manifest or eval_steps <= 0):
            raise ValueError(f"early_stopping_patience={self.early_stopping_patience} counts dev evaluations: set "
                             f"eval_manifest and eval_steps > 0 (got eval_steps={eval_steps})")
        if self.early_stopping_decay_steps and not self.early_stopping_patience:
            raise ValueError(f"early_stopping_decay_steps={self.early_stopping_decay_steps} starts when patience "
                             "runs out: set early_stopping_patience > 0")
        if self.early_stopping_plateau_patience and not self.early_stopping_decay_steps:
            raise ValueError(f"early_stopping_plateau_patience={self.early_stopping_plateau_patience} counts "
                             "evaluations after the decay: set early_stopping_decay_steps > 0")
