"""`reward.term_options` checked at config load (rewards/term_options.py): a misspelt option, a value
of the wrong kind or out of the term's bounds, and a folder a term reads that is not there, each
refused naming the term, the option and the fix, before any model loads."""
from __future__ import annotations

import pytest

from asr_rl.rewards.config import RewardConfig
from asr_rl.trainer.recipes.rl import load_rl_config


@pytest.mark.parametrize("options, message", [
    ({"threshold": 1.5}, r"reward\.term_options\.silence: threshold is silero-vad's speech probability, in \(0, 1\); "
                         r"got 1\.5 .*push the policy to silence on speech"),
    ({"threshold": 0.0}, r"threshold .* in \(0, 1\); got 0\.0"),
    ({"min_speech": -1}, r"min_speech is seconds of detected speech, >= 0; got -1"),
    ({"min_speech": float("nan")}, r"reward\.term_options\.silence\.min_speech must be a finite number, got nan"),
    ({"min_speech": float("inf")}, r"min_speech must be a finite number, got inf"),
    ({"min_speach": 0.2}, r"the silence term has no option 'min_speach' \(did you mean 'min_speech'\?\); its options: "
                          r"min_speech, threshold, graded"),
    ({"graded": "yes"}, r"reward\.term_options\.silence\.graded must be true or false, got 'yes'"),
])
def test_a_silence_option_out_of_its_bounds_is_refused_naming_it(options, message):
    with pytest.raises(ValueError, match=message):
        RewardConfig(terms={"silence": 1.0}, term_options={"silence": options})


def test_options_of_other_kinds_and_terms_without_options():
    with pytest.raises(ValueError, match=r"reward\.term_options\.cer\.floor must be a finite number, got 'low'"):
        RewardConfig(terms={"cer": 1.0}, term_options={"cer": {"floor": "low"}})
    with pytest.raises(ValueError, match=r"reward\.term_options\.fluency\.ngram must be a whole number, got 2\.5"):
        RewardConfig(terms={"fluency": 1.0}, term_options={"fluency": {"ngram": 2.5}})
    with pytest.raises(ValueError, match=r"the empty term has no option 'weight'; its options: none"):
        RewardConfig(terms={"empty": 1.0}, term_options={"empty": {"weight": 2}})
    with pytest.raises(ValueError, match=r"reward\.term_options\.cer must be a mapping"):
        RewardConfig(terms={"cer": 1.0}, term_options={"cer": 0.5})
    ok = RewardConfig(terms={"silence": 1.0, "cer": 1.0, "fluency": 0.2},
                      term_options={"silence": {"threshold": 0.4, "min_speech": 0, "graded": True},
                                    "cer": {"floor": -1}, "fluency": {"ngram": 2}})
    assert ok.term_options["silence"]["threshold"] == 0.4


def test_a_term_s_folder_is_named_at_load_and_checked_with_the_run_s_paths(tmp_path):
    from asr_rl.config import ConfigError
    from asr_rl.trainer.run.folder import check_paths

    with pytest.raises(ValueError, match=r"reward\.term_options\.acoustic: the acoustic term needs its scorer folder"):
        RewardConfig(terms={"acoustic": 1.0})
    with pytest.raises(ValueError, match=r"reward\.term_options\.plausibility: the plausibility term needs its judge"):
        RewardConfig(terms={"plausibility": 1.0})
    # a folder that is not there: refused with the run's other paths, before any model loads
    for term, option, marker in (("acoustic", "scorer", "scorer.json"), ("plausibility", "model", "config.json")):
        cfg = load_rl_config("grpo", None, [f"reward.terms={{{term}: 1.0}}",
                                            f"reward.term_options={{{term}: {{{option}: {tmp_path / 'x'}}}}}"])
        with pytest.raises(ConfigError, match=rf"reward\.term_options\.{term}\.{option}={tmp_path / 'x'} is not the "
                                              rf"folder the {term} term reads \(no {marker}\)"):
            check_paths(cfg)
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "scorer.json").write_text("{}")
    check_paths(load_rl_config("grpo", None, ["reward.terms={acoustic: 1.0}",
                                              f"reward.term_options={{acoustic: {{scorer: {tmp_path / 'x'}}}}}"]))


def test_the_rl_config_refuses_them_at_load_before_any_model(tmp_path):
    """A run whose model folder does not exist: the bad option is what it names (the config loads first)."""
    with pytest.raises(ValueError, match=r"the silence term has no option 'min_speach'"):
        load_rl_config("grpo", None, [f"pretrain={tmp_path / 'none'}", "reward.terms={silence: 1.0}",
                                      "reward.term_options={silence: {min_speach: 0.2}}"])
