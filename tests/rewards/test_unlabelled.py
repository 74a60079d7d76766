"""Unlabelled lines (no transcript): which terms score them, and what is refused at load."""
from __future__ import annotations

import doctest
from types import SimpleNamespace

import pytest

from asr_rl.rewards import terms
from asr_rl.rewards.base import RewardError, Sample
from asr_rl.rewards.combine import WeightedReward
from asr_rl.rewards.config import RewardConfig
from asr_rl.rewards.pipeline import check_reward_coverage


def test_the_term_docstrings_hold():
    assert doctest.testmod(terms).failed == 0


def test_each_term_declares_whether_it_needs_the_reference():
    free = set(terms.TERMS.where(needs_reference=False))
    assert free == {"language", "fluency", "repetition", "speaking_rate", "acoustic", "silence", "plausibility",
                    "consensus"}
    assert set(terms.TERMS.where(needs_audio=True)) == {"acoustic", "silence"}
    assert set(terms.TERMS.where(needs_group=True)) == {"consensus", "language"}
    assert {"cer", "wer", "keyword", "biasing", "omission", "hallucination", "empty", "dg_wer"} <= set(
        terms.TERMS.where(needs_reference=True))


def test_a_mixed_batch_gets_the_terms_each_line_can_be_scored_by():
    reward = WeightedReward({"cer": 1.0, "repetition": 0.5, "speaking_rate": 2.0})
    labelled = Sample("call anna", "call ana", "en", duration=1.0)
    unlabelled = Sample("call bob call bob call bob", None, "en", duration=1.0)
    out = reward([labelled, unlabelled])
    # labelled: 1 - CER(call ana -> call anna) = 1 - 1/8; no repetition; 8 chars a second is in range
    # unlabelled: no CER; repetition -0.5 (2 of 4 trigrams repeat); 21 chars/s is in range
    assert out.terms["cer"] == [pytest.approx(0.875), None]
    assert out.terms["repetition"] == [0.0, -0.5]
    assert out.rewards == [pytest.approx(0.875), pytest.approx(-0.25)]
    assert out.log()["reward/cer"] == pytest.approx(0.875)  # the mean over the lines it applies to


def test_an_unlabelled_sample_no_term_can_score_is_an_error_naming_the_terms():
    with pytest.raises(RewardError, match=r"sample 0 \('u1'\) has no reference and every reward term \(cer, omission\)"):
        WeightedReward({"cer": 1.0, "omission": 0.5})([Sample("x", None, prompt="u1")])


def _utts(*texts):
    return [SimpleNamespace(text=t, source=f"pool.jsonl:{i + 1}", id=str(i)) for i, t in enumerate(texts)]


def test_the_coverage_rule_at_load():
    mixed, unlabelled = _utts("call anna", None), _utts(None, None)
    check_reward_coverage(RewardConfig(terms={"cer": 1.0, "fluency": 0.2}), mixed)  # each line gets a term
    check_reward_coverage(RewardConfig(terms={"fluency": 1.0}), unlabelled)
    check_reward_coverage(RewardConfig(terms={"cer": 1.0}), _utts("a", "b"))  # all labelled: anything goes
    with pytest.raises(ValueError, match=r"reward term 'cer' needs the transcript and pool.jsonl:2 has none "
                                         r"\(1 of 2 lines are unlabelled\); add a term that needs none"):
        check_reward_coverage(RewardConfig(terms={"cer": 1.0}), mixed)
    with pytest.raises(ValueError, match=r"reward term 'omission' needs the transcript and no line has one "
                                         r"\(first: pool.jsonl:1\): it would never apply"):
        check_reward_coverage(RewardConfig(terms={"omission": 1.0, "fluency": 1.0}), unlabelled)


def test_a_missing_label_over_http_is_an_unlabelled_sample():
    from asr_rl.rewards.server import sample_from_query

    assert sample_from_query("call anna", "", None).reference is None
    assert sample_from_query("call anna", "", "").reference == ""


def test_a_reward_spec_string_gives_the_config_the_coverage_check_reads(tmp_path):
    from asr_rl.rewards.pipeline import reward_spec_config

    assert reward_spec_config("builtin:cer,fluency=0.2").terms == {"cer": 1.0, "fluency": 0.2}
    assert reward_spec_config("http://127.0.0.1:5000").remote_url == "http://127.0.0.1:5000"
    plugin = tmp_path / "r.py"
    plugin.write_text("def reward_func(queries, prompts, labels):\n    return [0.0] * len(queries)\n")
    assert reward_spec_config(str(plugin)).file == str(plugin)
    with pytest.raises(ValueError, match="unknown reward term 'cerx'"):
        reward_spec_config("builtin:cerx")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        reward_spec_config(str(tmp_path / "missing.py"))
    with pytest.raises(ValueError, match="give builtin:asr"):
        reward_spec_config("cer")
