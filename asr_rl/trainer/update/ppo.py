"""The policy and critic updates of one rank: PPO epochs over micro-batches of an `Experience`.

Backend-independent: a `strategy` (plain torch or DeepSpeed) applies the gradients, and the math
comes from the `losses` registry. The Ray backend calls these same functions inside its actors.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from asr_rl.models.audio_policy import Responses
from asr_rl.trainer.configs.rl import AlgoConfig
from asr_rl.algos.losses import (LOSS_AGG_MODES, POLICY_LOSSES, LossOutput, agg_count, compute_policy_loss,
                                 entropy_loss, kl_loss, masked_mean, value_loss)
from asr_rl.algos.groups import ended_with_eos
from asr_rl.trainer.update.group_loss import epoch_order
from asr_rl.algos.entropy_tokens import high_entropy_tokens
from asr_rl.algos.off_policy import on_policy_mask
from asr_rl.trainer.rollout.experience import Experience, MicroBatch
from asr_rl.algos.rollout_correction import mismatch_metrics, rollout_correction


class TrainingDiverged(FloatingPointError):
    """A NaN/inf loss: the run stops before the update, keeping its last checkpoint."""


def micro_logprobs(policy, mb: MicroBatch, temperature: float, with_entropy: bool = False, prompts=None):
    """Log-probs `(m, T)` (and entropy) of the micro-batch's responses under `policy`; `prompts` is
    `policy.embed_rows(mb.prompt_rows)` when the caller already has it."""
    embeds, mask = prompts if prompts is not None else policy.embed_rows(mb.prompt_rows)
    responses = Responses(mb.response_ids.to(embeds.device), mb.response_mask.to(embeds.device), [])
    return policy.logprobs(embeds, mask, responses, mb.prompt_index, temperature=temperature,
                           with_entropy=with_entropy)


@torch.no_grad()
def forward_logprobs(policy, exp: Experience, micro_size: int, temperature: float) -> torch.Tensor:
    """Log-probs `(N, T)` of all responses, without grad (old policy or reference)."""
    out = [micro_logprobs(policy, exp.select(list(range(s, min(s + micro_size, len(exp))))), temperature)
           for s in range(0, len(exp), micro_size)]
    return torch.cat([o.cpu() for o in out], dim=0)


@torch.no_grad()
def forward_values(critic, exp: Experience, micro_size: int) -> torch.Tensor:
    out = []
    for s in range(0, len(exp), micro_size):
        mb = exp.select(list(range(s, min(s + micro_size, len(exp)))))
        out.append(critic.values(mb.prompt_rows, mb.prompt_index, Responses(mb.response_ids, mb.response_mask, [])).cpu())
    return torch.cat(out, dim=0)


def actor_loss(policy, mb: MicroBatch, algo: AlgoConfig, temperature: float, kl_coef: float) -> LossOutput:
    """Policy loss (+ KL loss - entropy bonus) of one micro-batch; the policy loss aggregated by
    `algo.loss_agg_mode`, the KL and entropy terms by `algo.term_agg_mode` (`LossOutput.parts`)."""
    prompts = policy.embed_rows(mb.prompt_rows)  # shared by the policy loss and the CE term
    logp, entropy = micro_logprobs(policy, mb, temperature, with_entropy=True, prompts=prompts)
    mask = mb.response_mask.to(logp.device)
    off = mb.off_policy.to(logp.device) if mb.off_policy is not None else None
    on = on_policy_mask(mask, off)  # sampled tokens: the KL estimate and the rollout correction hold there only
    # On-policy shortcut: with one update per rollout the old policy is the current one.
    old = mb.old_logp.to(logp.device) if mb.old_logp is not None else logp.detach()
    low, high = algo.eps_clip_low_high or (algo.eps_clip, algo.eps_clip)
    weights, rollout_logp, corr_metrics = _rollout_correction(mb, old, on, algo)
    advantages, token_metrics = _entropy_tokens(mb.advantages.to(logp.device), entropy, mask, algo)
    out = compute_policy_loss(algo.policy_loss, logp, old, advantages, mask, eps_clip_low=low, eps_clip_high=high,
                              dual_clip=algo.dual_clip, loss_agg_mode=algo.loss_agg_mode, rollout_weights=weights,
                              rollout_logp=rollout_logp, off_policy=off,
                              group_index=mb.prompt_index.to(logp.device),  # a group is a prompt's rows
                              ended=ended_with_eos(mb.response_ids, mb.response_mask, policy.eos_id).to(logp.device))
    metrics = {**out.metrics, **corr_metrics, **token_metrics}
    # a grouped loss is a mean over the micro-batch's whole groups, all of one size: it weighs by rows
    policy_mode = "seq-mean-token-sum" if POLICY_LOSSES.spec(algo.policy_loss).grouped else algo.loss_agg_mode
    term_mode = algo.term_agg_mode
    terms = torch.zeros((), device=logp.device)  # the KL and entropy terms, aggregated by `term_mode`
    if algo.use_kl_loss and mb.ref_logp is not None:
        # measured even at coefficient 0: the adaptive controller and the logs read it
        kl = kl_loss(logp, mb.ref_logp.to(logp.device), on, algo.kl_estimator, term_mode, algo.kl_clamp,
                     old_logp=old, unbiased_gradient=algo.kl_unbiased_gradient)
        if kl_coef > 0:
            terms = terms + kl_coef * kl.loss
        metrics.update(kl.metrics)
    ent = entropy_loss(entropy, mask, term_mode)
    if algo.entropy_coef:
        terms = terms - algo.entropy_coef * ent
    metrics["policy/entropy"] = float(ent.detach())
    parts = {policy_mode: out.loss}
    parts[term_mode] = parts.get(term_mode, 0.0) + terms
    aux = None
    if algo.sft_coef > 0:  # a mean over reference tokens, not over response tokens: kept apart
        ce = reference_ce(policy, mb, prompts)
        aux = algo.sft_coef * ce
        metrics["actor/sft_ce"] = float(ce.detach())
    return LossOutput(sum(parts.values()), metrics, aux, parts)


def _entropy_tokens(advantages: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor, algo: AlgoConfig):
    """(advantages, metrics): with `algo.entropy_token_top_ratio` < 1, the advantages of all but the
    micro-batch's highest-entropy tokens set to 0, so only those carry a gradient (arXiv:2506.01939;
    algos/entropy_tokens.py); the loss keeps its normaliser over every token, as the paper's."""
    if algo.entropy_token_top_ratio >= 1:
        return advantages, {}
    keep = high_entropy_tokens(entropy, mask, algo.entropy_token_top_ratio)
    share = float(keep.sum()) / max(1.0, float(mask.bool().sum()))
    return torch.where(keep, advantages, torch.zeros_like(advantages)), {"policy/entropy_tokens_kept": share}


