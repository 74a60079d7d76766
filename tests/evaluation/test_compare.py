"""`asr-rl eval --compare A B` on eval output folders written by hand (no model), and on a tiny model."""
from __future__ import annotations

import json

import numpy as np
import pytest

from asr_rl.cli import main
from tests.conftest import write_manifest


def _hyp(id_, ref, hyp, lang="en", keywords=(), speaker=None, error=None):
    return {"id": id_, "reference": ref, "hypothesis": hyp, "language": lang, "keywords": list(keywords),
            "predicted_language": None, "duration": 1.0, "error": error, "speaker": speaker}


def _eval_folder(path, sets):
    path.mkdir(parents=True)
    (path / "report.json").write_text(json.dumps({"model": path.name, "test_sets": {k: {} for k in sets}}))
    for name, rows in sets.items():
        (path / f"{name}.hyps.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


@pytest.fixture
def two_evals(tmp_path):
    """clean: the 2-utterance case of test_significance (A 2/4 + 0/6 chars, B 0/4 + 3/6: CER 20 % vs 30 %).
    noisy: A loops on u1 (8 inserted chars, 2 words) and misses a digit keyword on u2 (2 chars, 1 word);
    B is exact; u3 failed in B and is left out. The speaker field is missing there (older files)."""
    a = _eval_folder(tmp_path / "sft_eval", {
        "clean": [_hyp("c1", "anna", "an", speaker="s1"), _hyp("c2", "打开客厅的灯", "打开客厅的灯", "zh", speaker="s2")],
        "noisy": [_hyp("n1", "call ben", "call ben ben ben", keywords=["ben"]),
                  _hyp("n2", "dial five", "dial nine", keywords=["five"]), _hyp("n3", "stop", "stop")]})
    b = _eval_folder(tmp_path / "grpo_eval", {
        "clean": [_hyp("c1", "anna", "anna", speaker="s1"), _hyp("c2", "打开客厅的灯", "打开卧室的", "zh", speaker="s2")],
        "noisy": [_hyp("n1", "call ben", "call ben", keywords=["ben"]), _hyp("n2", "dial five", "dial five",
                                                                         keywords=["five"]),
                  _hyp("n3", "stop", "", error="audio missing")]})
    return a, b


def test_compare_two_eval_folders_by_hand(two_evals, tmp_path, capsys):
    a, b = two_evals
    out = tmp_path / "cmp"
    assert main(["eval", "--compare", str(a), str(b), "--output", str(out), "--seed", "4"]) == 0
    printed = capsys.readouterr().out
    sets = json.loads((out / "report.json").read_text())["compare"]["test_sets"]
    clean, noisy = sets["clean"], sets["noisy"]
    # clean: the enumerated distribution; same seed -> the share of (2, 0) draws exactly
    u = clean["utterance"]
    assert (u["cer_a"], u["cer_b"], u["delta"]) == pytest.approx((0.2, 0.3, 0.1))
    assert u["delta_ci"] == pytest.approx([-0.5, 0.5]) and u["resamples"] == 1000
    draws = np.random.default_rng(4).multinomial(2, [0.5, 0.5], size=1000)[:, 0]
    assert u["p_improvement"] == pytest.approx(np.mean(draws == 2))
    # one speaker per utterance: the speaker bootstrap is the utterance bootstrap
    assert clean["speakers"] == 2 and clean["speaker"] == u
    assert clean["a"]["breakdown"]["edits"] == {"char": {"substitutions": 0, "deletions": 0, "insertions": 0,
                                                         "reference": 6},
                                                "word": {"substitutions": 1, "deletions": 0, "insertions": 0,
                                                         "reference": 1}}
    # noisy: B exact on both scored utterances -> every resample has B < A, the interval is the
    # three outcomes' extremes: (n1, n1) A 16/16 -> -1; (n2, n2) A 4/18 -> -0.2222
    v = noisy["utterance"]
    assert noisy["utterances"] == 2 and noisy["left_out"] == 1 and noisy["speaker"] is None
    assert v["cer_a"] == pytest.approx(10 / 17) and v["p_improvement"] == 1.0
    assert v["delta_ci"] == pytest.approx([-1.0, -4 / 18])
    bd = noisy["a"]["breakdown"]
    assert bd["loops"] == 1 and bd["loop_ids"] == ["n1"] and noisy["b"]["breakdown"]["loops"] == 0
    assert bd["keywords"] == {"digits": {"keywords": 1, "missed": 1, "error_rate": 1.0},
                              "names": {"keywords": 1, "missed": 0, "error_rate": 0.0}}
    assert bd["edits"]["word"] == {"substitutions": 1, "deletions": 0, "insertions": 2, "reference": 4}
    # the table, printed and in Markdown
    assert "+10.00 [-50.00, +50.00]" in printed and "-58.82 [-100.00, -22.22]" in printed
    md = (out / "report.md").read_text()
    assert "| noisy | 2 (1 left out) | 58.82 | 0.00 | -58.82 [-100.00, -22.22] | -100.0 [-100.0, -100.0] | 1.000 | - |" in md
    assert "| noisy | A | word 1/0/2 of 4 | 0.00 (0/1) | 100.00 (1/1) | 1 |" in md
    # asr-rl report shows the intervals
    assert main(["report", "--runs", str(a), str(out), "--output", str(tmp_path / "rep")]) == 0
    rep = (tmp_path / "rep" / "report.md").read_text()
    assert "## Comparison `cmp`" in rep and "+10.00 [-50.00, +50.00]" in rep
    assert "-58.82 [-100.00, -22.22]" in (tmp_path / "rep" / "report.html").read_text()


def test_speakers_come_from_the_manifest_when_given(two_evals, tmp_path, capsys):
    """Both clean utterances by one speaker: a single block, so every speaker resample is the whole set
    and the speaker interval collapses to the point (+10 points, B never better)."""
    a, b = two_evals
    manifest = write_manifest(tmp_path / "clean.jsonl", [
        {"id": "c1", "audio": "c1.wav", "text": "anna", "language": "en", "speaker": "x"},
        {"id": "c2", "audio": "c2.wav", "text": "打开客厅的灯", "language": "zh", "speaker": "x"}])
    out = tmp_path / "cmp"
    assert main(["eval", "--compare", str(a), str(b), "--test-set", f"clean={manifest}", "--output", str(out),
                 "--resamples", "200"]) == 0
    sets = json.loads((out / "report.json").read_text())["compare"]["test_sets"]
    assert list(sets) == ["clean"] and sets["clean"]["speakers"] == 1
    spk = sets["clean"]["speaker"]
    assert spk["blocks"] == 1 and spk["delta_ci"] == pytest.approx([0.1, 0.1]) and spk["p_improvement"] == 0.0
    assert sets["clean"]["utterance"]["resamples"] == 200


def test_compare_refuses_mismatched_or_unknown_inputs(two_evals, tmp_path, capsys):
    a, b = two_evals
    other = _eval_folder(tmp_path / "other", {"clean": [_hyp("zz", "anna", "anna")]})
    assert main(["eval", "--compare", str(a), str(other), "--test-set", f"clean={tmp_path}/m.jsonl"]) == 2
    assert "A and B transcribed different utterances (2 only in A" in capsys.readouterr().err
    assert main(["eval", "--compare", str(a), str(tmp_path / "nothing")]) == 2
    assert "neither an eval output folder" in capsys.readouterr().err
    assert main(["eval", "--compare", str(a), str(b), "--test-set", f"dev={tmp_path}/dev.jsonl"]) == 2
    assert "holds no hypotheses for test set 'dev'" in capsys.readouterr().err
    assert main(["eval", "--compare", str(a), str(b), "--model", str(a)]) == 2
    assert "--model DIR, or --compare A B" in capsys.readouterr().err


@pytest.mark.slow
def test_compare_a_model_folder_with_its_own_eval_folder(tiny_model, tiny_corpus, tmp_path, capsys):
    """A is decoded here (and its eval output written under OUTPUT/A); B reuses an eval folder of the
    same model: greedy decoding is deterministic, so every resample ties -> 0 [0, 0], P(B<A) = 0."""
    manifest = tiny_corpus / "test_clean.jsonl"
    ev = tmp_path / "ev"
    assert main(["eval", "--model", str(tiny_model), "--test-set", f"clean={manifest}", "--output", str(ev),
                 "--max-new-tokens", "8", "--quiet"]) == 0
    out = tmp_path / "cmp"
    assert main(["eval", "--compare", str(tiny_model), str(ev), "--test-set", f"clean={manifest}",
                 "--output", str(out), "--max-new-tokens", "8", "--quiet", "--resamples", "100"]) == 0
    u = json.loads((out / "report.json").read_text())["compare"]["test_sets"]["clean"]["utterance"]
    assert u["delta"] == 0.0 and u["delta_ci"] == [0.0, 0.0] and u["p_improvement"] == 0.0
    assert json.loads((out / "A" / "report.json").read_text())["test_sets"]["clean"]["utterances"] == 2
    hyps = [json.loads(x) for x in (out / "A" / "clean.hyps.jsonl").read_text().splitlines()]
    assert all(h["speaker"] for h in hyps)  # the synthetic corpus names its voices


def test_with_context_lists_compare_bootstraps_b_wer_and_u_wer_and_counts_false_biasing(tmp_path, capsys):
    ctx = ["grace", "ben"]
    rows_a = [dict(_hyp("u1", "call grace now", "call ben now"), context=ctx),   # B 1/1, U 0/2, false 1
              dict(_hyp("u2", "ring grace", "ring grace"), context=ctx)]        # B 0/1, U 0/1
    rows_b = [dict(_hyp("u1", "call grace now", "call grace"), context=ctx),     # B 0/1, U 1/2 (now deleted)
              dict(_hyp("u2", "ring grace", "ring grace"), context=ctx)]
    a, b = _eval_folder(tmp_path / "a", {"s": rows_a}), _eval_folder(tmp_path / "b", {"s": rows_b})
    assert main(["eval", "--compare", str(a), str(b), "--output", str(tmp_path / "cmp")]) == 0
    bias = json.loads((tmp_path / "cmp" / "report.json").read_text())["compare"]["test_sets"]["s"]["biasing"]
    assert (bias["b_wer"]["cer_a"], bias["b_wer"]["cer_b"]) == pytest.approx((0.5, 0.0))
    assert (bias["u_wer"]["cer_a"], bias["u_wer"]["cer_b"]) == pytest.approx((0.0, 1 / 3))
    assert bias["false_biasing"] == {"a": 1, "b": 0}
    assert "B-WER A %" in capsys.readouterr().out and "B-WER A %" in (tmp_path / "cmp" / "report.md").read_text()
    # lists that differ between the sides are not a comparison of models
    rows_b[1]["context"] = ["grace"]
    c = _eval_folder(tmp_path / "c", {"s": rows_b})
    assert main(["eval", "--compare", str(a), str(c)]) == 2
    assert "different context lists" in capsys.readouterr().err


# ---------------------------------------------------------------------------------- bad input, round four
def test_compare_refuses_ids_that_pair_different_utterances(two_evals, tmp_path, capsys):
    a, _ = two_evals
    other = _eval_folder(tmp_path / "other", {"clean": [_hyp("c1", "bob", "bob", speaker="s1"),
                                                        _hyp("c2", "打开客厅的灯", "打开客厅的灯", "zh", speaker="s2")]})
    assert main(["eval", "--compare", str(a), str(other), "--test-set", f"clean={tmp_path}/m.jsonl"]) == 2
    err = capsys.readouterr().err
    assert "test set clean: utterance 'c1' is not the same in A and B" in err
    assert "'anna'" in err and "'bob'" in err and "intervals" not in err


def test_compare_refuses_to_write_over_one_of_its_sides(two_evals, capsys):
    a, b = two_evals
    before = (a / "report.json").read_text()
    assert main(["eval", "--compare", str(a), str(b), "--output", str(a)]) == 2
    assert "--output" in capsys.readouterr().err and (a / "report.json").read_text() == before
    assert main(["eval", "--compare", str(a), str(b), "--output", str(b / ".." / b.name)]) == 2
    assert "is B itself" in capsys.readouterr().err


def test_compare_checks_context_lists_on_both_sides(tmp_path, capsys):
    rows = [_hyp("u1", "call anna", "call anna"), _hyp("u2", "call ben", "call ben")]
    a = _eval_folder(tmp_path / "a", {"clean": rows})
    b = _eval_folder(tmp_path / "b", {"clean": [dict(r, context=["anna", "ben"]) for r in rows]})
    assert main(["eval", "--compare", str(a), str(b)]) == 2
    assert "different context lists" in capsys.readouterr().err


def test_pooled_compare_over_two_runs_resamples_an_utterance_with_both_runs(tmp_path):
    from asr_rl.evaluation.compare import pooled_compare
    from asr_rl.evaluation.significance import paired_bootstrap

    # the start (A) is one model for both seeds; B differs by seed. "clean": u1 ("anna", 4 chars) and
    # u2 ("打开客厅的灯", 6 chars). A: 2 + 0 errors. B seed 1: 0 + 3 (CER 30 %); B seed 2: 1 + 0 (10 %).
    start = _eval_folder(tmp_path / "start", {"clean": [_hyp("u1", "anna", "an"), _hyp("u2", "打开客厅的灯", "打开客厅的灯", "zh")]})
    b1 = _eval_folder(tmp_path / "b1", {"clean": [_hyp("u1", "anna", "anna"), _hyp("u2", "打开客厅的灯", "打开卧室的", "zh")],
                                        "nonspeech": [_hyp("x", "", "hm")]})
    b2 = _eval_folder(tmp_path / "b2", {"clean": [_hyp("u1", "anna", "ann"), _hyp("u2", "打开客厅的灯", "打开客厅的灯", "zh")]})
    out = pooled_compare([(start, b1), (start, b2)], n_resamples=200, seed=0)
    assert set(out) == {"clean"}  # only the sets all four hold
    pooled = out["clean"]["utterance"]
    # pooled over both runs: A 4 errors / 20 chars, B 4 / 20: no change
    assert pooled["cer_a"] == pytest.approx(0.2) and pooled["cer_b"] == pytest.approx(0.2) and pooled["relative"] == 0
    assert out["clean"]["runs"] == [pytest.approx(0.5), pytest.approx(-0.5)]  # 30 % and 10 % against 20 %
    # the utterance is the block: the same as a bootstrap over 2 blocks holding both runs' errors
    ref = paired_bootstrap([2, 0, 2, 0], [0, 3, 1, 0], [4, 6, 4, 6], 200, 0, blocks=[0, 1, 0, 1])
    assert pooled == ref.to_dict() and pooled["blocks"] == 2
