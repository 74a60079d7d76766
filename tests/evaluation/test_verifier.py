"""`asr-rl eval --verifier FILE.py`: a reward file's pass rate per set, on hand-made results and through
`asr-rl eval` with the tiny model."""
from __future__ import annotations

import json

import pytest

from asr_rl.cli import main
from asr_rl.evaluation.metrics import UtteranceResult as R
from asr_rl.evaluation.metrics import score_set
from asr_rl.evaluation.verifier import load_verifier, verifier_from_args, verify
from tests.conftest import write_manifest

# 1 when the transcript starts with "call ", plus 0.5 when it holds one of the line's `entities`
# (a manifest field: it reaches the verifier as the trainer gives it, through Sample.metadata)
VERIFIER = """
def call_command(completions, entities=None, **kwargs):
    return [(1.0 if c.startswith("call ") else 0.0) + (0.5 if e and any(x in c for x in e) else 0.0)
            for c, e in zip(completions, entities or [None] * len(completions))]
"""


@pytest.fixture
def verifier_file(tmp_path):
    path = tmp_path / "call_command.py"
    path.write_text(VERIFIER)
    return path


def test_verifier_pass_rate_and_mean_reward_by_hand(verifier_file):
    rows = [R("1", "call anna", "call anna", "en", metadata={"entities": ["anna"]}),  # 1.5: pass
            R("2", "call bob", "call bob", "en"),  # 1.0: pass
            R("3", "dial five", "dial five", "en"),  # 0.0
            R("4", "anna", "anna", "en", metadata={"entities": ["anna"]}),  # 0.5
            R("5", "call anna", "", "en", error="audio missing")]  # failed: not verified
    checked = verify(rows, load_verifier(verifier_file))
    assert [r.verifier_reward for r in checked] == [1.5, 1.0, 0.0, 0.5, None]
    assert [r.verifier_pass for r in checked] == [True, True, False, False, None]
    m = score_set(checked)
    assert m.verifier_lines == 4 and m.verifier_pass_rate == 0.5 and m.verifier_mean_reward == pytest.approx(3 / 4)
    # a lower threshold passes the line worth 0.5 too
    assert score_set(verify(rows, load_verifier(verifier_file, 0.5))).verifier_pass_rate == pytest.approx(3 / 4)
    assert score_set(rows).verifier_pass_rate is None  # not verified: no rate


def test_a_threshold_without_a_verifier_is_refused(tmp_path, capsys):
    assert verifier_from_args(None, None) is None
    with pytest.raises(ValueError, match="--verifier-pass sets the threshold of a --verifier"):
        verifier_from_args(None, 0.5)
    assert main(["eval", "--model", str(tmp_path), "--test-set", f"s={tmp_path}/s.jsonl", "--verifier",
                 str(tmp_path / "missing.py")]) == 2
    assert "reward file" in capsys.readouterr().err


def test_eval_reports_failure_modes_and_the_verifier_per_set(tiny_model, tiny_corpus, tmp_path, capsys, verifier_file):
    rows = [json.loads(x) for x in (tiny_corpus / "test_clean.jsonl").read_text(encoding="utf-8").splitlines()]
    for r in rows:
        r["audio"] = str(tiny_corpus / r["audio"])
    rows[0]["entities"] = ["anna"]
    quiet = dict(rows[1], id="nobody", text="")  # a non-speech line: nobody speaks
    manifest = write_manifest(tmp_path / "set.jsonl", rows + [quiet])
    out = tmp_path / "ev"
    assert main(["eval", "--model", str(tiny_model), "--test-set", f"clean={manifest}", "--output", str(out),
                 "--max-new-tokens", "6", "--quiet", "--verifier", str(verifier_file), "--verifier-pass", "0.5"]) == 0
    printed = capsys.readouterr().out
    assert "failure modes" in printed and "verifier pass%" in printed
    saved = json.loads((out / "report.json").read_text())
    assert saved["verifier"] == {"file": str(verifier_file), "pass": 0.5}
    s = saved["test_sets"]["clean"]
    assert s["nonspeech_lines"] == 1 and s["verifier_lines"] == len(rows) + 1 and s["entity_lines"] == 1
    hyps = [json.loads(x) for x in (out / "clean.hyps.jsonl").read_text().splitlines()]
    assert hyps[0]["metadata"]["entities"] == ["anna"] and hyps[-1]["reference"] == ""
    # the saved rewards are the verifier's on the saved transcripts
    assert all(h["verifier_pass"] == (h["verifier_reward"] >= 0.5) for h in hyps)
    assert s["verifier_pass_rate"] == pytest.approx(sum(h["verifier_pass"] for h in hyps) / len(hyps))
