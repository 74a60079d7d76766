"""`asr-rl train rm`: pairwise reward-model training on `{prompt, chosen, rejected}` lines.

A sequence classifier with one output, initialised from `pretrain` (a causal LM folder: its body is
kept, the score head is new), trained with the Bradley-Terry loss so that chosen responses score
higher; saved as a plain HF folder that `reward_pretrain=` (and transformers) loads.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from asr_rl.config import RunConfig
from asr_rl.data.prompts import read_preferences
from asr_rl.models.reward_model import render_pair
from asr_rl.settings import setting
from asr_rl.trainer.run.checkpoint import save_checkpoint, save_final
from asr_rl.trainer.run.setup import make_logger, setup_run
from asr_rl.algos.losses import pairwise_loss
from asr_rl.trainer.strategy import LocalStrategy

log = logging.getLogger("asr_rl.rm")


@dataclass(frozen=True)
class RMConfig(RunConfig):
    """Attributes:
        train_batch_size: preference pairs per step.
        learning_rate: peak AdamW learning rate.
        weight_decay: AdamW weight decay.
        max_norm: gradient clipping norm.
        lr_warmup_ratio: share of `max_steps` warming up.
        margin: Bradley-Terry margin (0 = plain).
        max_len: tokens per scored text.
    """

    max_steps: int = setting(200, ge=1)
    train_batch_size: int = setting(8, ge=1)
    learning_rate: float = setting(1e-3, gt=0)
    weight_decay: float = setting(0.0, ge=0)
    max_norm: float = setting(1.0, gt=0)
    lr_warmup_ratio: float = setting(0.05, ge=0, lt=1)
    margin: float = 0.0
    max_len: int = setting(512, ge=1)


def load_rm_from_lm(path: str):
    """A `*ForSequenceClassification` (1 label) with the causal LM's body and a fresh score head."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
    if model.config.pad_token_id is None:  # the classifier reads the last non-pad token
        model.config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return model, tokenizer


def rm_batch_loss(model, tokenizer, pairs, max_len: int, margin: float):
    texts = [render_pair(tokenizer, p.prompt, r) for p in pairs for r in (p.chosen, p.rejected)]
    enc = tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=max_len,
                    add_special_tokens=False)
    scores = model(**enc).logits[:, 0]
    return pairwise_loss(scores[0::2], scores[1::2], margin)


def train_rm(cfg: RMConfig):
    ctx = setup_run(cfg)
    if not cfg.prompt_data:
        raise ValueError("`prompt_data` is not set: give the preference pairs, prompt_data=PAIRS.jsonl")
    if not cfg.pretrain:
        raise ValueError("`pretrain` is not set: give the causal LM to start the reward model from")
    pairs = read_preferences(cfg.prompt_data)
    model, tokenizer = load_rm_from_lm(cfg.pretrain)
    strategy = LocalStrategy(list(model.parameters()), cfg.learning_rate, cfg.weight_decay, (0.9, 0.95),
                             cfg.max_norm, cfg.max_steps, cfg.lr_warmup_ratio, 0.1)
    logger = make_logger(cfg, ctx, resume_step=0)
    rng = np.random.default_rng(cfg.seed)
    order, pos = rng.permutation(len(pairs)), 0

    def save(path):
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)

    for step in tqdm(range(1, cfg.max_steps + 1), desc="rm", disable=not cfg.logging.progress_bar):
        if pos + cfg.train_batch_size > len(order):
            order, pos = rng.permutation(len(pairs)), 0
        batch = [pairs[i] for i in order[pos:pos + min(cfg.train_batch_size, len(pairs))]]
        pos += cfg.train_batch_size
        model.train()
        out = rm_batch_loss(model, tokenizer, batch, cfg.max_len, cfg.margin)
        strategy.backward(out.loss)
        logger.log(step, {**out.metrics, "rm/grad_norm": strategy.step(), "lr": strategy.lr})
        if cfg.save_steps > 0 and step % cfg.save_steps == 0 and step < cfg.max_steps:
            save_checkpoint(ctx.output_dir, step, save, {"step": step}, cfg.max_ckpt_num)
    logger.close()
    return save_final(ctx.output_dir, save)


__all__ = ["RMConfig", "train_rm", "load_rm_from_lm", "rm_batch_loss"]
