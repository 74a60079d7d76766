"""Audio I/O: read with soundfile, mix down to mono, resample with soxr to the model's rate.

torchaudio is deliberately not used: its PyPI build is linked against CUDA torch and fails to import
beside the CPU build.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr


class AudioError(ValueError):
    """An audio file that cannot be used; the message names the file and the problem."""


@dataclass(frozen=True)
class AudioInfo:
    """Header facts, read without decoding the samples."""

    sample_rate: int
    channels: int
    frames: int

    @property
    def duration(self) -> float:
        return self.frames / self.sample_rate if self.sample_rate else 0.0


def audio_info(path: str | os.PathLike) -> AudioInfo:
    """Read the header of `path`, raising AudioError when it is missing, unreadable or empty."""
    path = Path(path)
    if not path.exists():
        raise AudioError(f"audio file {path} does not exist")
    if not path.is_file():
        raise AudioError(f"audio path {path} is not a file")
    if path.stat().st_size == 0:
        raise AudioError(f"audio file {path} is empty (0 bytes)")
    try:
        info = sf.info(str(path))
    except (sf.LibsndfileError, RuntimeError) as e:
        raise AudioError(f"audio file {path} is unreadable: {e}") from None
    return AudioInfo(sample_rate=int(info.samplerate), channels=int(info.channels), frames=int(info.frames))


def load_audio(path: str | os.PathLike, sample_rate: int = 16000) -> np.ndarray:
    """Load `path` as float32 mono at `sample_rate`, shape `(num_samples,)`.

    Multi-channel audio is averaged to mono; other rates are resampled (soxr, high quality).
    Raises AudioError for a missing, unreadable or zero-length file, and for one holding NaN or
    infinite samples (a float wav can: it would train a NaN model without a word).
    """
    info = audio_info(path)
    if info.frames == 0:
        raise AudioError(f"audio file {path} has no samples (zero-length)")
    try:
        wav, sr = sf.read(str(path), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError) as e:
        raise AudioError(f"audio file {path} is unreadable: {e}") from None
    check_finite(wav, sr, path)
    return to_mono_resampled(wav, sr, sample_rate)


def check_finite(wav: np.ndarray, sr: int, path) -> None:
    """AudioError naming `path`, how many samples are NaN or infinite and where the first is."""
    bad = ~np.isfinite(wav)
    if bad.any():
        first = int(np.argmax(bad.any(axis=1) if bad.ndim == 2 else bad))
        raise AudioError(f"audio file {path} has {int(bad.sum())} non-finite samples (NaN or inf), the first "
                         f"at {first / sr:.3f} s: fix or drop the file")


def to_mono_resampled(wav: np.ndarray, sr: int, sample_rate: int) -> np.ndarray:
    """`wav` `(samples,)` or `(samples, channels)` at `sr` -> float32 mono `(samples',)` at `sample_rate`."""
    if wav.ndim == 2:
        wav = wav.mean(axis=1)
    wav = np.asarray(wav, dtype=np.float32)
    if sr != sample_rate:
        wav = soxr.resample(wav, sr, sample_rate, quality="HQ").astype(np.float32)
    return wav
