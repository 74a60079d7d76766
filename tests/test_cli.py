from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from asr_rl.cli import main
from tests.conftest import write_manifest, write_tone


def test_data_check_reports_count_hours_languages(tone_manifest, capsys):
    assert main(["data", "check", "--manifest", str(tone_manifest)]) == 0
    out = capsys.readouterr().out
    assert "utterances: 2" in out and "languages:  en 1, zh 1" in out and "bad lines:  0" in out
    assert "hours:      0.000" in out  # 1.5 s


def test_data_check_lists_every_bad_line_and_fails(tmp_path, capsys):
    write_tone(tmp_path / "ok.wav")
    m = write_manifest(tmp_path / "m.jsonl", [
        {"id": "1", "audio": "ok.wav", "text": "good", "language": "en"},
        "{oops",
        {"id": "3", "audio": "missing.wav", "text": "x", "language": "en"},
        {"id": "4", "audio": "ok.wav", "language": "en"},
        {"id": "5", "audio": "ok.wav", "text": "x", "language": "klingon"},
    ])
    assert main(["data", "check", "--manifest", str(m)]) == 1
    out = capsys.readouterr().out
    assert "utterances: 1" in out and "bad lines:  4" in out
    for line, text in [(2, "malformed JSON"), (3, "missing.wav does not exist"), (4, "missing `text`"),
                       (5, "unknown language 'klingon'")]:
        (hit,) = [row for row in out.splitlines() if row.strip().startswith(f"{m}:{line}: ")]
        assert text in hit


def test_data_check_unlabelled_accepts_lines_without_text_and_counts_them(tmp_path, capsys):
    write_tone(tmp_path / "ok.wav")
    m = write_manifest(tmp_path / "m.jsonl", [{"id": "1", "audio": "ok.wav", "text": "good", "language": "en"},
                                              {"id": "2", "audio": "ok.wav", "language": "en"}])
    assert main(["data", "check", "--manifest", str(m)]) == 1
    assert "--unlabelled` accepts lines without one" in capsys.readouterr().out
    assert main(["data", "check", "--manifest", str(m), "--unlabelled"]) == 0
    out = capsys.readouterr().out
    assert "utterances: 2" in out and "unlabelled: 1" in out and "bad lines:  0" in out