def _rollout_correction(mb: MicroBatch, old: torch.Tensor, mask: torch.Tensor, algo: AlgoConfig):
    """(weights, engine log-probs, metrics) of the rollout/trainer mismatch correction: the
    mismatch is logged whenever the engine's log-probs are known; weights only with a correction on."""
    if mb.rollout_logp is None:
        if algo.rollout_correction:
            raise ValueError(f"algo.rollout_correction={algo.rollout_correction} needs the rollout engine's "
                             "log-probs, and this experience has none")
        return None, None, {}
    rollout_logp = mb.rollout_logp.to(old.device)
    metrics = mismatch_metrics(old, rollout_logp, mask)
    if not algo.rollout_correction:
        return None, None, metrics
    corr = rollout_correction(algo.rollout_correction, old, rollout_logp, mask, algo.rollout_correction_threshold)
    return corr.weights, rollout_logp, {**metrics, **corr.metrics}


def reference_ce(policy, mb: MicroBatch, prompts=None) -> torch.Tensor:
    """Token-mean cross-entropy of the reference transcripts of the micro-batch's utterances (one per
    prompt row, whatever the number of its samples in the micro-batch), teacher-forced."""
    embeds, mask = prompts if prompts is not None else policy.embed_rows(mb.prompt_rows)
    targets = policy.target_ids([u.text for u in mb.items], [u.language for u in mb.items])
    targets = Responses(targets.ids.to(embeds.device), targets.mask.to(embeds.device), [])
    logits = policy.response_logits(embeds, mask, targets)
    keep = targets.mask.bool()
    return F.cross_entropy(logits[keep], targets.ids[keep])


def ppo_update(policy, strategy, exp: Experience, algo: AlgoConfig, micro_size: int, train_size: int,
               temperature: float, kl_coef: float, seed: int) -> dict[str, float]:
    """`max_epochs` passes over `exp` in shuffled minibatches of `train_size` sequences, each an
    optimiser step accumulated over micro-batches of `micro_size`."""
    return _epochs(exp, algo.max_epochs, micro_size, train_size, seed, strategy,
                   lambda mb: actor_loss(policy, mb, algo, temperature, kl_coef), prefix="actor",
                   loss_agg_mode=algo.loss_agg_mode, whole_groups=POLICY_LOSSES.spec(algo.policy_loss).grouped)


