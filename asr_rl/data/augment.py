"""Training-time augmentation: waveform variants (reverb, noise, telephone band, speed) and
SpecAugment on features.

Waveform augmentation is by variant (`VariantAugmenter`, the data loader's `Augmenter`): each
utterance has the clean audio (variant 0) and `variants` augmented versions, each a pure function of
(seed, utterance id, variant), drawn per epoch. A frozen encoder's states are cached per variant, so
a handful of variants cost a handful of encoder passes per utterance for the whole run;
`variants=0` draws a fresh augmentation every epoch (for an encoder that trains).

SpecAugment: Park et al., 2019, "SpecAugment: A Simple Data Augmentation Method for ASR"
(arXiv:1904.08779): zero random frequency bands and time spans of the log-mel input where the
encoder trains; with a frozen encoder (whose cached states never see the features again) the same
masks, of the same relative sizes, fall on the cached encoder states instead (`mask_states`), so
every step still sees a different view of the audio at no encoder cost.
Everything takes an explicit numpy Generator so a resumed run augments exactly as an uninterrupted one.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from asr_rl.settings import setting


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
        telephone_prob: probability of a telephone channel (300-3400 Hz band, 8 kHz resampling).
        speed_prob: probability of speed perturbation (resampling by a factor in [0.9, 1.1], which
            changes tempo and pitch, as Kaldi's speed perturbation).
        variants: augmented variants per utterance (each drawn as likely as the clean audio); 0 = a
            fresh augmentation every epoch.
    """

    spec_augment: bool = True  # with a frozen encoder: on its cached states (`mask_states`)
    freq_masks: int = setting(2, ge=0)
    freq_width: int = setting(20, ge=0)
    time_masks: int = setting(2, ge=0)
    time_width_ratio: float = setting(0.05, ge=0, le=1)
    noise_prob: float = setting(0.5, ge=0, le=1)
    noise_snr_min: float = 5.0
    noise_snr_max: float = 30.0
    reverb_prob: float = setting(0.0, ge=0, le=1)
    telephone_prob: float = setting(0.0, ge=0, le=1)
    speed_prob: float = setting(0.0, ge=0, le=1)
    variants: int = setting(3, ge=0)

    @property
    def waveform_active(self) -> bool:
        return max(self.noise_prob, self.reverb_prob, self.telephone_prob, self.speed_prob) > 0


def augment_waveforms(waveforms: list[np.ndarray], cfg: AugmentConfig, rng: np.random.Generator,
                      sample_rate: int = 16000) -> list[np.ndarray]:
    """Speed-perturb `speed_prob` of the utterances, reverberate `reverb_prob` of them (synthetic
    room, RT60 0.15-0.6 s), pass `telephone_prob` through a telephone channel, and add white, pink or
    babble noise to `noise_prob` of them at an SNR drawn from [noise_snr_min, noise_snr_max] dB."""
    from asr_rl.data.synth.augment import NOISE_KINDS, RT60_RANGE_S, apply_reverb, make_noise, mix_at_snr, reverb_ir

    out = []
    for wav in waveforms:
        x = wav.astype(np.float64)
        if cfg.speed_prob > 0 and rng.random() < cfg.speed_prob:
            x = _resample(x, sample_rate, sample_rate * float(rng.uniform(0.9, 1.1)))
        if cfg.reverb_prob > 0 and rng.random() < cfg.reverb_prob:
            x = apply_reverb(x, reverb_ir(float(rng.uniform(*RT60_RANGE_S)), sample_rate, rng))
        if cfg.telephone_prob > 0 and rng.random() < cfg.telephone_prob:
            x = telephone_band(x, sample_rate)
        if cfg.noise_prob > 0 and rng.random() < cfg.noise_prob and np.any(x):
            kind = NOISE_KINDS[int(rng.integers(len(NOISE_KINDS)))]
            x = mix_at_snr(x, make_noise(kind, x.size, rng, sample_rate),
                           float(rng.uniform(cfg.noise_snr_min, cfg.noise_snr_max)))
        out.append(x.astype(np.float32))
    return out


