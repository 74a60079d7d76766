"""`asr-rl train sft`: supervised fine-tuning of the audio policy on a manifest.

Loss: cross-entropy on the assistant turn's tokens only (language tag, transcript, EOS). A
pretrained encoder stays frozen (the default for such a checkpoint): its states are computed once
per utterance and augmentation variant and reused every epoch (`AudioPolicy.encode_batch`), and
only the projector and the LLM train. An encoder that trains (a from-scratch model) also gets
`ctc_weight` x CTC on its output (trainer/ctc.py) and SpecAugment on its features. One process here;
the distributed backend plugs into the same `sft_loss`.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import time

import numpy as np
import torch
import torch.nn.functional as F

from asr_rl.data.batching import AudioBatch, BatchLoader
from asr_rl.data.manifest import read_manifest
from asr_rl.data.utterance_table import column_of
from asr_rl.models.tokenizer import require_prompts_fit, require_writable, token_ids, token_lengths
from asr_rl.data.augment import VariantAugmenter, mask_states, spec_augment
from asr_rl.trainer.run.checkpoint import (load_state, policy_resume_weights, restore_policy_weights, rng_state,
                                           save_checkpoint, save_final, set_rng_state)
from asr_rl.trainer.update.ppo import TrainingDiverged
from asr_rl.trainer.update.strategy import LocalStrategy
from asr_rl.models.cache_plan import prepare_encoder_cache
from asr_rl.models.facts import ModelFacts
from asr_rl.models.loading import load_policy, require_audio_llm
from asr_rl.trainer.run.setup import make_logger, setup_run
from asr_rl.trainer.run.early_stopping import EarlyStopping
from asr_rl.trainer.run.step_end import StepEnd
from asr_rl.trainer.configs.rl import SFTConfig
from asr_rl.trainer.run.memory import peak_memory_gib
from asr_rl.models.ctc import CTCHead
from asr_rl.evaluation.during_training import evaluate_during_training

log = logging.getLogger("asr_rl.sft")


def sft_loss(policy, ctc_head: CTCHead | None, batch: AudioBatch, cfg: SFTConfig,
             rng: np.random.Generator | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Cross-entropy (+ CTC) of one micro-batch; SpecAugment and token dropout only when `rng` is
    given (waveform augmentation comes with the batch's variants)."""
    if policy.encoder_frozen:  # cached encoder states; the projector runs with grad in embed_rows
        rows = policy.encode_batch(batch)
        if rng is not None:
            masked = mask_states([r.audio for r in rows], cfg.augment, rng)
            rows = [dataclasses.replace(r, audio=a) for r, a in zip(rows, masked)]
        embeds, prompt_mask = policy.embed_rows(rows)
    else:
        prompts = policy.prepare(list(batch.waveforms), batch.languages, [u.id for u in batch.utterances],
                                 batch.contexts)
        if rng is not None:
            prompts.features = spec_augment(prompts.features, prompts.feature_mask, cfg.augment, rng)
        states = policy.encode_audio(prompts)
        embeds, prompt_mask = policy.prompt_embeds(prompts, states), prompts.attention_mask
    targets = policy.target_ids(batch.texts, batch.languages)
    inputs = _drop_tokens(policy, targets, cfg.token_dropout, rng) if rng is not None else targets
    logits = policy.response_logits(embeds, prompt_mask, inputs)
    mask = targets.mask.bool()
    ce = F.cross_entropy(logits[mask], targets.ids[mask])
    metrics = {"loss/ce": ce.item(), "tokens": int(mask.sum())}
    loss = ce
    if ctc_head is not None:
        lengths = policy.audio_positions(prompts.input_ids).sum(-1)
        labels = [policy.tokenizer(t, add_special_tokens=False)["input_ids"] for t in batch.texts]
        ctc = ctc_head(states, lengths, labels)
        loss = loss + ctc_head.loss_weight * ctc
        metrics["loss/ctc"] = ctc.item()
    metrics["loss/total"] = loss.item()
    return loss, metrics


