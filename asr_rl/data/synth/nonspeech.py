"""Clips where nobody speaks: silence, room tone, noises, music-like tones, clicks and hum.

A model that writes words on these clips hallucinates; `asr-rl eval` counts how often (lines with
`"text": ""`). Every clip is drawn from its own stream (seed, split, index) at an absolute level
(dB re full scale), so a quiet kind stays quiet: nothing is normalised to a common peak.
"""
from __future__ import annotations

import numpy as np
from scipy import signal

from asr_rl.data.synth import augment

KINDS = ("silence", "room_tone", "white_noise", "pink_noise", "brown_noise", "chord", "arpeggio", "tones",
         "clicks", "hum")
DURATION_RANGE_S = (1.0, 5.0)
ROOM_TONE_DBFS = (-72.0, -60.0)  # RMS; a quiet room through a microphone
NOISE_DBFS = (-40.0, -15.0)  # RMS
HUM_DBFS = (-40.0, -20.0)  # RMS
TONE_PEAK = (0.1, 0.6)


def at_rms(audio: np.ndarray, dbfs: float) -> np.ndarray:
    """Scale so that the RMS is `dbfs` dB re full scale (1.0)."""
    rms = np.sqrt(np.mean(audio ** 2))
    return audio if rms == 0 else audio * (10.0 ** (dbfs / 20.0) / rms)


def brown_noise(n: int, rng: np.random.Generator) -> np.ndarray:
    """1/f^2 power: white noise through a leaky integrator (the leak keeps it from drifting)."""
    return signal.lfilter([1.0], [1.0, -0.995], rng.standard_normal(n))


def _note(freq: float, n: int, sample_rate: int, decay_s: float) -> np.ndarray:
    """A plucked note: three harmonics at 1, 1/2, 1/4, a 10 ms attack and an exponential decay."""
    t = np.arange(n) / sample_rate
    tone = sum(np.sin(2 * np.pi * freq * k * t) / 2 ** (k - 1) for k in (1, 2, 3))
    return tone * np.minimum(t / 0.01, 1.0) * np.exp(-t / decay_s)


def _chord_freqs(rng: np.random.Generator) -> list[float]:
    """A major or minor triad (plus the octave half the time) on a MIDI root of 48-71."""
    root = int(rng.integers(48, 72))
    steps = [0, 4 if rng.random() < 0.5 else 3, 7] + ([12] if rng.random() < 0.5 else [])
    return [440.0 * 2 ** ((root + s - 69) / 12) for s in steps]


def chords(n: int, rng: np.random.Generator, sample_rate: int) -> np.ndarray:
    """One to three chords in a row, every note struck together."""
    out, starts = np.zeros(n), np.linspace(0, n, int(rng.integers(1, 4)) + 1).astype(int)
    for start, end in zip(starts[:-1], starts[1:]):
        out[start:end] = sum(_note(f, end - start, sample_rate, 0.8) for f in _chord_freqs(rng))
    return out


def arpeggio(n: int, rng: np.random.Generator, sample_rate: int) -> np.ndarray:
    """A chord's notes one after another, up and around, at 3-8 notes a second."""
    freqs, hop = _chord_freqs(rng), int(sample_rate / rng.uniform(3.0, 8.0))
    out = np.zeros(n)
    for i, start in enumerate(range(0, n, hop)):
        out[start:] += _note(freqs[i % len(freqs)], n - start, sample_rate, 0.25)
    return out


def tones(n: int, rng: np.random.Generator, sample_rate: int) -> np.ndarray:
    """Beeps: pure tones of 0.1-0.5 s at 300-3000 Hz with gaps between them, raised-cosine edges."""
    out, start = np.zeros(n), 0
    while start < n:
        length = min(int(rng.uniform(0.1, 0.5) * sample_rate), n - start)
        t = np.arange(length) / sample_rate
        out[start:start + length] = np.sin(2 * np.pi * rng.uniform(300.0, 3000.0) * t) * np.hanning(length)
        start += length + int(rng.uniform(0.05, 0.3) * sample_rate)
    return out


def clicks(n: int, rng: np.random.Generator, sample_rate: int) -> np.ndarray:
    """Clicks at random times (2-10 a second), each a 5 ms decaying noise burst of its own level."""
    out, burst = np.zeros(n), int(0.005 * sample_rate)
    decay = np.exp(-np.arange(burst) / (burst / 4))
    for at in rng.integers(0, n, size=max(1, int(rng.uniform(2.0, 10.0) * n / sample_rate))):
        length = min(burst, n - at)
        out[at:at + length] += rng.uniform(0.3, 1.0) * rng.standard_normal(length) * decay[:length]
    return out


def hum(n: int, rng: np.random.Generator, sample_rate: int) -> np.ndarray:
    """Mains hum: 50 or 60 Hz and its harmonics up to the 10th at 1/k, random phases."""
    base, t = (50.0, 60.0)[int(rng.integers(2))], np.arange(n) / sample_rate
    return sum(np.sin(2 * np.pi * base * k * t + rng.uniform(0, 2 * np.pi)) / k for k in range(1, 11))


def make_clip(kind: str, n: int, rng: np.random.Generator, sample_rate: int) -> np.ndarray:
    """`n` samples of `kind` at its own absolute level (see the *_DBFS and TONE_PEAK ranges)."""
    if kind == KINDS[0]:  # digital silence
        return np.zeros(n)
    if kind == "room_tone":
        return at_rms(augment.pink_noise(n, rng) + brown_noise(n, rng) / 20.0, rng.uniform(*ROOM_TONE_DBFS))
    noises = {"white_noise": augment.white_noise, "pink_noise": augment.pink_noise, "brown_noise": brown_noise}
    if kind in noises:
        return at_rms(noises[kind](n, rng), rng.uniform(*NOISE_DBFS))
    if kind == "hum":
        return at_rms(hum(n, rng, sample_rate), rng.uniform(*HUM_DBFS))
    makers = {"chord": chords, "arpeggio": arpeggio, "tones": tones, "clicks": clicks}
    if kind not in makers:
        raise ValueError(f"unknown non-speech kind {kind!r}; valid: {', '.join(KINDS)}")
    return augment.set_peak(makers[kind](n, rng, sample_rate), rng.uniform(*TONE_PEAK))


def render_clip(index: int, rng: np.random.Generator, sample_rate: int) -> tuple[np.ndarray, dict]:
    """Clip `index`: kinds in turn (so each is as common as the others), 1-5 s, and every other
    round of kinds through the telephone channel. Returns the audio, clipped to [-1, 1], and its
    metadata (kind, channel, RMS in dBFS of what is written)."""
    kind = KINDS[index % len(KINDS)]
    n = int(round(rng.uniform(*DURATION_RANGE_S), 2) * sample_rate)
    audio, extra = make_clip(kind, n, rng, sample_rate), {"channel": "clean"}
    if (index // len(KINDS)) % 2 == 1:
        audio, extra = augment.telephone(audio, sample_rate, rng)
    audio = np.clip(audio, -1.0, 1.0)
    rms = np.sqrt(np.mean(audio ** 2))
    return audio, {"kind": kind, **extra, "rms_dbfs": round(float(20 * np.log10(rms)), 1) if rms > 0 else None}


__all__ = ["KINDS", "make_clip", "render_clip"]
