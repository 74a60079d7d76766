"""`asr-rl train rm`: pairwise reward-model training on `{prompt, chosen, rejected}` lines.

A sequence classifier with one output, initialised from `pretrain` (a causal LM folder: its body is
kept, the score head is new), trained with the Bradley-Terry loss so that chosen responses score
higher; saved as a plain HF folder that `reward_pretrain=` (and transformers) loads.
"""
from __future__ import annotations

import functools
import logging
import time

import numpy as np

from asr_rl.data.prompts import read_preferences
from asr_rl.rewards.reward_model import render_pair
from asr_rl.trainer.run.checkpoint import (load_state, restore_model_weights, rng_state, save_checkpoint, save_final,
                                           set_rng_state)
from asr_rl.trainer.run.setup import make_logger, setup_run
from asr_rl.trainer.run.step_end import StepEnd
from asr_rl.algos.losses import pairwise_loss
from asr_rl.trainer.configs.preference import RMConfig
from asr_rl.trainer.update.strategy import LocalStrategy

log = logging.getLogger("asr_rl.rm")


class PairOrder:
    """Which pairs each step reads: a seeded permutation taken a batch at a time, drawn anew when
    what is left is shorter than a batch. Its state (generator, permutation, position) goes into
    the checkpoints, so a resumed run reads what the uninterrupted one would."""

    def __init__(self, n: int, batch: int, seed: int):
        self.n, self.batch = n, batch
        self.rng = np.random.default_rng(seed)
        self.order, self.pos = self.rng.permutation(n), 0

    def next_indices(self) -> list[int]:
        if self.pos + self.batch > len(self.order):
            self.order, self.pos = self.rng.permutation(self.n), 0
        idx = self.order[self.pos:self.pos + min(self.batch, self.n)]
        self.pos += self.batch
        return [int(i) for i in idx]

    def state_dict(self) -> dict:
        return {"rng": self.rng.bit_generator.state, "order": self.order.copy(), "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.order, self.pos = np.asarray(state["order"]), int(state["pos"])


def load_rm_from_lm(path: str):
    """A `*ForSequenceClassification` (1 label) with the causal LM's body and a fresh score head."""
    from transformers import AutoModelForSequenceClassification

    from asr_rl.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(path)
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
    """Train to `max_steps` (or `max_minutes`), checkpointing as configured; `resume=auto` continues
    a killed run where its last checkpoint left off."""
    with setup_run(cfg) as ctx:
        if not cfg.prompt_data:
            raise ValueError("`prompt_data` is not set: give the preference pairs, prompt_data=PAIRS.jsonl")
        if not cfg.pretrain:
            raise ValueError("`pretrain` is not set: give the causal LM to start the reward model from")
        pairs = read_preferences(cfg.prompt_data)
        model, tokenizer = load_rm_from_lm(cfg.pretrain)
        strategy = LocalStrategy.from_config(model.parameters(), cfg.optim, cfg.max_steps)
        data, step = PairOrder(len(pairs), cfg.train_batch_size, cfg.seed), 0
        if ctx.resume_from is not None:
            state = load_state(ctx.resume_from)
            restore_model_weights(model, ctx.resume_from)
            strategy.load_state_dict(state)  # its "optimizer" and "scheduler"
            data.load_state_dict(state["data"])
            set_rng_state(state["rng"])
            step = int(state["step"])
        end = StepEnd(cfg, make_logger(cfg, ctx, resume_step=step), step, "rm", postfix="rm/loss")

        def save_model(path):
            model.save_pretrained(path)
            tokenizer.save_pretrained(path)

        def save(step: int) -> None:
            state = {"step": step, **strategy.state_dict(), "data": data.state_dict(), "rng": rng_state()}
            save_checkpoint(ctx.output_dir, step, save_model, state, cfg.max_ckpt_num)

        while step < cfg.max_steps:
            t0 = time.perf_counter()
            model.train()
            out = rm_batch_loss(model, tokenizer, [pairs[i] for i in data.next_indices()], cfg.max_len, cfg.margin)
            strategy.backward(out.loss)
            metrics = {**out.metrics, "rm/grad_norm": strategy.step(), "lr": strategy.lr}
            step += 1
            if end(step, metrics, t0, functools.partial(save, step)):
                break
        end.close()
        return save_final(ctx.output_dir, save_model)


__all__ = ["RMConfig", "train_rm", "load_rm_from_lm", "rm_batch_loss"]