def test_missing_manifest_is_a_clear_error_not_a_traceback(tmp_path, capsys):
    assert main(["data", "check", "--manifest", str(tmp_path / "none.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "none.jsonl does not exist" in err and "Traceback" not in err


def test_console_script_is_installed_and_runs():
    exe = Path(sys.executable).parent / "asr-rl"
    res = subprocess.run([str(exe), "--help"], capture_output=True, text=True, env={**os.environ})
    assert res.returncode == 0 and "data" in res.stdout


def test_data_synth_then_check_through_the_cli(tmp_path, capsys):
    out = tmp_path / "corpus"
    assert main(["data", "synth", "--out", str(out), "--train", "4", "--test", "2", "--seed", "3", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "train" in printed and "test_noisy" in printed
    assert main(["data", "check", "--manifest", str(out / "train.jsonl")]) == 0
    report = capsys.readouterr().out
    assert "utterances: 4" in report and "en 2, zh 2" in report and "bad lines:  0" in report
    # the same folder with other parameters is refused, naming the folder
    assert main(["data", "synth", "--out", str(out), "--train", "5", "--test", "2", "--quiet"]) == 2
    assert str(out) in capsys.readouterr().err


@pytest.mark.parametrize("command, args, message", [
    ("grpo", ["temperature=-1"], "`temperature` (rollout.temperature) must be > 0"),
    ("grpo", ["rollout.top_p=1.5"], "`rollout.top_p` must be > 0 and <= 1, got 1.5"),
    ("sft", ["optim.learning_rate=-0.001"], "`optim.learning_rate` must be > 0, got -0.001"),
    ("sft", ["model.dtype=float16"], "`model.dtype` expects one of 'float32', 'bfloat16'"),
    ("grpo", ["max_new_tokens=0"], "`max_new_tokens` (rollout.max_new_tokens) must be >= 1, got 0"),
    ("sft", ["pretrain=no/such/model"], "`pretrain=no/such/model`: no/such/model is not a model folder"),
])
def test_a_bad_setting_exits_2_with_one_line_and_no_traceback(tmp_path, capsys, command, args, message):
    out = tmp_path / "run"
    assert main(["train", command, f"output_dir={out}", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not out.exists()  # refused before the run folder was touched


@pytest.mark.parametrize("args, message", [
    (["reward.terms={cre: 1.0}"], "reward.terms: unknown reward term 'cre'; valid: acoustic, biasing, cer, "),
    (["reward.remote_url=127.0.0.1:18761"], "reward.remote_url: reward server URL '127.0.0.1:18761' has no http:// "
                                            "or https:// scheme: add http://"),
])
def test_a_bad_reward_term_or_url_stops_the_run_before_the_model_loads(tmp_path, capsys, args, message):
    # the model folder does not exist either: the reward's error must come first, at config load
    out = tmp_path / "run"
    assert main(["train", "grpo", f"output_dir={out}", f"pretrain={tmp_path / 'no_model'}", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "no_model" not in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("flag, value, message", [
    ("--n", "1", "argument --n: must be at least 2 (a pair compares two hypotheses of one utterance), got 1"),
    ("--batch-size", "0", "argument --batch-size: must be at least 1 (utterances per batch), got 0"),
])
def test_data_pairs_refuses_a_count_that_can_never_make_a_pair_before_it_runs(tmp_path, capsys, flag, value, message):
    out = tmp_path / "pairs.jsonl"
    with pytest.raises(SystemExit) as e:  # at argument time: no model is loaded, no file written
        main(["data", "pairs", "--model", str(tmp_path / "m"), "--manifest", str(tmp_path / "x.jsonl"),
              "--out", str(out), flag, value])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"asr-rl data pairs: error: {message}"
    assert not out.exists()


# ---------------------------------------------------------------------------------- bad input, round four
def test_data_check_deep_decodes_every_file_and_names_non_finite_audio(tmp_path, capsys):
    import numpy as np
    import soundfile as sf

    write_tone(tmp_path / "ok.wav")
    sf.write(str(tmp_path / "nan.wav"), np.array([0.1, np.nan] * 800, dtype=np.float32), 16000, subtype="FLOAT")
    m = write_manifest(tmp_path / "m.jsonl", [{"id": "1", "audio": "ok.wav", "text": "good", "language": "en"},
                                              {"id": "2", "audio": "nan.wav", "text": "bad", "language": "en"}])
    assert main(["data", "check", "--manifest", str(m)]) == 0  # the header is fine
    capsys.readouterr()
    assert main(["data", "check", "--manifest", str(m), "--deep"]) == 1
    out = capsys.readouterr().out
    assert "bad lines:  1" in out and f"{m}:2: audio file" in out and "800 non-finite samples" in out


def test_data_check_reads_a_text_preference_file_as_train_rm_does(tmp_path, capsys):
    good = {"prompt": "2+2?", "chosen": "4", "rejected": "5"}
    m = write_manifest(tmp_path / "prefs.jsonl", [good, good, {"prompt": "x", "chosen": "y"}, "{oops"])
    assert main(["data", "check", "--manifest", str(m)]) == 1
    out = capsys.readouterr().out
    assert "text preference pairs" in out and "pairs:      2" in out and "bad lines:  2" in out
    assert f"{m}:3: missing or non-string `rejected`" in out and f"{m}:4: malformed JSON" in out
    assert "audio" not in out
    m.write_text("".join(__import__("json").dumps(good) + "\n" for _ in range(3)))
    assert main(["data", "check", "--manifest", str(m)]) == 0


@pytest.mark.parametrize("beams", ["0", "-2"])
def test_eval_refuses_a_beam_width_below_one_before_loading_anything(tmp_path, capsys, beams):
    assert main(["eval", "--model", str(tmp_path / "absent"), "--test-set", f"x={tmp_path}/x.jsonl",
                 "--num-beams", beams]) == 2
    assert "--num-beams must be at least 1 (1 = greedy decoding)" in capsys.readouterr().err
