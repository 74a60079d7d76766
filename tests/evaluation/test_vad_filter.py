"""`asr-rl eval --vad-filter`: real synthesised speech and real non-speech clips through a tiny
Qwen2-Audio (the pretrained Whisper encoder): the lines where nobody speaks come back empty, the
speech lines exactly as greedy decoding writes them without the gate."""
from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf

from asr_rl.cli import main
from asr_rl.data.synth.nonspeech import render_clip


def _hyps(folder, name="t"):
    return {r["id"]: r["hypothesis"] for r in map(json.loads, (folder / f"{name}.hyps.jsonl").read_text().splitlines())}


@pytest.fixture(scope="module")
def mixed_set(tiny_corpus, tmp_path_factory):
    """The tiny corpus's clean test lines, and three clips where nobody speaks, labelled ""."""
    folder = tmp_path_factory.mktemp("vadset")
    rows = [json.loads(line) for line in (tiny_corpus / "test_clean.jsonl").read_text().splitlines()]
    rows = [{**r, "audio": str(tiny_corpus / r["audio"])} for r in rows]  # relative to their manifest
    for i in range(3):
        audio, extra = render_clip(i, np.random.default_rng(i), 16000)
        sf.write(folder / f"ns{i}.wav", audio, 16000)
        rows.append({"id": f"ns{i}", "audio": str(folder / f"ns{i}.wav"), "text": "", "language": "en"})
    path = folder / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, [r["id"] for r in rows if r["text"]]


def test_nobody_speaking_is_answered_empty_and_speech_is_decoded_as_without_the_gate(whisper_model, mixed_set,
                                                                                      tmp_path):
    path, speech_ids = mixed_set
    args = ["eval", "--model", str(whisper_model), "--test-set", f"t={path}", "--quiet", "--max-new-tokens", "12"]
    assert main([*args, "--output", str(tmp_path / "plain")]) == 0
    assert main([*args, "--vad-filter", "--output", str(tmp_path / "gated")]) == 0
    plain, gated = _hyps(tmp_path / "plain"), _hyps(tmp_path / "gated")
    assert {i: gated[i] for i in gated if i.startswith("ns")} == {"ns0": "", "ns1": "", "ns2": ""}
    assert {i: gated[i] for i in speech_ids} == {i: plain[i] for i in speech_ids}
    gated_set = json.loads((tmp_path / "gated" / "report.json").read_text())["test_sets"]["t"]
    assert gated_set["utterances"] == len(speech_ids) + 3 and gated_set["failed"] == 0
    assert gated_set["nonspeech_lines"] == 3 and gated_set["nonspeech_hallucination_rate"] == 0.0


def test_a_line_whose_audio_does_not_load_is_still_named_and_counted(whisper_model, mixed_set, tmp_path):
    path, _ = mixed_set
    broken = tmp_path / "broken.jsonl"
    broken.write_text(path.read_text() + json.dumps({"id": "gone", "audio": str(tmp_path / "gone.wav"),
                                                     "text": "", "language": "en"}) + "\n")
    assert main(["eval", "--model", str(whisper_model), "--test-set", f"t={broken}", "--quiet", "--vad-filter",
                 "--max-new-tokens", "12", "--output", str(tmp_path / "ev")]) == 0
    assert json.loads((tmp_path / "ev" / "report.json").read_text())["test_sets"]["t"]["failed"] == 1


def test_compare_refuses_the_gate(capsys):
    assert main(["eval", "--compare", "a", "b", "--vad-filter"]) == 2
    assert "--vad-filter decode a --model" in capsys.readouterr().err


def test_the_gates_minimum_speech_is_a_switch_and_asks_for_the_gate(whisper_model, mixed_set, tmp_path, capsys):
    # a minimum longer than any clip: nobody speaks anywhere, every line empty and none decoded
    path, speech_ids = mixed_set
    assert main(["eval", "--model", str(whisper_model), "--test-set", f"t={path}", "--quiet", "--vad-filter",
                 "--vad-min-speech", "60", "--max-new-tokens", "12", "--output", str(tmp_path / "ev")]) == 0
    assert set(_hyps(tmp_path / "ev").values()) == {""}
    assert main(["eval", "--model", str(whisper_model), "--test-set", f"t={path}", "--vad-min-speech", "0.1"]) == 2
    assert "--vad-min-speech sets the gate of --vad-filter" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_a_minimum_speech_that_is_not_a_finite_number_of_seconds_is_a_usage_error(value, capsys):
    """nan would empty every clip, inf too, and -1 turn the gate off: each refused before anything loads."""
    from asr_rl.evaluation.vad_filter import VadFilter

    with pytest.raises(SystemExit) as e:
        main(["eval", "--model", "m", "--test-set", "t=x.jsonl", "--vad-filter", "--vad-min-speech", value])
    assert e.value.code == 2
    assert f"argument --vad-min-speech: must be a finite number of seconds >= 0, got {value}" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--vad-min-speech is seconds of detected speech, a finite number >= 0"):
        VadFilter(min_speech=float(value))
