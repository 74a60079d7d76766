from __future__ import annotations

import jiwer
import pytest

from asr_rl.evaluation.metrics import UtteranceResult, score_set
from asr_rl.rewards.normalize import keyword_hits


def test_cer_and_wer_equal_jiwer_on_a_hand_made_case():
    refs = ["call anna at five", "turn on the lights"]
    hyps = ["call ana at five six", "turn of the light"]
    m = score_set([UtteranceResult(str(i), r, h, "en") for i, (r, h) in enumerate(zip(refs, hyps))])
    assert m.cer == pytest.approx(jiwer.cer(refs, hyps))
    assert m.wer == pytest.approx(jiwer.wer(refs, hyps))
    # by hand: "anna"->"ana" 1 deletion, " six" 4 insertions; "on"->"of" 1 sub, "lights"->"light" 1 deletion
    assert (m.substitutions, m.deletions, m.insertions) == (1, 2, 4)
    assert m.ref_chars == 17 + 18 and m.cer == pytest.approx(7 / 35)


def test_normalisation_before_scoring_and_cer_only_for_chinese():
    m = score_set([UtteranceResult("1", "打开客厅的灯。", "打开 客厅 的 等", "zh"),
                   UtteranceResult("2", "Call Anna!", "call anna", "en")])
    # zh: spaces between CJK removed, 1 substitution in 6 chars; en: case/punctuation ignored
    assert m.cer == pytest.approx(1 / (6 + 9))
    assert m.wer == 0.0 and m.ref_words == 2
    assert m.per_language["zh"]["cer"] == pytest.approx(1 / 6) and m.per_language["zh"]["wer"] is None


def test_keyword_recall_language_accuracy_and_failed_count():
    results = [
        UtteranceResult("1", "call anna now", "call anna now", "en", ("anna",), predicted_language="English"),
        UtteranceResult("2", "打开客厅的灯", "打开卧室的灯", "zh", ("客厅", "灯"), predicted_language="Chinese"),
        UtteranceResult("3", "call bob", "call bob", "en", ("bob",), predicted_language="Chinese"),
        UtteranceResult("4", "x", "", "en", error="audio file missing"),
    ]
    m = score_set(results, decode_seconds=1.0)
    assert m.utterances == 3 and m.failed == 1
    assert m.keywords == 4 and m.keyword_recall == pytest.approx(3 / 4)
    assert m.language_accuracy == pytest.approx(2 / 3)


def test_keyword_match_is_whole_word_for_latin_and_substring_for_cjk():
    assert keyword_hits("call annabel", ["anna"]) == 0
    assert keyword_hits("call Anna, now", ["anna"]) == 1
    assert keyword_hits("打开客厅的灯", ["客厅"]) == 1


def test_a_keyword_between_mandarin_characters_is_a_whole_word():
    # Mandarin writes digits and Latin words between characters without spaces
    assert keyword_hits("把空调调到26度", ["26", "空调", "度"]) == 3
    assert keyword_hits("打开wifi开关", ["wifi"]) == 1
    assert keyword_hits("set it to 126", ["26"]) == 0 and keyword_hits("26 degrees", ["26"]) == 1
    assert keyword_hits("call annabel", ["anna", "bel"]) == 0 and keyword_hits("7:30 am", ["7:30"]) == 1
