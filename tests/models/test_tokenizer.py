"""The offline tokenizer's sources: every line of a `--tokenizer-from` file counts, or is refused."""
from __future__ import annotations

from asr_rl.cli import main
from tests.conftest import write_manifest


def test_model_init_refuses_a_tokenizer_from_manifest_with_malformed_lines_naming_file_and_line(tmp_path, capsys):
    manifest = write_manifest(tmp_path / "m.jsonl", [
        {"id": "a", "audio": "a.wav", "text": "call anna", "language": "en"},
        '{"id": "b", "audio": "b.wav", "text": "打开客厅',  # cut mid-line: its characters would be missing
        '["not", "an", "object"]',
        {"id": "c", "audio": "c.wav", "text": 5, "language": "en"},
    ])
    out = tmp_path / "model"
    assert main(["model", "init", "--arch", "qwen3_asr", "--tokenizer-from", str(manifest), "--out", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"asr-rl: error: --tokenizer-from file {manifest} has 3 bad line(s):"
    assert err[1].startswith(f"  {manifest}:2: malformed JSON (Unterminated string")
    assert err[2] == (f"  {manifest}:3: expected a JSON object with a text field (text, prompt, label, chosen, "
                      'rejected or messages), got ["not", "an", "object"]')
    assert err[3].startswith(f"  {manifest}:4: expected a JSON object with a text field")
    assert not out.exists()
