from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from asr_rl.data.audio import AudioError, load_audio
from tests.conftest import write_tone


def test_resamples_to_the_target_rate_keeping_duration_and_pitch(tmp_path):
    path = write_tone(tmp_path / "a.wav", seconds=1.0, sr=22050, freq=300.0)
    wav = load_audio(path, 16000)
    assert wav.dtype == np.float32 and wav.shape == (16000,)
    # the dominant frequency survives resampling
    spectrum = np.abs(np.fft.rfft(wav))
    assert abs(np.argmax(spectrum) * 16000 / len(wav) - 300.0) < 2.0


def test_stereo_is_mixed_down_to_the_channel_mean(tmp_path):
    path = tmp_path / "s.wav"
    left = np.full(1600, 0.2, dtype=np.float32)
    sf.write(str(path), np.stack([left, 3 * left], axis=1), 16000, subtype="FLOAT")
    wav = load_audio(path, 16000)
    assert wav.shape == (1600,) and np.allclose(wav, 0.4)


@pytest.mark.parametrize("make, message", [
    (lambda p: None, "does not exist"),
    (lambda p: p.write_bytes(b""), "is empty"),
    (lambda p: p.write_bytes(b"RIFF0000WAVEjunk" * 4), "unreadable"),
    (lambda p: write_tone(p, seconds=0.0), "zero-length"),
])
def test_bad_audio_names_the_file(tmp_path, make, message):
    path = tmp_path / "bad.wav"
    make(path)
    with pytest.raises(AudioError, match=message) as err:
        load_audio(path)
    assert str(path) in str(err.value)
