"""Text to 16 kHz mono float audio with the offline engines Debian ships (espeak-ng, flite).

Resampling happens here in Python with soxr rather than in a `| sox` pipe: one subprocess per
utterance instead of two, and no dither noise (sox dithers by default when it writes 16-bit), so
the same text and voice always give the same bytes.
"""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable

import numpy as np
import soundfile as sf
import soxr

from asr_rl.data.synth.voices import Voice

SAMPLE_RATE = 16000
APT_PACKAGES = {"espeak-ng": "espeak-ng", "flite": "flite"}
_TIMEOUT_S = 60


def required_tools(languages: Iterable[str]) -> tuple[str, ...]:
    """espeak-ng always; flite too when English is asked for (some English voices are flite's)."""
    return ("espeak-ng", "flite") if "en" in set(languages) else ("espeak-ng",)


def check_tools(languages: Iterable[str]) -> None:
    """Fail before any work if an engine is missing, with the command that installs it."""
    missing = [t for t in required_tools(languages) if shutil.which(t) is None]
    if missing:
        packages = " ".join(APT_PACKAGES[t] for t in missing)
        raise RuntimeError(
            f"{', '.join(missing)} not found on PATH; the demo corpus synthesiser needs it to speak "
            f"the sentences. Install it with: sudo apt-get install -y {packages}")


def synthesize(voice: Voice, speak: str) -> np.ndarray:
    """Render `speak` with `voice`; returns float32 samples in [-1, 1] at SAMPLE_RATE."""
    if voice.engine == "espeak":
        cmd = ["espeak-ng", "-v", voice.espeak_name, "-s", voice.speed, "-p", str(voice.pitch),
               "--stdout", speak]
        wav_bytes = _run(cmd, voice, speak)
    elif voice.engine == "flite":
        wav_bytes = _flite(voice, speak)
    else:
        raise ValueError(f"unknown TTS engine {voice.engine!r} in voice {voice.id}")
    # espeak-ng streams a WAV whose header claims an unknown length; soundfile reads it anyway.
    audio, rate = sf.read(io.BytesIO(wav_bytes), dtype="float32", always_2d=True)
    audio = audio.mean(axis=1)
    if audio.size == 0 or not np.any(audio):
        raise RuntimeError(f"{voice.id} produced silence for {speak!r}")
    if rate != SAMPLE_RATE:
        audio = soxr.resample(audio, rate, SAMPLE_RATE, quality="HQ").astype(np.float32)
    return audio


def _flite(voice: Voice, speak: str) -> bytes:
    # flite seeks in its output file, so it cannot write to a pipe.
    fd, path = tempfile.mkstemp(suffix=".wav", prefix="asr_rl_flite_")
    os.close(fd)
    try:
        _run(["flite", "-voice", voice.variant, "--setf", f"duration_stretch={voice.speed}",
              "-t", speak, "-o", path], voice, speak)
        with open(path, "rb") as f:
            return f.read()
    finally:
        os.unlink(path)


def _run(cmd: list[str], voice: Voice, speak: str) -> bytes:
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=_TIMEOUT_S, check=False)
    except FileNotFoundError as err:
        raise RuntimeError(f"{cmd[0]} not found on PATH; install it with: sudo apt-get install -y "
                           f"{APT_PACKAGES.get(cmd[0], cmd[0])}") from err
    if proc.returncode != 0:
        stderr = proc.stderr.decode(errors="replace").strip()
        raise RuntimeError(f"{cmd[0]} failed (exit {proc.returncode}) for voice {voice.id} and "
                           f"text {speak!r}: {stderr}")
    return proc.stdout