def critic_update(critic, strategy, exp: Experience, algo: AlgoConfig, micro_size: int, train_size: int,
                  seed: int) -> dict[str, float]:
    def loss_fn(mb: MicroBatch) -> LossOutput:
        values = critic.values(mb.prompt_rows, mb.prompt_index, Responses(mb.response_ids, mb.response_mask, []))
        return value_loss(values, mb.values, mb.returns, mb.response_mask, value_clip=algo.value_clip,
                          loss_agg_mode=algo.term_agg_mode)
    return _epochs(exp, algo.max_epochs, micro_size, train_size, seed, strategy, loss_fn, prefix="critic",
                   loss_agg_mode=algo.term_agg_mode)


def _epochs(exp: Experience, epochs: int, micro_size: int, train_size: int, seed: int, strategy, loss_fn,
            prefix: str, loss_agg_mode: str = "token-mean", whole_groups: bool = False) -> dict[str, float]:
    """With `whole_groups` (a grouped loss) every minibatch and micro-batch holds whole groups."""
    if whole_groups and (micro_size % exp.group_size or train_size % exp.group_size):
        raise ValueError(f"a grouped loss needs micro-batches ({micro_size}) and minibatches ({train_size}) of whole "
                         f"groups of {exp.group_size}")
    sums: dict[str, float] = {}
    n_micro_total, grad_norms = 0, []
    for epoch in range(epochs):
        order = epoch_order(len(exp), exp.group_size, seed, epoch, epochs > 1, whole_groups)
        for start in range(0, len(exp), train_size):
            mini = order[start:start + train_size].tolist()
            if not whole_groups:  # the minibatch's gradient is a sum over its rows in any order; sorted,
                mini.sort()       # a micro-batch holds runs of a group, whose prompt then runs once
            micros = [mini[k:k + micro_size] for k in range(0, len(mini), micro_size)]
            # every mode's weights, whichever the loss parts use: the all-reduces run in one order on every rank
            weights = {mode: micro_weights([exp.response_mask[idx] for idx in micros], mode, strategy)
                       for mode in LOSS_AGG_MODES}
            for k, idx in enumerate(micros):
                out = loss_fn(exp.select(idx))
                if not torch.isfinite(out.loss) or (out.aux is not None and not torch.isfinite(out.aux)):
                    # stop before the bad gradient reaches the weights: the last checkpoint stays good
                    raise TrainingDiverged(f"{prefix} loss is {float(out.loss.detach())} ({out.metrics}); stopping. The last "
                                           "checkpoint is intact: lower the learning rate or check the rewards")
                parts = out.parts if out.parts is not None else {loss_agg_mode: out.loss}
                total = sum(part * weights[mode][k] for mode, part in parts.items())
                if out.aux is not None:
                    total = total + out.aux / len(micros)
                strategy.backward(total, last=k == len(micros) - 1)
                for name, v in {f"{prefix}/loss": float(out.loss.detach()), **out.metrics}.items():
                    sums[name] = sums.get(name, 0.0) + float(v)
                n_micro_total += 1
            grad_norms.append(strategy.step())
    metrics = {k: v / max(n_micro_total, 1) for k, v in sums.items()}
    metrics.update({f"{prefix}/grad_norm": float(np.mean(grad_norms)), f"{prefix}/lr": strategy.lr,
                    f"{prefix}/optimizer_steps": len(grad_norms)})
    return metrics


def micro_weights(masks: list[torch.Tensor], loss_agg_mode: str, strategy) -> list[float]:
    """What each micro-batch's loss, aggregated by `loss_agg_mode`, is multiplied by, so that the
    optimiser step's gradient is that of the loss aggregated over all its micro-batches on all
    data-parallel ranks (OpenRLHF 0.11.2 `iter_grad_accum_global_norm`, verl `loss_agg_mode`).

    Micro-batch i holding c_i of the mode's units (`agg_count`: tokens, non-empty sequences or rows)
    weighs c_i / (C / W), C the units of all W ranks' micro-batches (DeepSpeed then averages the
    ranks' gradients, dividing by W). Averaging the micro-batches' own means instead would weigh
    the units of a sparse micro-batch (few tokens, or few sequences after filtering) more.

    Args:
        masks: the ``(m_i, T)`` response masks of this rank's micro-batches of one optimiser step.
        loss_agg_mode: a name in `LOSS_AGG_MODES`.
        strategy: its `mean_over_ranks` all-reduces (every rank calls it together).
    """
    counts = [agg_count(loss_agg_mode, m) for m in masks]
    per_rank = strategy.mean_over_ranks(sum(counts))
    return [c / per_rank if per_rank > 0 else 0.0 for c in counts]


__all__ = ["TrainingDiverged", "micro_weights", "micro_logprobs", "reference_ce", "forward_logprobs", "forward_values", "actor_loss", "ppo_update", "critic_update",
           "masked_mean"]
