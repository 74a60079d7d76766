"""The end of a step, shared by every trainer: checkpoint, then evaluate, then log, on their cadences."""
import pytest

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


# dev CER after each step; patience 2 with min_delta 0.05: improvements at 1, 2 and 4 (0.67 and 0.58
# are within 0.05 of the best), then 5 and 6 are two evaluations without one: the run stops at 6
# with step 4's 0.60 as the best, though 0.57 is lower (a change under min_delta is noise)
DEV = {1: 0.90, 2: 0.70, 3: 0.67, 4: 0.60, 5: 0.58, 6: 0.57, 7: 0.50, 8: 0.40, 9: 0.45, 10: 0.44}


def _run_es(*overrides, first=0, state=None, decay=0, dev=DEV, plateau=0):
    from asr_rl.trainer.run.early_stopping import EarlyStopping

    cfg = load_config(RunConfig, None, ["logging.progress_bar=false", "max_steps=10", "eval_steps=1", *overrides])
    events, logger, states = [], _Logger(), {}
    early = EarlyStopping(patience=2, min_delta=0.05, decay_steps=decay, plateau_patience=plateau)
    end = StepEnd(cfg, logger, first, "test", early_stopping=early,
                  save_best=lambda info: events.append(("best", info["step"], info["value"])),
                  decay_now=lambda n: events.append(("decay", n)))
    end.load_state_dict(state)
    step, stopped = first, end.done
    while step < cfg.max_steps and not stopped:
        step += 1
        stopped = end(step, {"loss": 1.0}, 0.0,
                      lambda s=step: (events.append(("save", s)), states.__setitem__(s, end.state_dict())),
                      lambda s=step: events.append(("eval", s)) or {"eval/cer": dev[s]})
    end.close()
    return events, logger, states, end


def test_early_stopping_stops_when_patience_runs_out_and_keeps_the_best():
    events, logger, states, end = _run_es("save_steps=4")
    # with early stopping the checkpoint follows the evaluation; the step it stops at is checkpointed too
    assert events == [("eval", 1), ("best", 1, 0.90), ("eval", 2), ("best", 2, 0.70), ("eval", 3), ("eval", 4),
                      ("best", 4, 0.60), ("save", 4), ("eval", 5), ("eval", 6), ("save", 6)]
    assert [s for s, _ in logger.rows] == [1, 2, 3, 4, 5, 6]
    assert [m["eval/best_cer"] for _, m in logger.rows] == [0.90, 0.70, 0.70, 0.60, 0.60, 0.60]
    assert [m["early_stopping/bad_evals"] for _, m in logger.rows] == [0, 0, 1, 0, 1, 2]
    assert states[4] == {"best": 0.60, "best_step": 4, "bad_evals": 0, "decay_end": None}
    assert states[6]["bad_evals"] == 2 and end.done


def test_resumed_mid_patience_early_stopping_stops_where_the_uninterrupted_run_does():
    straight, _, states, _ = _run_es("save_steps=1")
    resumed, logger, _, _ = _run_es("save_steps=1", first=5, state=states[5])  # after one bad evaluation
    assert [s for s, _ in logger.rows] == [6] and resumed == [("eval", 6), ("save", 6)]
    assert [e for e in straight if e[0] == "save"][-1] == ("save", 6)
    # a run resumed from the checkpoint of its last step does nothing more
    again, logger, _, end = _run_es("save_steps=1", first=6, state=states[6])
    assert again == [] and logger.rows == [] and end.done


def test_running_out_of_patience_begins_the_decay_and_the_run_ends_after_it():
    events, logger, states, end = _run_es("save_steps=0", decay=3)
    assert ("decay", 3) in events and events.index(("decay", 3)) == events.index(("eval", 6)) + 1
    assert [s for s, _ in logger.rows] == list(range(1, 10))  # 6 + 3 steps of decay
    assert ("best", 8, 0.40) in events  # evaluations go on during the decay and may still find the best
    assert events[-1] == ("save", 9) and states[9]["decay_end"] == 9 and end.done
    # the decay never runs past max_steps
    events, logger, _, _ = _run_es("save_steps=0", decay=30)
    assert ("decay", 4) in events and [s for s, _ in logger.rows][-1] == 10


