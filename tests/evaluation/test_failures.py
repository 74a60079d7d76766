"""Failure modes per set (insertions, loops, non-speech hallucination, keyword/entity errors) and their
paired bootstrap in `eval --compare`, on results written by hand (no model)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from asr_rl.cli import main
from asr_rl.evaluation.compare import compare_set
from asr_rl.evaluation.evaluate import format_table
from asr_rl.evaluation.failures import compare_failures, failure_metrics
from asr_rl.evaluation.metrics import UtteranceResult as R
from asr_rl.evaluation.metrics import score_set
from tests.evaluation.test_compare import _eval_folder, _hyp


def test_insertion_deletion_and_substitution_rates_in_each_lines_unit():
    m = score_set([R("1", "call anna now", "call anna now please", "en"),  # 1 inserted word of 3
                   R("2", "turn on the lights", "turn the light", "en"),  # "on" deleted, lights->light: of 4
                   R("3", "打开客厅的灯", "打开客厅的灯吧", "zh"),  # 1 inserted character of 6
                   R("4", "stop", "", "en", error="audio missing")])  # failed: not scored
    assert m.ref_units == 3 + 4 + 6
    assert (m.insertion_rate, m.deletion_rate, m.substitution_rate) == pytest.approx((2 / 13, 1 / 13, 1 / 13))


def test_loops_are_repeats_beyond_the_references_or_runaway_length():
    m = score_set([R("1", "call me back", "call me me me back", "en"),  # "me" 3 times in a row: a loop
                   R("2", "five five five", "five five five", "en"),  # the reference says it 3 times: none
                   R("3", "stop", "stop the music now please play", "en"),  # 6 words for 1: runaway
                   R("4", "打开灯", "打开打开打开灯", "zh"),  # 打开 3 times
                   R("5", "call anna", "call anna", "en")])
    assert m.loops == 3 and m.loop_rate == pytest.approx(3 / 5)


def test_a_set_mixing_speech_and_non_speech_lines():
    rows = [R("1", "call anna", "call anna", "en", ("anna",), context=("anna",)),
            R("2", "", "", "en", context=("anna",)),  # nobody speaks, nothing written
            R("3", "", "thank you", "en", ("anna",)),  # 9 characters, 2 words written where nobody speaks
            R("4", "", "。", "en")]  # punctuation only: no word
    m = score_set(rows, decode_seconds=1.0)
    assert m.nonspeech_lines == 3 and m.nonspeech_hallucination_rate == pytest.approx(1 / 3)
    assert m.nonspeech_mean_chars == pytest.approx(9 / 3)
    # what was written on non-speech lines is inserted, over the speech line's units
    assert m.cer == pytest.approx(9 / 9) and m.wer == pytest.approx(2 / 2) and m.insertion_rate == pytest.approx(1.0)
    assert m.keyword_recall == pytest.approx(1 / 2) and m.keyword_error_rate == pytest.approx(1 / 2)
    # B-WER: anna said and written; U-WER: "thank you" is 2 inserted unlisted words over "call"
    assert m.b_wer == 0.0 and m.u_wer == pytest.approx(2 / 1) and m.loop_rate == 0.0
    assert "failure modes" in format_table({"mixed": m})


def test_a_set_of_only_non_speech_lines_has_no_cer_and_says_so():
    m = score_set([R("1", "", "", "en"), R("2", "", "uh huh", "en"), R("3", "", "", "zh")], decode_seconds=1.0)
    assert (m.cer, m.wer, m.insertion_rate, m.ref_units) == (None, None, None, 0)
    assert m.per_language["en"] == {"utterances": 2, "cer": None, "wer": None}
    assert m.nonspeech_hallucination_rate == pytest.approx(1 / 3) and m.nonspeech_mean_chars == pytest.approx(6 / 3)
    table = format_table({"silence": m})
    assert "silence" in table and "33.33" in table
    # --compare: no CER bootstrap, the non-speech rate gets one (B silent where A spoke: every resample better)
    b = [R("1", "", "", "en"), R("2", "", "", "en"), R("3", "", "", "zh")]
    out = compare_set([R("1", "", "", "en"), R("2", "", "uh huh", "en"), R("3", "", "", "zh")], b, [None] * 3, 200, 0)
    assert out["utterance"] is None and out["speaker"] is None and "insertion_rate" not in out["failures"]
    f = out["failures"]["nonspeech_hallucination_rate"]
    assert (f["a"], f["b"]) == pytest.approx((1 / 3, 0.0))


def test_keyword_error_and_entity_insertions():
    rows = [R("1", "call anna now", "call ana now", "en", ("anna",)),  # anna missed
            R("2", "dial five five one", "dial five five one", "en", ("five five one", "dial")),
            R("3", "打开客厅的灯", "打开卧室的灯", "zh", ("客厅",)),  # 客厅 missed
            R("4", "stop", "", "en"),
            # entities: anna is said (no candidate); bob is written though not said, kitchen is not written
            R("5", "call anna now", "call bob now anna", "en", metadata={"entities": ["anna", "bob", "kitchen"]}),
            R("6", "", "", "en", metadata={"entities": ["bob"]})]
    f = failure_metrics(rows)
    assert f["keyword_error_rate"] == pytest.approx(2 / 4)
    assert (f["entity_lines"], f["entity_insertions"]) == (2, 1) and f["entity_insertion_rate"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="utterance 7: `entities` must be a list of strings"):
        failure_metrics([R("7", "call anna", "call anna", "en", metadata={"entities": "anna"})])


def _draws(n: int, seed: int = 0, resamples: int = 1000) -> np.ndarray:
    """The bootstrap's draws over `n` utterances: how often each is drawn, per resample."""
    return np.random.default_rng(seed).multinomial(n, np.full(n, 1.0 / n), size=resamples)