def telephone_band(x: np.ndarray, sample_rate: int) -> np.ndarray:
    """A narrow-band telephone channel: down to 8 kHz and back (nothing above 4 kHz survives), and
    the 300-3400 Hz voice band of G.712 kept by an FFT mask."""
    y = _resample(_resample(x, sample_rate, 8000), 8000, sample_rate)[: x.size]
    y = np.pad(y, (0, x.size - y.size))
    spectrum = np.fft.rfft(y)
    freqs = np.fft.rfftfreq(y.size, 1.0 / sample_rate)
    spectrum[(freqs < 300) | (freqs > 3400)] = 0
    return np.fft.irfft(spectrum, n=y.size)


def _resample(x: np.ndarray, sr_in: float, sr_out: float) -> np.ndarray:
    import soxr

    return soxr.resample(x, sr_in, sr_out)


@dataclass(frozen=True)
class VariantAugmenter:
    """The data loader's `Augmenter`: variant 0 is the clean audio, variants 1..K augmented ones.

    `pick` draws uniformly among the K + 1 variants per (seed, utterance, epoch); with K = 0 every
    epoch is a fresh variant. `apply` is a pure function of (seed, utterance id, variant), so a
    cached encoder state and a recomputed one agree, and a resumed run hears what it heard before.
    """

    cfg: AugmentConfig
    seed: int = setting(0, ge=0)

    @property
    def tag(self) -> str:
        """Hash of what the waveforms depend on: the waveform settings and the seed (not SpecAugment)."""
        import hashlib

        c = self.cfg
        fields = (c.noise_prob, c.noise_snr_min, c.noise_snr_max, c.reverb_prob, c.telephone_prob, c.speed_prob, self.seed)
        return hashlib.sha1(repr(fields).encode()).hexdigest()[:10]

    def pick(self, utterance, epoch: int) -> int:
        if not self.cfg.waveform_active:
            return 0
        if self.cfg.variants <= 0:
            return epoch + 1
        rng = np.random.default_rng([self.seed, _key(utterance.id), epoch])
        return int(rng.integers(0, self.cfg.variants + 1))

    def apply(self, waveform: np.ndarray, utterance, variant: int, sample_rate: int) -> np.ndarray:
        if variant == 0:
            return waveform
        rng = np.random.default_rng([self.seed, _key(utterance.id), variant])
        return augment_waveforms([waveform], self.cfg, rng, sample_rate)[0]


def _key(text: str) -> int:
    import zlib

    return zlib.crc32(text.encode("utf-8"))


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


def mask_states(states: list[torch.Tensor], cfg: AugmentConfig, rng: np.random.Generator,
                n_mels: int = 80) -> list[torch.Tensor]:
    """SpecAugment on encoder states: each `(L_i, d)` tensor gets `time_masks` spans of up to
    `time_width_ratio * L_i` frames and `freq_masks` channel bands of up to `freq_width / n_mels * d`
    channels set to zero (new tensors; the cached ones are not touched)."""
    if not cfg.spec_augment:
        return states
    out = []
    for x in states:
        frames, dim = x.shape
        keep = torch.ones_like(x)
        max_c = int(cfg.freq_width / n_mels * dim)
        for _ in range(cfg.freq_masks):
            w = int(rng.integers(0, max_c + 1))
            c0 = int(rng.integers(0, max(1, dim - w)))
            keep[:, c0:c0 + w] = 0
        max_t = max(1, int(cfg.time_width_ratio * frames))
        for _ in range(cfg.time_masks):
            w = int(rng.integers(0, max_t + 1))
            t0 = int(rng.integers(0, max(1, frames - w)))
            keep[t0:t0 + w] = 0
        out.append(x * keep)
    return out
