"""Noise, reverberation, level and a telephone channel for the noisy and target-domain sets, in numpy/scipy
so they need no data files.

SNR is defined over whole signals, as in Kaldi/MUSAN-style augmentation: the power of the
(reverberant) speech over the utterance, silences included, against the power of the added noise.
"""
from __future__ import annotations

import numpy as np
from scipy import signal

NOISE_KINDS = ("white", "pink", "babble")
SNR_RANGE_DB = (5.0, 20.0)
RT60_RANGE_S = (0.15, 0.6)


def white_noise(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal(n)


def pink_noise(n: int, rng: np.random.Generator) -> np.ndarray:
    """1/f power spectrum: white noise shaped by 1/sqrt(f) in the frequency domain."""
    spectrum = np.fft.rfft(rng.standard_normal(n))
    freqs = np.arange(spectrum.size, dtype=float)
    freqs[0] = 1.0  # leave DC alone instead of dividing by zero
    return np.fft.irfft(spectrum / np.sqrt(freqs), n=n)


def babble_noise(n: int, rng: np.random.Generator, sample_rate: int, talkers: int = 6) -> np.ndarray:
    """Speech-like crowd noise without recordings: several speech-band noises, each switched on and
    off by a random syllable-rate (~4 Hz) envelope, summed."""
    out = np.zeros(n)
    freqs = np.fft.rfftfreq(n, d=1.0 / sample_rate)
    band = (freqs > 150) & (freqs < 4000)
    for _ in range(talkers):
        voice = np.fft.irfft(np.fft.rfft(pink_noise(n, rng)) * band, n=n)
        # Random levels every 1/8 s, interpolated, half-wave rectified: bursts and pauses.
        knots = rng.standard_normal(int(n / sample_rate * 8) + 2)
        envelope = np.interp(np.arange(n), np.linspace(0, n, knots.size), knots)
        out += voice * np.maximum(envelope, 0.0)
    return out


def make_noise(kind: str, n: int, rng: np.random.Generator, sample_rate: int) -> np.ndarray:
    if kind == "white":
        return white_noise(n, rng)
    if kind == "pink":
        return pink_noise(n, rng)
    if kind == "babble":
        return babble_noise(n, rng, sample_rate)
    raise ValueError(f"unknown noise kind {kind!r}; valid: {', '.join(NOISE_KINDS)}")


def reverb_ir(rt60_s: float, sample_rate: int, rng: np.random.Generator,
              wet: float = 0.6) -> np.ndarray:
    """Synthetic room impulse response: a unit direct path plus an exponentially decaying noise
    tail that falls 60 dB in `rt60_s` (exp(-ln(1000) t / RT60)); `wet` is the tail's energy
    relative to the direct path."""
    length = max(int(rt60_s * sample_rate), 2)
    t = np.arange(length) / sample_rate
    tail = rng.standard_normal(length) * np.exp(-np.log(1000.0) * t / rt60_s)
    tail[0] = 0.0
    ir = np.sqrt(wet) * tail / np.linalg.norm(tail)
    ir[0] = 1.0
    return ir


def apply_reverb(audio: np.ndarray, ir: np.ndarray) -> np.ndarray:
    """Convolve (via FFT) and keep the input length: espeak-ng ends utterances with ~0.35 s of
    silence, which holds most of the tail."""
    n = audio.size + ir.size - 1
    size = 1 << (n - 1).bit_length()
    wet = np.fft.irfft(np.fft.rfft(audio, size) * np.fft.rfft(ir, size), size)
    return wet[: audio.size]


def mix_at_snr(speech: np.ndarray, noise: np.ndarray, snr_db: float) -> np.ndarray:
    """speech + noise scaled so that 10 log10(P_speech / P_noise) == snr_db exactly."""
    if noise.shape != speech.shape:
        raise ValueError(f"noise shape {noise.shape} != speech shape {speech.shape}")
    p_speech, p_noise = np.mean(speech ** 2), np.mean(noise ** 2)
    if p_speech <= 0 or p_noise <= 0:
        raise ValueError("cannot mix at an SNR when speech or noise is all zeros")
    scale = np.sqrt(p_speech / (p_noise * 10.0 ** (snr_db / 10.0)))
    return speech + scale * noise


def set_peak(audio: np.ndarray, peak: float) -> np.ndarray:
    """Scale so that max |x| == peak (a linear gain, so it keeps the SNR)."""
    top = np.max(np.abs(audio))
    return audio if top == 0 else audio * (peak / top)


def corrupt(audio: np.ndarray, rng: np.random.Generator, sample_rate: int) -> tuple[np.ndarray, dict]:
    """Reverberate, then add noise at a random 5-20 dB SNR. Returns the audio and what was done
    (snr in dB rounded to 0.1, which is the value actually used, noise kind, RT60)."""
    snr_db = round(float(rng.uniform(*SNR_RANGE_DB)), 1)
    kind = NOISE_KINDS[int(rng.integers(len(NOISE_KINDS)))]
    rt60 = round(float(rng.uniform(*RT60_RANGE_S)), 2)
    speech = apply_reverb(audio.astype(np.float64), reverb_ir(rt60, sample_rate, rng))
    noisy = mix_at_snr(speech, make_noise(kind, speech.size, rng, sample_rate), snr_db)
    return noisy, {"noise_snr_db": snr_db, "noise_type": kind, "reverb_rt60": rt60}


# ---------------------------------------------------------------- telephone channel

PHONE_BAND_HZ = (300.0, 3400.0)  # the ITU-T G.712 voice band
PHONE_RATE = 8000
MU = 255.0  # G.711 mu-law
LINE_NOISE_DBFS = (-60.0, -48.0)  # RMS of the line's hiss, in dB re full scale


def bandpass(audio: np.ndarray, sample_rate: int, band: tuple[float, float] = PHONE_BAND_HZ,
             order: int = 4) -> np.ndarray:
    """Butterworth band-pass (causal, as a handset's filter is): -3 dB at the band edges, 24 dB an
    octave beyond them for order 4."""
    sos = signal.butter(order, band, btype="bandpass", fs=sample_rate, output="sos")
    return signal.sosfilt(sos, audio)


def mu_law(audio: np.ndarray, bits: int = 8) -> np.ndarray:
    """Compand with mu-law, quantise to `bits` bits, expand back: G.711's coding noise, which is
    proportional to the level (about 38 dB below a loud signal) rather than fixed."""
    x = np.clip(audio, -1.0, 1.0)
    code = np.sign(x) * np.log1p(MU * np.abs(x)) / np.log1p(MU)
    steps = 2 ** (bits - 1) - 1
    code = np.round(code * steps) / steps
    return np.sign(code) * np.expm1(np.abs(code) * np.log1p(MU)) / MU


def telephone(audio: np.ndarray, sample_rate: int, rng: np.random.Generator) -> tuple[np.ndarray, dict]:
    """A narrow-band phone call, at absolute levels (audio in [-1, 1]): the sender's band-pass,
    down to 8 kHz, line hiss at a random -60..-48 dBFS, 8-bit mu-law, back up to `sample_rate`, the
    receiver's band-pass. Returns the audio (same length) and what was done."""
    noise_dbfs = round(float(rng.uniform(*LINE_NOISE_DBFS)), 1)
    narrow = signal.resample_poly(bandpass(audio, sample_rate), PHONE_RATE, sample_rate)
    narrow = narrow + rng.standard_normal(narrow.size) * 10.0 ** (noise_dbfs / 20.0)
    wide = signal.resample_poly(mu_law(narrow), sample_rate, PHONE_RATE)[: audio.size]
    wide = np.pad(wide, (0, audio.size - wide.size))
    return bandpass(wide, sample_rate), {"channel": "telephone", "line_noise_dbfs": noise_dbfs}