# c1: A loops ("ben" 3 times, 2 words inserted); c2: A misses the keyword and does not start with
# "call "; c3: nobody speaks and A writes "thank you"; B is exact on all three
ROWS_A = [_hyp("c1", "call ben", "call ben ben ben", keywords=["ben"]),
          _hyp("c2", "call anna", "cal ana", keywords=["anna"]), _hyp("c3", "", "thank you")]
ROWS_B = [_hyp("c1", "call ben", "call ben", keywords=["ben"]),
          _hyp("c2", "call anna", "call anna", keywords=["anna"]), _hyp("c3", "", "")]


def test_compare_failures_by_hand():
    a, b = ([R(**{**r, "keywords": tuple(r["keywords"])}) for r in rows] for rows in (ROWS_A, ROWS_B))
    out = compare_failures(a, b, 1000, 0)
    n1, n2, n3 = _draws(3).T
    assert "entity_insertion_rate" not in out and "verifier_pass_rate" not in out  # neither side has them
    # non-speech: one line, A 1 of 1, B 0: every resample that draws it is better, the others have no rate
    ns = out["nonspeech_hallucination_rate"]
    assert (ns["a"], ns["b"], ns["delta"], ns["delta_ci"]) == (1.0, 0.0, -1.0, [-1.0, -1.0])
    assert ns["p_improvement"] == 1.0 and ns["resamples"] == int((n3 > 0).sum())
    # loops: A 1 of 3 lines; B is better exactly where c1 is drawn
    lp = out["loop_rate"]
    assert (lp["a"], lp["b"]) == pytest.approx((1 / 3, 0.0)) and lp["p_improvement"] == pytest.approx(np.mean(n1 > 0))
    # insertions: A 2 (c1) + 2 (c3) words over 2 + 2 reference words; a resample of c3 alone has no
    # reference word; a resample of c2 alone has no insertion on either side (a tie)
    ins, ok = out["insertion_rate"], (n1 + n2) > 0
    assert (ins["a"], ins["b"]) == (1.0, 0.0) and ins["resamples"] == int(ok.sum())
    assert ins["p_improvement"] == pytest.approx(np.mean((n1 + n3)[ok] > 0))
    # keywords: A misses 1 of 2 (c2)
    kw = out["keyword_error_rate"]
    assert (kw["a"], kw["b"]) == (0.5, 0.0) and kw["p_improvement"] == pytest.approx(np.mean(n2[ok] > 0))


def test_compare_cli_with_a_verifier_reports_pass_rate_intervals(tmp_path, capsys):
    verifier = tmp_path / "starts_with_call.py"
    verifier.write_text("def starts_with_call(completions, **kwargs):\n"
                        "    return [1.0 if c.startswith('call ') else 0.0 for c in completions]\n")
    a, b = _eval_folder(tmp_path / "a", {"s": ROWS_A}), _eval_folder(tmp_path / "b", {"s": ROWS_B})
    out = tmp_path / "cmp"
    assert main(["eval", "--compare", str(a), str(b), "--output", str(out), "--verifier", str(verifier)]) == 0
    saved = json.loads((out / "report.json").read_text())["compare"]
    assert saved["verifier"] == {"file": str(verifier), "pass": 1.0}
    v = saved["test_sets"]["s"]["failures"]["verifier_pass_rate"]
    # pass: A c1 only, B c1 and c2 (c3 is empty): B is better exactly where c2 is drawn
    n2 = _draws(3)[:, 1]
    assert (v["a"], v["b"], v["delta"]) == pytest.approx((1 / 3, 2 / 3, 1 / 3)) and v["higher_is_better"]
    assert v["p_improvement"] == pytest.approx(np.mean(n2 > 0))
    assert v["delta_ci"] == pytest.approx(list(np.percentile(n2 / 3, [2.5, 97.5])))
    printed = capsys.readouterr().out
    assert "P(B better)" in printed and "verifier pass" in printed
    md = (out / "report.md").read_text()
    row = "| s | non-speech lines with words | 100.00 | 0.00 | -100.00 [-100.00, -100.00] | 1.000 |"
    assert row in md
    assert main(["report", "--runs", str(out), "--output", str(tmp_path / "rep")]) == 0
    assert row in (tmp_path / "rep" / "report.md").read_text()
    # without --verifier the folders hold no pass flags: no verifier row
    assert main(["eval", "--compare", str(a), str(b), "--output", str(tmp_path / "cmp2")]) == 0
    again = json.loads((tmp_path / "cmp2" / "report.json").read_text())["compare"]["test_sets"]["s"]
    assert "verifier_pass_rate" not in again["failures"]