def _drop_tokens(policy, targets, p: float, rng: np.random.Generator):
    """Teacher-forcing inputs with a share `p` of tokens replaced by random ones (labels unchanged).

    A tiny decoder first learns the text's grammar and ignores the audio; corrupting its history
    weakens that shortcut so the audio becomes the reliable evidence (word dropout, Bowman et al.
    2016, arXiv:1511.06349, used the same way in attention-based ASR).
    """
    if p <= 0:
        return targets
    allowed = np.setdiff1d(np.arange(len(policy.tokenizer)), policy.forbidden_ids + [policy.eos_id])
    drop = torch.as_tensor(rng.random(targets.ids.shape) < p, device=targets.ids.device) & targets.mask.bool()
    noise = torch.as_tensor(rng.choice(allowed, size=targets.ids.shape), device=targets.ids.device)
    return type(targets)(torch.where(drop, noise, targets.ids), targets.mask, targets.texts)


def train_sft(cfg: SFTConfig):
    """Run SFT to `max_steps` (or `max_minutes`, or early stopping's end), checkpointing and
    evaluating as configured; returns `final/` (the last weights; with early stopping the best on
    dev are in `best/`)."""
    model = ModelFacts(cfg.pretrain)  # its config, family and tokenizer read once for the checks
    require_audio_llm(model)
    with setup_run(cfg) as ctx:
        utts = read_manifest(_required(cfg.train_manifest, "train_manifest"), min_duration=cfg.data.min_duration,
                             max_duration=cfg.data.max_duration, text_needed_by="SFT",
                             options=cfg.data, trust_durations=True)  # headers are opened only where a row has no duration
        require_writable(utts, model.tokenizer)
        # the reference is the response: the longest one bounds what the prompt leaves room for
        longest = max(token_lengths(model.tokenizer, set(column_of(utts, "text"))).values()) + 1
        require_prompts_fit(utts, model.tokenizer, model.prompt_limit, longest, "train_manifest")
        policy = load_policy(cfg.pretrain, cfg.model, ctx.device, cfg.data.sample_rate)
        # a model-init folder records how many steps its encoder has trained (the acoustic scorer
        # refuses to listen through one that never did)
        encoder_steps = policy.info.get("encoder_steps", 0) if policy.info and not policy.encoder_frozen else None
        ctc_head = _make_ctc_head(policy, cfg, ctx.device, utts)
        params = [p for _, p in policy.trainable_parameters()] + (list(ctc_head.parameters()) if ctc_head else [])
        strategy = LocalStrategy.from_config(params, cfg.optim, cfg.max_steps)
        # cached variants for a frozen encoder; an encoder that trains hears a fresh variant every epoch
        augment = cfg.augment if policy.encoder_frozen else dataclasses.replace(cfg.augment, variants=0)
        loader = BatchLoader(utts, cfg.micro_train_batch_size, seed=cfg.seed, shuffle=cfg.data.shuffle,
                             sample_rate=cfg.data.sample_rate, bucket_batches=cfg.data.bucket_batches,
                             augmenter=VariantAugmenter(augment, cfg.seed), decode_workers=cfg.data.decode_workers)
        if policy.encoder_frozen:  # its size in the log, and a stop now when its disk is not there
            _plan_cache(cfg, model, utts, augment)
        step, state = 0, None
        if ctx.resume_from is not None:
            step, state = _restore(ctx.resume_from, policy, ctc_head, strategy, loader)
        end = StepEnd(cfg, make_logger(cfg, ctx, resume_step=step), step, "sft", postfix="loss/total",
                      early_stopping=EarlyStopping.from_config(cfg), decay_now=strategy.decay_now,
                      decaying=strategy.decaying, fit_schedule=strategy.fit_schedule,
                      save_best=functools.partial(save_final, ctx.output_dir, policy.save_pretrained, "best"))
        end.load_state_dict(state)
        evaluate = (functools.partial(evaluate_during_training, policy, cfg.eval_manifest, cfg.eval, options=cfg.data)
                    if cfg.eval_manifest else None)
        accum = cfg.train_batch_size // cfg.micro_train_batch_size
        while step < cfg.max_steps and not end.done:
            t0 = time.perf_counter()
            metrics, grad_norm = _train_step(policy, ctc_head, loader, strategy, cfg, step, accum)
            step += 1
            if encoder_steps is not None:
                policy.info["encoder_steps"] = encoder_steps + step
            if policy.encoder_frozen:  # what the cache holds, and what filling it has cost so far
                metrics.update({**policy.encoder_cache.metrics(), "time/encoder_total": policy.encoder_seconds})
            metrics.update({"grad_norm": grad_norm, "lr": strategy.lr, "epoch": loader.epoch,
                            "memory/peak_gib": peak_memory_gib()})
            save = functools.partial(_save, ctx.output_dir, step, policy, ctc_head, strategy, loader, end,
                                     cfg.max_ckpt_num)
            if end(step, metrics, t0, save, evaluate):
                break
        end.close()
        policy.save_encoder_cache()  # rows were written as they were encoded: release the folder
        return save_final(ctx.output_dir, policy.save_pretrained)