def test_with_plateau_patience_the_run_goes_on_at_the_floor_until_dev_stops_improving():
    # as above, the decay begun at step 6 ends at 9 (0.45: one evaluation without an improvement on 8's
    # 0.40); with plateau patience 2 the run goes on: 10 improves (0.30), 11 and 12 are within min_delta
    # of it, so the run ends at 12 of 14, although 13 would have improved
    dev = {**DEV, 10: 0.30, 11: 0.28, 12: 0.27, 13: 0.10, 14: 0.10}
    events, logger, states, end = _run_es("save_steps=0", "max_steps=14", decay=3, dev=dev, plateau=2)
    assert [s for s, _ in logger.rows] == list(range(1, 13)) and end.done
    assert ("save", 9) in events and ("best", 10, 0.30) in events and events[-1] == ("save", 12)
    assert [m["early_stopping/bad_evals"] for _, m in logger.rows][8:] == [1, 0, 1, 2]
    assert states[9] == {"best": 0.40, "best_step": 8, "bad_evals": 1, "decay_end": 9}
    # resumed from the decay's end, it ends where the uninterrupted run did
    again, logger, _, end = _run_es("save_steps=0", "max_steps=14", first=9, state=states[9], decay=3, dev=dev,
                                    plateau=2)
    assert [s for s, _ in logger.rows] == [10, 11, 12] and end.done
    # without plateau patience the same run ends with the decay
    _, logger, _, _ = _run_es("save_steps=0", "max_steps=14", decay=3, dev=dev)
    assert [s for s, _ in logger.rows][-1] == 9


