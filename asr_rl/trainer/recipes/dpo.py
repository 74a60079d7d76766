"""`asr-rl train dpo` and `asr-rl train kto`: preference training of an audio or text policy.

Audio pairs (`train_manifest=`, data/pairs.py) are usually a model's own N-best lists scored by the
reward (`asr-rl data pairs`). The frozen encoder runs once per utterance for the whole run (the
encoder cache), and both responses of a pair share that prompt. The reference is the starting
policy itself: its log-probs are computed once, before the first update, and kept in the
checkpoints, so no second model is held. The math is trainer/preference_losses.py.
"""
from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from asr_rl.models.policy_base import group_index
from asr_rl.trainer.run.checkpoint import (load_state, policy_resume_weights, restore_policy_weights, rng_state,
                                           save_checkpoint, save_final, set_rng_state)
from asr_rl.trainer.configs.preference import DPOConfig
from asr_rl.algos.preference_losses import PREFERENCE_LOSSES, dpo_loss, kto_loss

log = logging.getLogger("asr_rl.dpo")


# ------------------------------------------------------------------------------ scoring
def prompt_rows(policy, sources: list) -> list:
    """Prompt rows of utterances (audio: cached encoder states) or prompts (text)."""
    if hasattr(sources[0], "audio"):
        from asr_rl.data.batching import lazy_batch

        return policy.encode_batch(lazy_batch(sources, policy.sample_rate))
    from asr_rl.data.prompts import PromptBatch

    return policy.encode_batch(PromptBatch(sources))


def response_ids(policy, sources: list, texts: list[str]):
    """The responses as the model writes them (audio: the family's assistant turn; + EOS)."""
    return policy.target_ids(texts, [getattr(s, "language", None) for s in sources])