def _train_step(policy, ctc_head, loader, strategy, cfg: SFTConfig, step: int, accum: int) -> tuple[dict, float]:
    """One optimiser step over `accum` micro-batches: (their mean metrics, the gradient norm)."""
    policy.train()
    metrics: dict = {}
    for micro in range(accum):
        rng = np.random.default_rng([cfg.seed, step, micro])
        batch = loader.next_batch()
        loss, m = sft_loss(policy, ctc_head, batch, cfg, rng)
        _check_finite(loss, m, step + 1, batch)
        strategy.backward(loss / accum, last=micro == accum - 1)
        metrics = {k: metrics.get(k, 0) + v / accum for k, v in m.items()}
    return metrics, strategy.step()


def _plan_cache(cfg: SFTConfig, model: ModelFacts, utts, augment) -> None:
    prepare_encoder_cache(model, cfg.model, utts, augment, cfg.data.sample_rate,
                          draws=cfg.max_steps * cfg.train_batch_size, eval_manifest=cfg.eval_manifest,
                          eval_max=cfg.eval.eval_max_samples)


def _check_finite(loss: torch.Tensor, metrics: dict, step: int, batch) -> None:
    """Stop before the update (and before any save) on a NaN/inf loss, naming its utterances: one
    update would make every weight NaN, and every checkpoint after it."""
    if not torch.isfinite(loss):
        where = ", ".join(u.source or u.id for u in batch.items[:8]) + (", ..." if len(batch) > 8 else "")
        raise TrainingDiverged(f"SFT loss is {float(loss.detach())} at step {step} ({metrics}) on the batch of "
                               f"{where}; stopping before the update, the last checkpoint is intact. A NaN from "
                               "the start is usually the data (`asr-rl data check --deep` decodes every file); "
                               "later, lower the learning rate")


def _make_ctc_head(policy, cfg: SFTConfig, device, utts) -> CTCHead | None:
    """CTC trains the encoder: on by default (`ctc_weight` 0.5) only when the encoder trains."""
    weight = cfg.ctc_weight if cfg.ctc_weight is not None else (0.0 if policy.encoder_frozen else 0.5)
    if weight <= 0:
        return None
    if policy.encoder_frozen:
        raise ValueError(f"ctc_weight={weight} trains the audio encoder, which is frozen here (a pretrained "
                         "encoder is by default); set ctc_weight=0, or model.freeze_encoder=false to train it")
    d_audio = policy.spec.encoder_width(policy.model.config)
    labels = {t for ids in token_ids(policy.tokenizer, set(column_of(utts, "text"))).values() for t in ids}
    return CTCHead(d_audio, labels, labels_per_frame=cfg.ctc_labels_per_frame,
                   loss_weight=weight).to(device)


def _save(out, step, policy, ctc_head, strategy, loader, end: StepEnd, max_ckpt_num) -> None:
    state = {"step": step, **strategy.state_dict(), "data": loader.state_dict(), "rng": rng_state(), "policy": policy_resume_weights(policy),
             "ctc_head": ctc_head.state_dict() if ctc_head is not None else None, "early_stopping": end.state_dict()}
    save_checkpoint(out, step, policy.save_pretrained, state, max_ckpt_num=max_ckpt_num)


def _restore(ckpt, policy, ctc_head, strategy, loader) -> tuple[int, dict | None]:
    """The checkpoint's step and early-stopping state, the rest put back in place."""
    state = load_state(ckpt)
    restore_policy_weights(policy, ckpt, state.get("policy"))
    strategy.load_state_dict(state)  # its "optimizer" and "scheduler"
    loader.load_state_dict(state["data"])
    if ctc_head is not None and state.get("ctc_head") is not None:
        ctc_head.load_state_dict(state["ctc_head"])
    set_rng_state(state["rng"])
    return int(state["step"]), state.get("early_stopping")


def _required(value, name: str):
    if not value:
        raise ValueError(f"`{name}` is not set; pass {name}=PATH")
    return value
