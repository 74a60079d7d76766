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
        reverb_prob: probability of reverberating an utterance (before the noise).
    """

    spec_augment: bool = True
    freq_masks: int = 2
    freq_width: int = 20
    time_masks: int = 2
    time_width_ratio: float = 0.05
    noise_prob: float = 0.5
    noise_snr_min: float = 5.0
    noise_snr_max: float = 30.0
    reverb_prob: float = 0.0


def augment_waveforms(waveforms: list[np.ndarray], cfg: AugmentConfig, rng: np.random.Generator,
              sample_rate: int = 16000) -> list[np.ndarray]:
    """Reverberate `reverb_prob` of the utterances (synthetic room, RT60 0.15-0.6 s) and add white,
    pink or babble noise to `noise_prob` of them at an SNR drawn from [noise_snr_min, noise_snr_max]
    dB: the same generators as the noisy test set (data/synth/augment.py), applied to training audio."""
    from asr_rl.data.synth.augment import NOISE_KINDS, RT60_RANGE_S, apply_reverb, make_noise, mix_at_snr, reverb_ir

    out = []
    for wav in waveforms:
        x = wav.astype(np.float64)
        if cfg.reverb_prob > 0 and rng.random() < cfg.reverb_prob:
            x = apply_reverb(x, reverb_ir(float(rng.uniform(*RT60_RANGE_S)), sample_rate, rng))
        if cfg.noise_prob > 0 and rng.random() < cfg.noise_prob and np.any(x):
            kind = NOISE_KINDS[int(rng.integers(len(NOISE_KINDS)))]
            x = mix_at_snr(x, make_noise(kind, x.size, rng, sample_rate),
                           float(rng.uniform(cfg.noise_snr_min, cfg.noise_snr_max)))
        out.append(x.astype(np.float32))
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
