"""Reading a model folder's config.json: a damaged or invalid one is one line naming the file (exit 2)."""
from __future__ import annotations

import json

from asr_rl.cli import main


def _folder(tmp_path, text: str):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(text, encoding="utf-8")
    return folder


def test_a_truncated_config_json_is_one_line_naming_the_file_in_eval_and_model_info(tmp_path, tone_manifest, capsys):
    from transformers import Qwen2AudioConfig

    full = Qwen2AudioConfig().to_json_string()
    folder = _folder(tmp_path, full[: len(full) // 2])  # cut mid-file, as an interrupted copy leaves it
    for argv in (["model", "info", str(folder)], ["eval", "--model", str(folder), "--test-set", f"t={tone_manifest}"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.splitlines()
        assert err[0].startswith(f"asr-rl: error: {folder / 'config.json'} is not valid JSON (")
        assert err[0].endswith("): it is truncated or damaged; copy it again from the checkpoint"), err
        assert len(err) == 2 and "Traceback" not in "".join(err)


def test_a_config_field_of_the_wrong_type_is_one_line_naming_the_file_and_field(tmp_path, capsys):
    folder = _folder(tmp_path, json.dumps({"model_type": "qwen2", "hidden_size": "big"}))
    assert main(["model", "info", str(folder)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (f"asr-rl: error: {folder / 'config.json'} is not a valid model config: Validation error for "
                      "field 'hidden_size': TypeError: Field 'hidden_size' expected int, got str (value: 'big')")
