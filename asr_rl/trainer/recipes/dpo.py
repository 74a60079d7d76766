"""`asr-rl train dpo` and `asr-rl train kto`: preference training of an audio or text policy.

Audio pairs (`train_manifest=`, data/pairs.py) are usually a model's own N-best lists scored by the
reward (`asr-rl data pairs`). The frozen encoder runs once per utterance for the whole run (the
encoder cache), and both responses of a pair share that prompt. The reference is the starting
policy itself: its log-probs are computed once, before the first update, and kept in the
checkpoints, so no second model is held. The math is trainer/preference_losses.py.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm import tqdm

from asr_rl.config import RunConfig
from asr_rl.settings import setting
from asr_rl.trainer.run.checkpoint import (load_state, policy_resume_weights, restore_policy_weights, rng_state,
                                      save_checkpoint, save_final, set_rng_state)
from asr_rl.trainer.config import EvalConfig, ModelConfig
from asr_rl.algos.preference_losses import PREFERENCE_LOSSES, dpo_loss, kto_loss

log = logging.getLogger("asr_rl.dpo")


@dataclass(frozen=True)
class DPOConfig(RunConfig):
    """Attributes:
        loss_type: `sigmoid` (DPO), `ipo`, `hinge` (the preference-loss registry) or `kto`.
        beta: strength of the implicit KL to the reference (OpenRLHF/TRL `beta`).
        label_smoothing: conservative DPO's label-flip probability (sigmoid only).
        desirable_weight: KTO's weight of desirable examples.
        undesirable_weight: KTO's weight of undesirable examples.
        nll_loss_coef: + coef x the chosen response's token-mean cross-entropy (OpenRLHF
            `--nll_loss_coef`); keeps the chosen transcripts likely, not only likelier than the
            rejected ones.
        train_batch_size: pairs (KTO: examples) per optimiser step.
        micro_train_batch_size: pairs per forward/backward.
        learning_rate, weight_decay, adam_betas, lr_warmup_ratio, min_lr_ratio, max_norm: AdamW and
            its warmup/cosine schedule, as in SFT.
    """

    loss_type: str = "sigmoid"
    beta: float = setting(0.1, gt=0)
    label_smoothing: float = setting(0.0, ge=0, lt=0.5)
    desirable_weight: float = setting(1.0, ge=0)
    undesirable_weight: float = setting(1.0, ge=0)
    nll_loss_coef: float = setting(0.0, ge=0)
    max_steps: int = setting(200, ge=1)
    train_batch_size: int = setting(8, ge=1)
    micro_train_batch_size: int = setting(8, ge=1)
    learning_rate: float = setting(5e-7, gt=0)
    weight_decay: float = setting(0.0, ge=0)
    adam_betas: tuple[float, ...] = setting((0.9, 0.95), ge=0, lt=1)
    lr_warmup_ratio: float = setting(0.03, ge=0, lt=1)
    min_lr_ratio: float = setting(0.1, ge=0, le=1)
    max_norm: float = setting(1.0, gt=0)
    model: ModelConfig = field(default_factory=ModelConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        if self.loss_type != "kto":
            PREFERENCE_LOSSES.check(self.loss_type)
        if self.train_batch_size % self.micro_train_batch_size:
            raise ValueError(f"train_batch_size {self.train_batch_size} is not a multiple of "
                             f"micro_train_batch_size {self.micro_train_batch_size}")


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
    logp = policy.logprobs(embeds, mask, responses, n=k)  # (B*k, T), 0 at padding
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
    if cfg.loss_type != "kto":
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
    if cfg.loss_type == "kto":
        desirable = torch.tensor(ex.desirable, device=logp.device)
        out = kto_loss(logp[:, 0], ref[:, 0], desirable, logp[:, 1], ref[:, 1], cfg.beta,
                       cfg.desirable_weight, cfg.undesirable_weight)
    else:
        out = dpo_loss(logp[:, 0], logp[:, 1], ref[:, 0], ref[:, 1], cfg.beta, cfg.loss_type, cfg.label_smoothing)
    loss = out.loss + cfg.nll_loss_coef * nll if cfg.nll_loss_coef > 0 else out.loss
    return loss, {**out.metrics, "nll/chosen": float(nll.detach())}


# ------------------------------------------------------------------------------ the run
def train_dpo(cfg: DPOConfig):
    """Train to `max_steps` (or `max_minutes`) with checkpoints and dev evaluation as configured."""
    from asr_rl.trainer.run.setup import make_logger, setup_run
    from asr_rl.trainer.strategy import LocalStrategy

    ctx = setup_run(cfg)
    policy, audio = _load(cfg, ctx.device)
    ex = load_examples(cfg, audio)
    strategy = LocalStrategy([p for _, p in policy.trainable_parameters()], cfg.learning_rate, cfg.weight_decay,
                             cfg.adam_betas, cfg.max_norm, cfg.max_steps, cfg.lr_warmup_ratio, cfg.min_lr_ratio)
    step, ref = 0, None
    if ctx.resume_from is not None:
        state = load_state(ctx.resume_from)
        restore_policy_weights(policy, ctx.resume_from, state.get("policy"))
        strategy.load_state_dict(state["optimizer"])
        set_rng_state(state["rng"])
        step, ref = int(state["step"]), state["reference_logps"]
    if ref is None:
        t0 = time.perf_counter()
        ref = reference_logps(policy, ex, cfg.micro_train_batch_size)
        log.info("reference log-probs of %d examples in %.1f s", len(ex), time.perf_counter() - t0)
    logger = make_logger(cfg, ctx, resume_step=step)
    start, bar = time.perf_counter(), tqdm(total=cfg.max_steps, initial=step, desc=cfg.loss_type,
                                           disable=not cfg.logging.progress_bar)
    while step < cfg.max_steps:
        t0 = time.perf_counter()
        metrics = _update(policy, strategy, cfg, ex, ref, batch_indices(len(ex), cfg.train_batch_size, step, cfg.seed))
        step += 1
        metrics.update({"lr": strategy.lr, "epoch": step * cfg.train_batch_size / len(ex),
                        "time/step": time.perf_counter() - t0, "time/elapsed_min": (time.perf_counter() - start) / 60})
        out_of_time = 0 < cfg.max_minutes <= metrics["time/elapsed_min"]
        last = step >= cfg.max_steps or out_of_time
        if last or (cfg.save_steps > 0 and step % cfg.save_steps == 0):  # saved before evaluating
            state = {"step": step, "optimizer": strategy.state_dict(), "rng": rng_state(), "reference_logps": ref,
                     "policy": policy_resume_weights(policy)}
            save_checkpoint(ctx.output_dir, step, policy.save_pretrained, state, cfg.max_ckpt_num)
        if audio and cfg.eval_manifest and (last or (cfg.eval_steps > 0 and step % cfg.eval_steps == 0)):
            from asr_rl.trainer.recipes.sft import evaluate_during_training

            metrics.update(evaluate_during_training(policy, cfg.eval_manifest, cfg.eval))
        logger.log(step, metrics)
        bar.update(1)
        if out_of_time:
            log.info("max_minutes %.1f reached at step %d", cfg.max_minutes, step)
            break
    bar.close()
    logger.close()
    return save_final(ctx.output_dir, policy.save_pretrained)


def _update(policy, strategy, cfg: DPOConfig, ex: Examples, ref: torch.Tensor, idx: list[int]) -> dict:
    """One optimiser step over the batch `idx`, accumulated over micro-batches."""
    from asr_rl.trainer.rl.actor import TrainingDiverged

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


def _load(cfg: DPOConfig, device: str):
    """(policy, is_audio): the audio policy (encoder frozen) or a text causal LM, by the folder."""
    from asr_rl.models.families import is_audio_llm
    from asr_rl.models.weights import read_model_config

    if not cfg.pretrain:
        raise ValueError("`pretrain` is not set: give the starting model folder (e.g. an SFT run's final)")
    if is_audio_llm(read_model_config(cfg.pretrain).model_type):
        from asr_rl.models.loading import load_policy

        return load_policy(cfg.pretrain, cfg.model, device, cfg.data.sample_rate, freeze_encoder=True), True
    from asr_rl.models.text_policy import load_text_policy

    return load_text_policy(cfg.pretrain, cfg.model, device, cfg.data), False


__all__ = ["DPOConfig", "Examples", "train_dpo", "load_examples", "reference_logps", "sequence_logps",
           "preference_loss", "batch_indices"]
