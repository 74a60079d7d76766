"""The patience count on its own: what counts as an improvement, and the settings it needs."""
import pytest

from asr_rl.trainer.run.early_stopping import EarlyStopping


def test_a_tie_is_no_improvement_and_an_accuracy_counts_upwards():
    es = EarlyStopping(patience=2)
    verdicts = [es.update(step, v, max_steps=10) for step, v in enumerate([0.5, 0.5, 0.4, 0.4, 0.4], start=1)]
    assert [v.improved for v in verdicts] == [True, False, True, False, False]
    assert [v.stop for v in verdicts] == [False, False, False, False, True] and (es.best, es.best_step) == (0.4, 3)
    acc = EarlyStopping(patience=1, greater_is_better=True, metric="eval/accuracy")
    assert acc.update(1, 0.6, 10).improved and acc.update(2, 0.7, 10).improved and acc.update(3, 0.65, 10).stop
    assert (acc.best, acc.best_key) == (0.7, "eval/best_accuracy")


def test_the_state_round_trips_and_decides_where_a_resumed_run_ends():
    es = EarlyStopping(patience=2, decay_steps=3)
    for step, v in enumerate([0.5, 0.6, 0.7], start=1):
        verdict = es.update(step, v, max_steps=10)
    assert verdict.decay_steps == 3 and not verdict.stop and es.decay_end == 6
    again = EarlyStopping(patience=2, decay_steps=3)
    again.load_state_dict(es.state_dict())
    assert not again.done(5) and again.done(6) and again.state_dict() == es.state_dict()


def test_after_the_decay_plateau_patience_counts_from_the_last_improvement():
    es = EarlyStopping(patience=1, decay_steps=2, plateau_patience=2)
    dev = {1: 0.5, 2: 0.6, 3: 0.4, 4: 0.45, 5: 0.3, 6: 0.31, 7: 0.32, 8: 0.1}
    stops = {step: es.update(step, v, max_steps=10).stop for step, v in dev.items() if step <= 7}
    # patience 1 runs out at 2: the decay ends at 4, one evaluation after 3's best, so the run goes on;
    # 5 improves, and 6 and 7 do not: it ends at 7
    assert es.decay_end == 4 and stops == {1: False, 2: False, 3: False, 4: False, 5: False, 6: False, 7: True}
    assert (es.best, es.best_step) == (0.3, 5)


def test_early_stopping_settings_that_need_others_are_refused_at_load(tmp_path):
    from asr_rl.config import load_config
    from asr_rl.trainer.configs.rl import SFTConfig

    with pytest.raises(ValueError, match="early_stopping_patience=3 counts dev evaluations: set eval_manifest"):
        load_config(SFTConfig, None, ["early_stopping_patience=3"])
    with pytest.raises(ValueError, match="early_stopping_decay_steps=5 starts when patience runs out"):
        load_config(SFTConfig, None, ["early_stopping_decay_steps=5"])
    with pytest.raises(ValueError, match="early_stopping_plateau_patience=2 counts evaluations after the decay"):
        load_config(SFTConfig, None, ["early_stopping_patience=3", "eval_manifest=dev.jsonl", "eval_steps=10",
                                      "early_stopping_plateau_patience=2"])
    cfg = load_config(SFTConfig, None, ["early_stopping_patience=3", "eval_manifest=dev.jsonl", "eval_steps=10"])
    assert EarlyStopping.from_config(cfg).patience == 3 and EarlyStopping.from_config(load_config(SFTConfig)) is None