def sequence_logps(policy, sources: list, texts: list[list[str]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-probs `(B, k)` of k responses per source (`texts[i]` answers `sources[i]`), and
    the token-mean cross-entropy of each source's first response (for `nll_loss_coef`)."""
    k = len(texts[0])
    rows = prompt_rows(policy, sources)
    embeds, mask = policy.embed_rows(rows)
    responses = response_ids(policy, [s for s in sources for _ in range(k)], [t for ts in texts for t in ts])
    logp = policy.logprobs(embeds, mask, responses, group_index(len(embeds), k))  # (B*k, T), 0 at padding
    first = responses.mask.view(len(sources), k, -1)[:, 0].float()
    nll = -(logp.view(len(sources), k, -1)[:, 0] * first).sum() / first.sum()
    return logp.sum(-1).view(len(sources), k), nll


# ------------------------------------------------------------------------------ data
@dataclass
class Examples:
    """`texts[i]`: DPO `[chosen, rejected]`; KTO `[completion, mismatched]`, the mismatched
    completion another source's (for KTO's reference point), fixed for the run."""

    sources: list
    texts: list[list[str]]
    desirable: list[bool] | None = None  # KTO labels

    def __len__(self) -> int:
        return len(self.sources)

    def take(self, idx: list[int]) -> "Examples":
        return Examples([self.sources[i] for i in idx], [self.texts[i] for i in idx],
                        None if self.desirable is None else [self.desirable[i] for i in idx])


def load_examples(cfg: DPOConfig, audio: bool) -> Examples:
    from asr_rl.data.pairs import read_pairs, read_unpaired

    path = cfg.train_manifest if audio else cfg.prompt_data
    if not path:
        key = "train_manifest" if audio else "prompt_data"
        raise ValueError(f"`{key}` is not set: give the preference file, {key}=PAIRS.jsonl")
    if PREFERENCE_LOSSES.spec(cfg.loss_type).paired:
        pairs = read_pairs(path, audio)
        return Examples([p.source for p in pairs], [[p.chosen, p.rejected] for p in pairs])
    items = read_unpaired(path, audio)
    order = np.random.default_rng(cfg.seed).permutation(len(items))
    mismatched = {}
    for pos, i in enumerate(order):  # the next different source along a shuffled ring
        for step in range(1, len(items)):
            j = order[(pos + step) % len(items)]
            if items[j].source != items[i].source:
                mismatched[i] = items[j].completion
                break
        else:
            raise ValueError(f"{path}: KTO needs examples of at least two different sources")
    return Examples([u.source for u in items], [[u.completion, mismatched[i]] for i, u in enumerate(items)],
                    [u.desirable for u in items])


@torch.no_grad()
def reference_logps(policy, ex: Examples, micro: int) -> torch.Tensor:
    """`(N, 2)` summed log-probs under the policy as it is now (the reference), once per run."""
    policy.eval()
    return torch.cat([sequence_logps(policy, ex.sources[s:s + micro], ex.texts[s:s + micro])[0].float().cpu()
                      for s in range(0, len(ex), micro)])


@torch.no_grad()
def encode_examples(policy, ex: Examples, micro: int) -> None:
    """Encode every example's audio once, in the micro-batches of the reference pass (the encoder
    cache keeps the states for the run). A padded batch's states depend in their last bits on the
    utterances beside it: a resumed run, whose reference log-probs come from its checkpoint, encodes
    in these same batches, or its losses would drift from the uninterrupted run's."""
    policy.eval()
    for s in range(0, len(ex), micro):
        prompt_rows(policy, ex.sources[s:s + micro])


def batch_indices(n: int, batch: int, step: int, seed: int) -> list[int]:
    """Step `step`'s examples: a seeded permutation per epoch, read in order across epochs, so a
    resumed run sees what the uninterrupted one would."""
    perms: dict[int, np.ndarray] = {}
    out = []
    for g in range(step * batch, (step + 1) * batch):
        epoch, pos = divmod(g, n)
        if epoch not in perms:
            perms[epoch] = np.random.default_rng([seed, epoch]).permutation(n)
        out.append(int(perms[epoch][pos]))
    return out


# ------------------------------------------------------------------------------ the loss
def preference_loss(policy, cfg: DPOConfig, ex: Examples, ref: torch.Tensor):
    """The configured loss of one micro-batch (`ref`: its `(m, 2)` reference log-probs)."""
    logp, nll = sequence_logps(policy, ex.sources, ex.texts)
    ref = ref.to(logp.device)
    if PREFERENCE_LOSSES.spec(cfg.loss_type).paired:
        out = dpo_loss(logp[:, 0], logp[:, 1], ref[:, 0], ref[:, 1], cfg.beta, cfg.loss_type, cfg.label_smoothing)
    else:
        desirable = torch.tensor(ex.desirable, device=logp.device)
        out = kto_loss(logp[:, 0], ref[:, 0], desirable, logp[:, 1], ref[:, 1], cfg.beta,
                       cfg.desirable_weight, cfg.undesirable_weight, cfg.loss_type)
    loss = out.loss + cfg.nll_loss_coef * nll if cfg.nll_loss_coef > 0 else out.loss
    return loss, {**out.metrics, "nll/chosen": float(nll.detach())}


# ------------------------------------------------------------------------------ the run
def train_dpo(cfg: DPOConfig):
    """Train to `max_steps` (or `max_minutes`) with checkpoints and dev evaluation as configured."""
    from asr_rl.trainer.run.setup import make_logger, setup_run
    from asr_rl.trainer.run.step_end import StepEnd
    from asr_rl.trainer.update.strategy import LocalStrategy

    audio = _is_audio(cfg)
    ex = load_examples(cfg, audio)  # a bad preference file is refused before any model loads
    with setup_run(cfg) as ctx:
        policy = _load(cfg, ctx.device, audio)
        strategy = LocalStrategy.from_config([p for _, p in policy.trainable_parameters()], cfg.optim, cfg.max_steps)
        step, ref = 0, None
        if ctx.resume_from is not None:
            state = load_state(ctx.resume_from)
            restore_policy_weights(policy, ctx.resume_from, state.get("policy"))
            strategy.load_state_dict(state["optimizer"])
            set_rng_state(state["rng"])
            step, ref = int(state["step"]), state["reference_logps"]
        if audio:
            encode_examples(policy, ex, cfg.micro_train_batch_size)
        if ref is None:
            t0 = time.perf_counter()
            ref = reference_logps(policy, ex, cfg.micro_train_batch_size)
            log.info("reference log-probs of %d examples in %.1f s", len(ex), time.perf_counter() - t0)
        end = StepEnd(cfg, make_logger(cfg, ctx, resume_step=step), step, cfg.loss_type)
        evaluate = None
        if audio and cfg.eval_manifest:
            from asr_rl.evaluation.during_training import evaluate_during_training

            evaluate = functools.partial(evaluate_during_training, policy, cfg.eval_manifest, cfg.eval)

        def save(step: int) -> None:
            state = {"step": step, "optimizer": strategy.state_dict(), "rng": rng_state(), "reference_logps": ref,
                     "policy": policy_resume_weights(policy)}
            save_checkpoint(ctx.output_dir, step, policy.save_pretrained, state, cfg.max_ckpt_num)

        while step < cfg.max_steps:
            t0 = time.perf_counter()
            metrics = _update(policy, strategy, cfg, ex, ref, batch_indices(len(ex), cfg.train_batch_size, step, cfg.seed))
            step += 1
            metrics.update({"lr": strategy.lr, "epoch": step * cfg.train_batch_size / len(ex)})
            if end(step, metrics, t0, functools.partial(save, step), evaluate):
                break
        end.close()
        return save_final(ctx.output_dir, policy.save_pretrained)


def _update(policy, strategy, cfg: DPOConfig, ex: Examples, ref: torch.Tensor, idx: list[int]) -> dict:
    """One optimiser step over the batch `idx`, accumulated over micro-batches."""
    from asr_rl.trainer.update.ppo import TrainingDiverged

    policy.train()
    micro = cfg.micro_train_batch_size
    sums: dict[str, float] = {}
    for k in range(0, len(idx), micro):
        part = idx[k:k + micro]
        loss, m = preference_loss(policy, cfg, ex.take(part), ref[part])
        if not torch.isfinite(loss):
            raise TrainingDiverged(f"{cfg.loss_type} loss is {float(loss)} ({m}); stopping. The last checkpoint is "
                                   "intact: lower the learning rate or beta")
        strategy.backward(loss * len(part) / len(idx), last=k + micro >= len(idx))
        for name, v in m.items():
            sums[name] = sums.get(name, 0.0) + v * len(part) / len(idx)
    return {**sums, "grad_norm": strategy.step()}


def _is_audio(cfg: DPOConfig) -> bool:
    """Whether `pretrain` is an audio-LLM (else a text causal LM), read from its config alone."""
    from asr_rl.models.families import is_audio_llm
    from asr_rl.models.weights import read_model_config

    if not cfg.pretrain:
        raise ValueError("`pretrain` is not set: give the starting model folder (e.g. an SFT run's final)")
    return is_audio_llm(read_model_config(cfg.pretrain).model_type)


def _load(cfg: DPOConfig, device: str, audio: bool):
    """The audio policy (encoder frozen) or a text causal LM."""
    if audio:
        from asr_rl.models.loading import load_policy

        return load_policy(cfg.pretrain, cfg.model, device, cfg.data.sample_rate, freeze_encoder=True)
    from asr_rl.models.text_policy import load_text_policy

    return load_text_policy(cfg.pretrain, cfg.model, device, cfg.data)


__all__ = ["DPOConfig", "Examples", "train_dpo", "load_examples", "reference_logps", "sequence_logps",
           "preference_loss", "batch_indices"]
