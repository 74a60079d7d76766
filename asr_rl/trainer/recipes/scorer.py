"""`asr-rl train scorer`: the acoustic scorer (rewards/acoustic_scorer.py) on the frozen encoder of an
audio model, from labelled transcripts.

    asr-rl train scorer pretrain=exp/demo/sft/best train_manifest=data/corpus/train.jsonl \\
        eval_manifest=data/corpus/dev.jsonl output_dir=exp/demo/scorer max_steps=1500

The encoder's states come from the model's encoder cache (`model.encoder_cache`: the SFT's folder
is reused, so the scorer trains on the states the SFT computed, augmented variants included); the
scorer is a CTC model over the transcripts' characters and trains in a few minutes on CPU. The
folder written (`output_dir/final`) holds the scorer and a copy of the audio model it listens
through (`encoder/`); `reward.terms: {acoustic: 1}` with `reward.term_options: {acoustic: {scorer:
DIR}}`, or `asr-rl reward serve --reward acoustic:DIR`, scores hypotheses with it. The dev CER of
its own best-path transcripts is logged (`eval/cer`): a scorer that cannot transcribe cannot judge.
The run is short: it keeps no resume state (a stopped run starts again).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from asr_rl.config import ConfigError, RunConfig
from asr_rl.data.augment import AugmentConfig, VariantAugmenter
from asr_rl.data.batching import BatchLoader, iter_batches
from asr_rl.data.manifest import ManifestError, read_manifest, scan_manifest
from asr_rl.data.readers import ReadingDataConfig
from asr_rl.data.utterance_table import column_of
from asr_rl.rewards.acoustic_scorer import AcousticScorer, source_chars
from asr_rl.models.builders import read_info
from asr_rl.models.loading import load_policy, require_audio_llm
from asr_rl.rewards.normalize import cer
from asr_rl.settings import setting
from asr_rl.trainer.configs.model import ModelConfig
from asr_rl.trainer.configs.optim import OptimConfig
from asr_rl.trainer.run.setup import make_logger, setup_run
from asr_rl.trainer.update.strategy import LocalStrategy

log = logging.getLogger("asr_rl.scorer")


@dataclass(frozen=True)
class ScorerConfig(RunConfig):
    """`asr-rl train scorer`: an acoustic scorer on `pretrain`'s frozen audio encoder.

    Attributes:
        train_batch_size: utterances per step.
        body: what reads the frames: `lstm` (a bidirectional LSTM) or `conv` (dilated residual
            convolutions: a step in 0.4-0.5x the LSTM's time at 2 layers; docs/benchmarks/history.md).
        hidden: width of the scorer's body (the LSTM's both directions together).
        layers: LSTM or convolution layers.
        labels_per_frame: CTC slots each encoder frame predicts (speech can be faster than the frames).
        optim: AdamW and its schedule over `max_steps` (learning rate 2e-3, cosine to 5%).
        model: how the audio model is loaded; `model.encoder_cache` reuses its SFT's encoder states.
        augment: augmentation variants of the audio the scorer hears (the SFT's, so the cache serves them).
        data: how `train_manifest` is read.
        encoder_trained: vouch that `pretrain`'s encoder was trained though its folder records no
            training (a `model init` random encoder that an SFT of an earlier version trained); a
            random encoder with no record is refused.
    """

    train_batch_size: int = setting(16, ge=1)
    encoder_trained: bool = False
    body: Literal["lstm", "conv"] = "lstm"
    hidden: int = setting(256, ge=2)
    layers: int = setting(2, ge=1)
    labels_per_frame: int = setting(2, ge=1)
    max_steps: int = setting(1500, ge=1)
    eval_steps: int = 500
    save_steps: int = 0
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(learning_rate=2e-3, lr_warmup_ratio=0.02,
                                                                   lr_scheduler="cosine_with_min_lr", min_lr_ratio=0.05))
    model: ModelConfig = field(default_factory=ModelConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    data: ReadingDataConfig = field(default_factory=ReadingDataConfig)


def dev_cer(scorer: AcousticScorer, policy, manifest: str, options) -> float:
    """The scorer's best-path CER on `manifest` (its labelled lines)."""
    utts = [u for u in read_manifest(manifest, options=options, trust_durations=True) if u.text]
    errors = chars = 0.0
    for batch in iter_batches(utts, 32, policy.sample_rate):
        hyps = scorer.greedy([r.audio.float() for r in policy.encode_batch(batch)])
        for u, h in zip(batch.utterances, hyps):
            n = max(1, len(u.text))
            errors, chars = errors + cer(u.text, h) * n, chars + n
    return errors / max(chars, 1.0)


def check_dev_set(manifest: str, options) -> None:
    """The dev set the scorer's CER is measured on, before any training: every line labelled, and
    some with words (0 errors over 0 characters is no CER)."""
    scan = scan_manifest(manifest, check_audio=False, text_needed_by="the scorer's dev CER (eval_manifest)",
                         options=options)
    if scan.problems:
        raise ManifestError(manifest, scan.problems)
    if not any(column_of(scan.utterances, "text")):
        raise ValueError(f"eval_manifest={manifest}: none of its {len(scan.utterances)} lines has a transcript with "
                         "words (all \"\"), so it has no CER to report; give labelled speech, or no eval_manifest")


def check_encoder_trained(cfg: ScorerConfig) -> None:
    """A scorer listens through `pretrain`'s encoder: one `model init` drew at random and no SFT has
    trained (its `asr_rl.json` records the steps) hears nothing."""
    info = read_info(cfg.pretrain)
    if info.get("encoder") == "random" and not info.get("encoder_steps") and not cfg.encoder_trained:
        raise ConfigError(f"pretrain={cfg.pretrain}: its audio encoder is `model init`'s random one, never trained, "
                          "and a scorer that listens through it cannot hear; train it first (`asr-rl train sft`, "
                          "where a random encoder trains with CTC), or give a model with a pretrained encoder "
                          "(if SFT trained this one before asr-rl recorded it, add encoder_trained=true)")


def train_scorer(cfg: ScorerConfig) -> Path:
    """Train to `max_steps`; writes `output_dir/final` (scorer + `encoder/`) and returns it."""
    require_audio_llm(cfg.pretrain)
    check_encoder_trained(cfg)
    if cfg.eval_manifest:
        check_dev_set(cfg.eval_manifest, cfg.data)
    with setup_run(cfg) as ctx:
        if not cfg.train_manifest:
            raise ValueError("`train_manifest` is not set: give labelled utterances, train_manifest=PATH")
        utts = read_manifest(cfg.train_manifest, min_duration=cfg.data.min_duration, max_duration=cfg.data.max_duration,
                             text_needed_by="the acoustic scorer", options=cfg.data, trust_durations=True)
        policy = load_policy(cfg.pretrain, cfg.model, ctx.device, cfg.data.sample_rate)
        policy.freeze()
        d_audio = policy.spec.encoder_width(policy.model.config)  # the family's spec knows its encoder
        scorer = AcousticScorer(d_audio, source_chars(column_of(utts, "text")), cfg.hidden, cfg.layers,
                                cfg.labels_per_frame, cfg.body).to(ctx.device)
        strategy = LocalStrategy.from_config(scorer.parameters(), cfg.optim, cfg.max_steps)
        loader = BatchLoader(utts, cfg.train_batch_size, seed=cfg.seed, sample_rate=cfg.data.sample_rate,
                             augmenter=VariantAugmenter(cfg.augment, cfg.seed), decode_workers=cfg.data.decode_workers)
        logger = make_logger(cfg, ctx, resume_step=0)
        for step in range(1, cfg.max_steps + 1):
            t0 = time.perf_counter()
            batch = loader.next_batch()
            scorer.train()
            loss = scorer.loss([r.audio.float() for r in policy.encode_batch(batch)], batch.texts)
            strategy.backward(loss)
            metrics = {"loss/ctc": float(loss.detach()), "grad_norm": strategy.step(), "lr": strategy.lr,
                       "time/step": time.perf_counter() - t0}
            if cfg.eval_manifest and (step % max(cfg.eval_steps, 1) == 0 or step == cfg.max_steps):
                scorer.eval()
                metrics["eval/cer"] = dev_cer(scorer, policy, cfg.eval_manifest, cfg.data)
                log.info("step %d: loss %.3f, dev CER %.2f%%", step, metrics["loss/ctc"], 100 * metrics["eval/cer"])
            logger.log(step, metrics)
        logger.close()
        policy.save_encoder_cache()
        final = Path(ctx.output_dir) / "final"
        scorer.cpu().eval().save(final)
        policy.save_pretrained(final / "encoder")
        return final


__all__ = ["ScorerConfig", "train_scorer", "dev_cer"]
