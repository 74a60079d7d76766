"""B-WER, U-WER and false biasing (Le et al. 2021), worked by hand."""
from __future__ import annotations

import pytest

from asr_rl.evaluation.biasing import bias_counts
from asr_rl.evaluation.metrics import UtteranceResult, score_set


def _counts(ref, hyp, context, lang="en"):
    return bias_counts(ref, hyp, context, lang).astuple()  # (B errors, B ref, U errors, U ref, false biasing)


def test_substitution_of_a_listed_word_insertions_and_false_biasing_by_hand():
    # listed in the reference: grace, living, room (3); call, at, the unlisted (3). grace -> ben is a
    # biased substitution, "now" an unbiased insertion; ben is listed and never said: false biasing 1
    assert _counts("call grace at the living room", "call ben at the living room now",
                   ["grace", "living room", "ben"]) == (1, 3, 1, 3, 1)
    # an inserted listed word counts as a biased error, though no listed word was said
    assert _counts("call mom", "call grace mom", ["grace"]) == (1, 0, 0, 2, 1)
    # all deleted: each reference unit an error on its side
    assert _counts("call grace", "", ["grace"]) == (1, 1, 1, 1, 0)
    # punctuation and case are normalised away as in CER/WER
    assert _counts("Call GRACE.", "call grace", ["Grace"]) == (0, 1, 0, 1, 0)


def test_languages_written_without_spaces_are_scored_in_characters():
    # 客厅 covers two reference characters; 卧室 replaces both
    assert _counts("打开客厅的灯", "打开卧室的灯", ["客厅"], "zh") == (2, 2, 0, 4, 0)


def test_a_set_s_rates_are_its_summed_counts_and_a_set_without_lists_has_none():
    rows = [UtteranceResult("a", "call grace at the living room", "call ben at the living room now", "en",
                            context=("grace", "living room", "ben")),
            UtteranceResult("b", "打开客厅的灯", "打开卧室的灯", "zh", context=("客厅",)),
            UtteranceResult("c", "call mom", "call mom", "en")]
    m = score_set(rows)
    # biased 1 + 2 errors of 3 + 2 units; unbiased 1 + 0 + 0 of 3 + 4 + 2
    assert m.b_wer == pytest.approx(3 / 5) and m.u_wer == pytest.approx(1 / 9)
    assert (m.biased_units, m.false_biasing) == (5, 1)
    plain = score_set([UtteranceResult("c", "call mom", "call bob", "en")])
    assert plain.b_wer is None and plain.u_wer is None and plain.biased_units == 0
