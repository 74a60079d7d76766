"""Preference manifests: `data check` checks what `train dpo`/`train kto` check, and says why."""
from __future__ import annotations

import pytest

from asr_rl.cli import main
from asr_rl.data.manifest import ManifestError
from asr_rl.data.pairs import read_pairs
from tests.conftest import write_manifest, write_tone


def _utt(i: int, **fields) -> dict:
    return {"id": f"u{i}", "audio": "a.wav", "text": "call anna", "language": "en", **fields}


@pytest.fixture
def pair_manifest(tmp_path):
    write_tone(tmp_path / "a.wav", 0.5)
    return write_manifest(tmp_path / "pairs.jsonl", [
        _utt(1, chosen="call anna", rejected="call hannah"),
        _utt(2, chosen=123, rejected="call hannah"),
        _utt(3, chosen="call anna", rejected=["call", "hannah"]),
        _utt(4, chosen="call anna"),
    ])


def test_train_dpo_says_a_non_string_response_must_be_a_string(pair_manifest):
    with pytest.raises(ManifestError) as e:
        read_pairs(pair_manifest, audio=True)
    lines = str(e.value).splitlines()
    assert lines[1] == f"  {pair_manifest}:2: `chosen` must be a string, got int 123"
    assert lines[2] == f'  {pair_manifest}:3: `rejected` must be a string, got list ["call", "hannah"]'
    assert lines[3] == f"  {pair_manifest}:4: missing or empty `rejected`"


def test_data_check_knows_a_pair_manifest_and_reports_what_train_dpo_refuses(pair_manifest, capsys):
    assert main(["data", "check", "--manifest", str(pair_manifest)]) == 1
    out = capsys.readouterr().out
    assert "checked as: DPO pairs (`chosen`, `rejected`), as `train dpo` reads them (from the keys of its first " \
           "line)" in out
    assert "bad lines:  3" in out
    assert f"  {pair_manifest}:2: `chosen` must be a string, got int 123" in out


def test_data_check_knows_a_kto_manifest(tmp_path, capsys):
    write_tone(tmp_path / "a.wav", 0.5)
    manifest = write_manifest(tmp_path / "kto.jsonl", [_utt(1, completion="call anna", label=True),
                                                      _utt(2, completion="call hannah", label="no")])
    assert main(["data", "check", "--manifest", str(manifest)]) == 1
    out = capsys.readouterr().out
    assert "checked as: KTO examples (`completion`, `label`), as `train kto` reads them" in out
    assert f"  {manifest}:2: `label` must be true (desirable) or false" in out and "bad lines:  1" in out
