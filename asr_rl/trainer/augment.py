"""Training-time augmentation for SFT: additive noise on the waveform and SpecAugment on features.

SpecAugment: Park et al., 2019, "SpecAugment: A Simple Data Augmentation Method for ASR"
(arXiv:1904.08779): zero random frequency bands and time spans of the log-mel input.
Both take an explicit numpy Generator so a resumed run augments exactly as an uninterrupted one.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class AugmentConfig:
    """Attributes:
        spec_augment: apply SpecAugment to the log-mel features.
        freq_masks: number of frequency bands zeroed per utterance.
        freq_width: maximum width of a frequency band (mel bins).
        time_masks: number of time spans zeroed per utterance.
        time_width_ratio: maximum width of a time span, as a share of the utterance's frames.
        noise_prob: probability of adding noise to an utterance's waveform.
        noise_snr_min: lowest signal-to-noise ratio of added noise (dB).
        noise_snr_max: highest signal-to-noise ratio of added noise (dB).
    """

    spec_augment: bool = True
    freq_masks: int = 2
    freq_width: int = 20
    time_masks: int = 2
    time_width_ratio: float = 0.05
    noise_prob: float = 0.5
    noise_snr_min: float = 5.0
    noise_snr_max: float = 30.0


def add_noise(waveforms: list[np.ndarray], cfg: AugmentConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """White or pink-ish noise at an SNR drawn uniformly from [noise_snr_min, noise_snr_max] dB."""
    out = []
    for wav in waveforms:
        if cfg.noise_prob <= 0 or rng.random() >= cfg.noise_prob:
            out.append(wav)
            continue
        noise = rng.standard_normal(len(wav))
        if rng.random() < 0.5:  # pink-ish: integrate white noise with a leaky accumulator
            noise = np.convolve(noise, 0.97 ** np.arange(64), mode="same")
        snr_db = rng.uniform(cfg.noise_snr_min, cfg.noise_snr_max)
        p_sig = float(np.mean(wav.astype(np.float64) ** 2)) + 1e-12
        p_noise = float(np.mean(noise ** 2)) + 1e-12
        scale = np.sqrt(p_sig / (p_noise * 10 ** (snr_db / 10)))
        out.append((wav + scale * noise).astype(np.float32))
    return out


def spec_augment(features: torch.Tensor, feature_mask: torch.Tensor, cfg: AugmentConfig,
                 rng: np.random.Generator) -> torch.Tensor:
    """Zero frequency bands and time spans in `features` `(B, n_mels, F)`, within each utterance's
    valid frames (`feature_mask` `(B, F)`). Returns a new tensor."""
    if not cfg.spec_augment:
        return features
    out = features.clone()
    n_mels = features.shape[1]
    floor = features.min()  # log-mel "silence"; zero would be a loud value after normalisation
    for b in range(features.shape[0]):
        frames = int(feature_mask[b].sum())
        for _ in range(cfg.freq_masks):
            w = int(rng.integers(0, cfg.freq_width + 1))
            f0 = int(rng.integers(0, max(1, n_mels - w)))
            out[b, f0:f0 + w, :frames] = floor
        max_t = max(1, int(cfg.time_width_ratio * frames))
        for _ in range(cfg.time_masks):
            w = int(rng.integers(0, max_t + 1))
            t0 = int(rng.integers(0, max(1, frames - w)))
            out[b, :, t0:t0 + w] = floor
    return out
