"""The end of a step, shared by every trainer: checkpoint, then evaluate, then log, on their cadences."""
from asr_rl.config import RunConfig, load_config
from asr_rl.trainer.run.step_end import StepEnd


class _Logger:
    def __init__(self):
        self.rows, self.closed = [], False

    def log(self, step, metrics):
        self.rows.append((step, dict(metrics)))

    def close(self):
        self.closed = True


def _run(*overrides, first=0):
    cfg = load_config(RunConfig, None, ["logging.progress_bar=false", *overrides])
    events, logger = [], _Logger()
    end = StepEnd(cfg, logger, first, "test")
    step, stopped = first, False
    while step < cfg.max_steps and not stopped:
        step += 1
        stopped = end(step, {"loss": 1.0}, 0.0, lambda s=step: events.append(("save", s)),
                      lambda s=step: events.append(("eval", s)) or {"eval/cer": 0.5})
    end.close()
    return events, logger


def test_saves_before_evaluating_on_their_cadences_and_at_the_last_step():
    events, logger = _run("max_steps=5", "save_steps=2", "eval_steps=3")
    assert events == [("save", 2), ("eval", 3), ("save", 4), ("save", 5), ("eval", 5)]
    assert [s for s, _ in logger.rows] == [1, 2, 3, 4, 5] and logger.closed
    assert "eval/cer" in logger.rows[2][1] and "eval/cer" not in logger.rows[1][1]
    assert all("time/step" in m and "time/elapsed_min" in m for _, m in logger.rows)


def test_a_resumed_run_counts_from_its_checkpoint_and_zero_means_only_at_the_end():
    events, logger = _run("max_steps=4", "save_steps=0", "eval_steps=-1", first=2)
    assert events == [("save", 4), ("eval", 4)] and [s for s, _ in logger.rows] == [3, 4]


def test_max_minutes_stops_with_a_checkpoint():
    events, logger = _run("max_steps=100", "save_steps=0", "max_minutes=1e-9")
    assert events == [("save", 1), ("eval", 1)] and len(logger.rows) == 1
