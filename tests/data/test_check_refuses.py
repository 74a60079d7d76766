"""`asr-rl data check` refuses what the command it checks for refuses (issue 47), and says what only
--deep finds."""
from __future__ import annotations

from asr_rl.cli import main
from tests.conftest import write_manifest, write_tone


def test_without_deep_the_check_says_what_only_decoding_finds(tmp_path, capsys):
    write_tone(tmp_path / "a.wav")
    m = write_manifest(tmp_path / "m.jsonl", [{"id": "a", "audio": "a.wav", "text": "hi", "language": "en"}])
    assert main(["data", "check", "--manifest", str(m)]) == 0
    assert "NaN or inf samples and files cut short show only with --deep" in capsys.readouterr().out
    assert main(["data", "check", "--manifest", str(m), "--deep"]) == 0
    assert "--deep" not in capsys.readouterr().out


def test_with_a_model_a_context_list_no_prompt_holds_is_a_bad_line_as_training_says(tiny_model, tmp_path, capsys):
    write_tone(tmp_path / "a.wav")
    huge = [f"name{i}" for i in range(10_000)]
    m = write_manifest(tmp_path / "m.jsonl", [{"id": "a", "audio": "a.wav", "text": "call anna", "language": "en"},
                                              {"id": "b", "audio": "a.wav", "text": "call anna", "language": "en",
                                               "context": huge}])
    assert main(["data", "check", "--manifest", str(m), "--model", str(tiny_model)]) == 1
    out = capsys.readouterr().out
    assert f"{m}:2 (context): the context list of 10000 items is" in out and "Shorten the list" in out
    # what eval says of the same line
    assert main(["eval", "--model", str(tiny_model), "--test-set", f"t={m}", "--quiet"]) == 2
    assert "the context list of 10000 items" in capsys.readouterr().err
