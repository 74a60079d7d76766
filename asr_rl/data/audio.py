"""Audio I/O: read with soundfile, mix down to mono, resample with soxr to the model's rate. What is
read is a file, or an audio reference (audio_refs.py): a row's bytes in an Arrow/parquet table,
decoded from memory, or a segment of a long file, read as just those frames.

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

from asr_rl.data.audio_refs import SegmentRef, TableRef, bytes_file, parse_ref


# Segments may end this many seconds past the end of their file (times rounded by the tool that cut
# them); they are cut at the end, as Kaldi's extract-segments does with its --max-overshoot (0.5 s).
MAX_OVERSHOOT = 0.5


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
    """Read the header of `path` (a file, or an audio reference: audio_refs.py), raising AudioError
    when it is missing, unreadable or empty. A segment's frames are those of its span."""
    ref = parse_ref(str(path))
    info = _header(_source(path, ref), path, ref)
    sr, frames = int(info.samplerate), int(info.frames)
    if isinstance(ref, SegmentRef):
        start, stop = _span(ref, sr, frames)
        frames = stop - start
    return AudioInfo(sample_rate=sr, channels=int(info.channels), frames=frames)


def load_audio(path: str | os.PathLike, sample_rate: int = 16000) -> np.ndarray:
    """Load `path` (a file, or an audio reference: a row's bytes, a segment of a long file) as
    float32 mono at `sample_rate`, shape `(num_samples,)`.

    Multi-channel audio is averaged to mono; other rates are resampled (soxr, high quality).
    Raises AudioError for a missing, unreadable or zero-length file, and for one holding NaN or
    infinite samples (a float wav can: it would train a NaN model without a word).
    """
    ref = parse_ref(str(path))
    info = audio_info(path)
    if info.frames == 0:
        raise AudioError(f"audio {_name(path, ref)} has no samples (zero-length)")
    start, stop = 0, None
    if isinstance(ref, SegmentRef):  # read just the span (a segment of a long recording)
        start = round(ref.start * info.sample_rate)
        stop = start + info.frames
    try:
        wav, sr = sf.read(_source(path, ref), start=start, stop=stop, dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError) as e:
        raise AudioError(f"audio {_name(path, ref)} is unreadable: {e}") from None
    check_finite(wav, sr, path)
    return to_mono_resampled(wav, sr, sample_rate)


def _name(path, ref) -> str:
    return f"file {path}" if ref is None else str(ref)


def _source(path, ref):
    """What soundfile opens for `path`: the file's name (checked to exist and hold bytes), or a
    row's bytes in memory."""
    if isinstance(ref, TableRef):
        try:
            return bytes_file(ref)
        except FileNotFoundError:
            raise AudioError(f"audio {ref}: {ref.path} does not exist") from None
        except (KeyError, IndexError, ValueError, OSError) as e:  # pyarrow's errors derive from these
            raise AudioError(f"audio {ref} {e}") from None
    file = Path(path) if ref is None else ref.path
    if not file.exists():
        raise AudioError(f"audio file {file} does not exist")
    if not file.is_file():
        raise AudioError(f"audio path {file} is not a file")
    if file.stat().st_size == 0:
        raise AudioError(f"audio file {file} is empty (0 bytes)")
    return str(file)


_PCM_TAGS = {1, 3, 0xFFFE}  # WAVE_FORMAT_PCM, _IEEE_FLOAT, _EXTENSIBLE: frames = data bytes / block align


@dataclass(frozen=True)
class _WavHeader:
    samplerate: int
    channels: int
    frames: int


def wav_header(path: str) -> _WavHeader | None:
    """The header of a plain PCM/float RIFF WAV file, read with `struct` (~10 us; soundfile's
    `sf.info` takes ~50: a 300k-line manifest without durations opens every header); None for
    anything else or anything unusual (another codec, a data chunk that claims more bytes than the
    file holds, a header past the first 4 KiB), which `sf.info` then reads."""
    import struct

    with open(path, "rb") as f:
        head = f.read(4096)
        size = os.fstat(f.fileno()).st_size
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    pos, fmt = 12, None
    while pos + 8 <= len(head):
        chunk, n = head[pos:pos + 4], struct.unpack_from("<I", head, pos + 4)[0]
        if chunk == b"fmt " and pos + 24 <= len(head):
            tag, channels, rate, _, align = struct.unpack_from("<HHIIH", head, pos + 8)
            fmt = (tag, channels, rate, align)
        elif chunk == b"data":
            if fmt is None or fmt[0] not in _PCM_TAGS or not fmt[3] or not fmt[1] or pos + 8 + n > size:
                return None
            return _WavHeader(fmt[2], fmt[1], n // fmt[3])
        pos += 8 + n + (n & 1)
    return None


def _header(source, path, ref):
    if isinstance(source, str) and source[-4:].lower() == ".wav":
        try:
            info = wav_header(source)
        except OSError:
            info = None
        if info is not None:
            return info
    try:
        return sf.info(source)
    except (sf.LibsndfileError, RuntimeError) as e:
        raise AudioError(f"audio {_name(path, ref)} is unreadable: {e}") from None


def _span(ref: SegmentRef, sr: int, frames: int) -> tuple[int, int]:
    """(start, stop) frames of `ref` in a file of `frames` at `sr`; a span that ends more than
    `MAX_OVERSHOOT` past the file's end (a segments file for another recording, or a cut file) or an
    empty one is an AudioError, a smaller overshoot is cut at the end."""
    start = round(ref.start * sr)
    stop = frames if ref.end is None else round(ref.end * sr)
    if start >= frames or stop > frames + MAX_OVERSHOOT * sr:
        raise AudioError(f"audio {ref}: the segment ends past the end of the file ({frames / sr:.3f} s)")
    if stop <= start:
        raise AudioError(f"audio {ref}: the segment is empty (its end is not after its start)")
    return start, min(stop, frames)


def check_finite(wav: np.ndarray, sr: int, path) -> None:
    """AudioError naming `path` (or the reference), how many samples are NaN or infinite and where
    the first is."""
    bad = ~np.isfinite(wav)
    if bad.any():
        first = int(np.argmax(bad.any(axis=1) if bad.ndim == 2 else bad))
        raise AudioError(f"audio {_name(path, parse_ref(str(path)))} has {int(bad.sum())} non-finite samples (NaN "
                         f"or inf), the first at {first / sr:.3f} s: fix or drop the file")


def to_mono_resampled(wav: np.ndarray, sr: int, sample_rate: int) -> np.ndarray:
    """`wav` `(samples,)` or `(samples, channels)` at `sr` -> float32 mono `(samples',)` at `sample_rate`."""
    if wav.ndim == 2:
        wav = wav.mean(axis=1)
    wav = np.asarray(wav, dtype=np.float32)
    if sr != sample_rate:
        wav = soxr.resample(wav, sr, sample_rate, quality="HQ").astype(np.float32)
    return wav
