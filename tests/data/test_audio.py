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


def _write_float_wav(path, values, sr=16000):
    """A float wav holding what a broken pipeline can write: NaN or inf samples."""
    sf.write(str(path), np.asarray(values, dtype=np.float32), sr, subtype="FLOAT")
    return path


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_samples_are_refused_naming_the_file_count_and_time(tmp_path, bad):
    wav = np.full(1600, 0.1, dtype=np.float32)
    wav[800], wav[1200] = bad, bad
    path = _write_float_wav(tmp_path / "nan.wav", wav)
    with pytest.raises(AudioError) as err:
        load_audio(path)
    assert str(path) in str(err.value) and "2 non-finite samples" in str(err.value) and "0.050 s" in str(err.value)


def test_a_batch_names_the_manifest_line_of_non_finite_audio(tmp_path):
    from asr_rl.data.batching import load_batch, lazy_batch
    from asr_rl.data.manifest import read_manifest
    from tests.conftest import write_manifest

    write_tone(tmp_path / "ok.wav")
    _write_float_wav(tmp_path / "nan.wav", [0.1, float("nan")] * 800)
    utts = read_manifest(write_manifest(tmp_path / "m.jsonl", [
        {"id": "ok", "audio": "ok.wav", "text": "a", "language": "en"},
        {"id": "bad", "audio": "nan.wav", "text": "b", "language": "en"}]))
    with pytest.raises(AudioError, match=r"m\.jsonl:2: audio file .*nan\.wav has 800 non-finite"):
        load_batch(utts)
    with pytest.raises(AudioError, match=r"m\.jsonl:2: "):
        lazy_batch(utts).waveforms[1]


@pytest.mark.parametrize("subtype, channels, rate", [("PCM_16", 1, 16000), ("PCM_24", 2, 44100), ("FLOAT", 1, 8000),
                                                     ("PCM_U8", 1, 16000), ("ULAW", 1, 8000)])
def test_the_fast_wav_header_reads_what_soundfile_reads(tmp_path, subtype, channels, rate):
    import soundfile as sf

    from asr_rl.data.audio import audio_info, wav_header

    path = tmp_path / "x.wav"
    sf.write(path, np.zeros((rate // 3 + 1, channels), dtype=np.float32), rate, subtype=subtype)
    ref = sf.info(str(path))
    info = audio_info(path)
    assert (info.sample_rate, info.channels, info.frames) == (ref.samplerate, ref.channels, ref.frames)
    fast = wav_header(str(path))
    assert (fast is None) == (subtype == "ULAW")  # another codec: soundfile reads it
    # a data chunk claiming more than the file holds (a copy cut short): soundfile's word is taken
    data = path.read_bytes()
    (tmp_path / "cut.wav").write_bytes(data[: len(data) - 100])
    assert wav_header(str(tmp_path / "cut.wav")) is None
    assert audio_info(tmp_path / "cut.wav").frames == sf.info(str(tmp_path / "cut.wav")).frames
