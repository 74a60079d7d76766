"""What a reward term that reads its group (`TermSpec.min_group_size`) and a grouped policy loss
(`PolicyLossSpec.grouped`, e.g. `mwer`, which renormalises over each prompt's whole group) refuse
at config load; the update's order of sequences, in which
minibatches and micro-batches hold whole groups, is trainer/update/group_loss.py.

Choice: micro-batches smaller than a group (or not a multiple of it) are refused at load rather
than rounded up, so that `micro_train_batch_size` keeps meaning the memory a forward takes. On the
Ray backend each rank already gets whole groups (`Backend.group_multiple`, `subset_groups`).
"""
from __future__ import annotations

from asr_rl.algos.advantages import ADVANTAGE_ESTIMATORS
from asr_rl.algos.losses import LOSS_AGG_MODES, POLICY_LOSSES


def check_group_loss(cfg) -> None:
    """ValueError naming the settings to change when `cfg` (an `RLConfig`) pairs a grouped policy
    loss with what it cannot run with, or an estimator that leaves the baseline to the loss
    (`AdvantageSpec.baseline_in_loss`) with a loss that is not grouped."""
    from asr_rl.rewards.terms import check_group_size

    check_group_size(cfg.reward.terms or (), cfg.rollout.n_samples_per_prompt, "rollout.n_samples_per_prompt")
    a = cfg.algo
    loss, est = POLICY_LOSSES.spec(a.policy_loss), ADVANTAGE_ESTIMATORS.spec(a.advantage_estimator)
    if est.baseline_in_loss and not loss.grouped:
        raise ValueError(f"advantage_estimator={a.advantage_estimator} passes the rewards through and leaves the "
                         f"baseline to a group loss: use policy_loss={'|'.join(POLICY_LOSSES.where(grouped=True))}")
    if not loss.grouped:
        return
    name = f"policy_loss={a.policy_loss}"
    if est.needs_critic:
        raise ValueError(f"{name} weighs whole hypotheses by their risk, and advantage_estimator="
                         f"{a.advantage_estimator} gives a critic's per-token advantages: use advantage_estimator="
                         f"{'|'.join(ADVANTAGE_ESTIMATORS.where(baseline_in_loss=True))} (or a group estimator, "
                         "for a normalised risk)")
    if LOSS_AGG_MODES.spec(a.loss_agg_mode).unit == "token":
        seq = [m for m in LOSS_AGG_MODES if LOSS_AGG_MODES.spec(m).unit != "token"]
        raise ValueError(f"{name} is a mean over groups, and micro-batches of whole groups weigh equally; "
                         f"loss_agg_mode={a.loss_agg_mode} weighs them by their tokens: set algo.loss_agg_mode="
                         f"{'|'.join(seq)}")
    if not loss.ratio and a.rollout_correction:
        raise ValueError(f"{name} has no importance ratio to correct: set algo.rollout_correction=null")
    if a.entropy_token_top_ratio < 1:
        raise ValueError(f"{name} weighs whole hypotheses, not tokens: set algo.entropy_token_top_ratio=1.0")
    if loss.max_sft_coef is not None and a.sft_coef > loss.max_sft_coef:
        raise ValueError(f"{name} takes the cross-entropy on the references only as a small interpolation: "
                         f"algo.sft_coef must be <= {loss.max_sft_coef}, got {a.sft_coef}")
    _check_whole_groups(cfg, name)


def _check_whole_groups(cfg, name: str) -> None:
    r, o, d = cfg.rollout, cfg.optim, cfg.distributed
    g = r.group_size
    rows = "n_samples_per_prompt" if g == r.n_samples_per_prompt else "n_samples_per_prompt + the reference"
    if g < 2:
        raise ValueError(f"{name} renormalises over each prompt's group and needs n_samples_per_prompt >= 2, "
                         f"got {r.n_samples_per_prompt}")
    ranks = d.actor_num_nodes * d.actor_num_gpus_per_node if cfg.backend == "ray" else 1
    bad = [f"micro_train_batch_size {o.micro_train_batch_size}"] if o.micro_train_batch_size % g else []
    if o.train_batch_size and o.train_batch_size % (g * ranks):
        bad.append(f"train_batch_size {o.train_batch_size} ({ranks} policy rank(s))")
    if bad:
        raise ValueError(f"{name} renormalises over each prompt's whole group of {g} rows ({rows}), so every "
                         f"micro-batch and minibatch holds whole groups: {' and '.join(bad)} must be a multiple of "
                         f"{g} per rank")


__all__ = ["check_group_loss"]