def test_a_resumed_run_s_clock_goes_on_from_its_checkpoint(tmp_path):
    import json

    # the killed run logged steps 1-3; its checkpoint is step 2, after 2.5 minutes
    rows = [{"step": 1, "time/elapsed_min": 1.0}, {"step": 2, "time/elapsed_min": 2.5},
            {"step": 3, "time/elapsed_min": 3.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    events, logger = _run("max_steps=10", "save_steps=0", "eval_steps=-1", f"output_dir={tmp_path}",
                          "max_minutes=60", first=2)
    assert 2.5 <= logger.rows[0][1]["time/elapsed_min"] < 2.55 and [s for s, _ in logger.rows] == list(range(3, 11))
    # max_minutes counts the whole run: 2.5 of 2.5 minutes were spent before the kill, so the
    # resumed run stops after its first step (a clock from zero would run to max_steps)
    events, logger = _run("max_steps=10", "save_steps=0", "eval_steps=-1", f"output_dir={tmp_path}",
                          "max_minutes=2.5", first=2)
    assert events == [("save", 3), ("eval", 3)] and [s for s, _ in logger.rows] == [3]
    fresh_events, fresh = _run("max_steps=3", f"output_dir={tmp_path / 'new'}")
    assert fresh.rows[0][1]["time/elapsed_min"] < 0.05


def test_a_time_cap_starts_the_decay_in_time_for_it_to_finish_on_a_slow_host(caplog):
    """max_minutes would cut the planned 10-step decay (patience never runs out): the decay starts
    when the time left is what 10 steps take at the pace measured, and ends before the cap."""
    import logging
    import time

    from asr_rl.trainer.run.early_stopping import EarlyStopping

    cfg = load_config(RunConfig, None, ["logging.progress_bar=false", "max_steps=1000", "max_minutes=0.025",
                                        "save_steps=0", "eval_steps=0"])
    early = EarlyStopping(patience=100, min_delta=0.0, metric="eval/cer", decay_steps=10, plateau_patience=0)
    decays = []
    end = StepEnd(cfg, _Logger(), 0, "test", early_stopping=early, decay_now=decays.append,
                  decaying=lambda: bool(decays))
    step, stopped = 0, False
    with caplog.at_level(logging.INFO, logger="asr_rl.train"):
        while not stopped:
            start = time.perf_counter()
            time.sleep(0.05)  # a slow host: 0.05 s a step, 1.5 s in all
            step += 1
            stopped = end(step, {"loss": 1.0}, start, lambda: None)
    assert decays == [10]
    began = early.decay_end - 10
    assert 10 <= began <= 25 and step >= early.decay_end - 1  # the decay ran to its end (one step of timing slack)
    assert any("the time cap changed the schedule" in r.getMessage() for r in caplog.records)
    assert early.done(early.decay_end)


def _wsd_run(max_minutes: float, step_seconds: float, caplog, decaying_seconds: float | None = None):
    """A WSD run of 1000 steps (decay: its last 10%, 100 steps) under a time cap, `step_seconds` a step
    (`decaying_seconds` once the decay has begun)."""
    import logging
    import time

    from asr_rl.trainer.configs.rl import SFTConfig

    cfg = load_config(SFTConfig, None, ["logging.progress_bar=false", "max_steps=1000", f"max_minutes={max_minutes}",
                                        "save_steps=0", "eval_steps=0", "optim.lr_scheduler=warmup_stable_decay",
                                        "optim.lr_decay_ratio=0.1"])
    decays = []
    end = StepEnd(cfg, _Logger(), 0, "test", decay_now=decays.append, decaying=lambda: bool(decays))
    step, stopped = 0, False
    with caplog.at_level(logging.INFO, logger="asr_rl.train"):
        while not stopped:
            start = time.perf_counter()
            time.sleep(decaying_seconds if decays and decaying_seconds is not None else step_seconds)
            step += 1
            stopped = end(step, {"loss": 1.0}, start, lambda: None)
    return decays, step, end


def test_a_decay_the_cap_cannot_hold_is_shortened_to_what_it_can_and_said(caplog):
    # 0.6 s in all at 0.02 s a step: ~30 steps, far fewer than the 100-step decay
    decays, step, end = _wsd_run(0.01, 0.02, caplog)
    assert len(decays) == 1 and decays[0] < 100 and decays[0] <= 30
    assert any("the time cap shortened the decay" in r.getMessage() for r in caplog.records)
    assert step <= end.cap_decay_end + 1  # it ran to (about) the shortened decay's end, not past it at the floor


def test_the_run_ends_when_the_decay_the_cap_began_is_over(caplog):
    """The decay began for the cap ends early (the pace sped up): the run ends there, saying so,
    rather than going on at the floor rate until the cap."""
    # 3 s; 0.02 s a step until the decay begins (planned for 2 s), then 0.005: it ends 1.5 s early
    decays, step, end = _wsd_run(0.05, 0.02, caplog, decaying_seconds=0.005)
    assert decays == [100] and step == end.cap_decay_end
    assert any("the run ends here" in r.getMessage() for r in caplog.records)


def test_a_cap_inside_the_warm_up_plans_the_schedule_for_the_steps_it_holds(caplog):
    """1000 steps planned (a 50-step warm-up, then a 100-step WSD decay to half the peak) and a cap
    that holds about 30: the schedule is laid out over those (its warm-up reaches the peak), and the
    decay the cap then begins only lowers the rate, never below the floor."""
    import logging
    import time

    import torch

    from asr_rl.trainer.configs.rl import SFTConfig
    from asr_rl.trainer.update.strategy import LocalStrategy

    cfg = load_config(SFTConfig, None, ["logging.progress_bar=false", "max_steps=1000", "max_minutes=0.01",
                                        "save_steps=0", "eval_steps=0", "optim.lr_scheduler=warmup_stable_decay",
                                        "optim.lr_decay_ratio=0.1", "optim.lr_warmup_ratio=0.05",
                                        "optim.min_lr_ratio=0.5", "optim.learning_rate=0.01"])
    strategy = LocalStrategy.from_config([torch.nn.Parameter(torch.zeros(2))], cfg.optim, cfg.max_steps)
    end = StepEnd(cfg, _Logger(), 0, "test", decay_now=strategy.decay_now, decaying=strategy.decaying,
                  fit_schedule=strategy.fit_schedule)
    rates, step, stopped = [], 0, False
    with caplog.at_level(logging.INFO, logger="asr_rl.train"):
        while not stopped:
            start = time.perf_counter()
            rates.append(strategy.lr)  # the rate this step trains at
            strategy.optimizer.step()
            strategy.scheduler.step()
            time.sleep(0.02)  # ~30 steps in 0.6 s
            step += 1
            stopped = end(step, {"loss": 1.0}, start, lambda: None)
    assert step < 50  # the cap ended the run inside the warm-up planned over max_steps
    # ... and the warm-up planned anew reached the peak (the cap's decay begins from it at once)
    assert max(rates) == pytest.approx(0.01, rel=0.01)
    assert any("the schedule is planned over" in r.getMessage() for r in caplog.records)
    peak_at = rates.index(max(rates))
    assert all(b <= a + 1e-12 for a, b in zip(rates[peak_at:], rates[peak_at + 1:]))  # from there on, only down
    assert 0.005 - 1e-12 <= rates[-1] < 0.01  # decayed toward the floor (half the peak), not past it


def test_a_decay_begun_below_the_floor_does_not_raise_the_rate():
    from asr_rl.trainer.configs.optim import AdamWConfig
    from asr_rl.trainer.update.strategy import LRSchedule

    schedule = LRSchedule(AdamWConfig(lr_warmup_ratio=0.5, min_lr_ratio=1.0), 100)  # warm-up: 50 steps
    schedule.decay_now(2, 10)  # at 3/51 of the peak, inside the warm-up: the floor (the peak) is above it
    assert [schedule(k) for k in range(2, 14)] == pytest.approx([schedule.base(1)] * 12)
