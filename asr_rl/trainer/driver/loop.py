"""The RL loop: rollout -> score -> advantages -> loss -> update -> weight sync, one step at a time.

The same `RLTrainer` drives the local backend (one process) and the Ray backend: it calls only the
roles of roles.py (`encode / submit / collect`, `annotate / train / sync_weights`, the checkpoint
methods) and the reward (rewards/pipeline.py); the math is `asr_rl.algos`.
"""
from __future__ import annotations

import logging
import time
from collections import deque

import torch

from asr_rl.algos.advantages import AdvantageInputs, compute_advantages
from asr_rl.algos.groups import ended_with_eos
from asr_rl.algos.kl import AdaptiveKLController, FixedKLController, reward_kl_penalty
from asr_rl.algos.masked import masked_mean
from asr_rl.algos.off_policy import on_policy_mask
from asr_rl.algos.reward_shaping import REWARD_AGGREGATIONS, LengthPenalties, in_band, shape_rewards
from asr_rl.models.sampling import sequence_seed
from asr_rl.rewards.base import check_output
from asr_rl.trainer.configs.rl import RLConfig
from asr_rl.trainer.driver.roles import Backend
from asr_rl.trainer.rollout.experience import (Experience, Group, add_references, attach_rewards, build_experience,
                                               make_samples, merge_reward_outputs)
from asr_rl.trainer.rollout.refill import KeepRate, RoundPlan
from asr_rl.trainer.run.checkpoint import load_state, rng_state, save_checkpoint, save_final, set_rng_state
from asr_rl.trainer.run.metrics import timer
from asr_rl.trainer.run.step_end import StepEnd

log = logging.getLogger("asr_rl.train")


class RLTrainer:
    """The driver: one `step` after another over a `Backend` (its roles), a reward (the scoring
    role) and a data loader; checkpoints and resume state through the backend's checkpoint role."""

    def __init__(self, cfg: RLConfig, backend: Backend, reward_fn, loader, logger, output_dir, eval_fn=None):
        self.cfg, self.backend, self.reward_fn, self.loader = cfg, backend, reward_fn, loader
        self.logger, self.output_dir, self.eval_fn = logger, output_dir, eval_fn
        a = cfg.algo
        self.kl_ctl = (AdaptiveKLController(a.init_kl_coef, a.kl_target, a.kl_horizon) if a.kl_target
                       else FixedKLController(a.init_kl_coef))
        self.step_no = 0
        self.keep_rate = KeepRate()  # the share of groups dynamic filtering keeps (sizes the rounds)
        # asynchronous rollouts: (batch, rows, handle) of steps to come, submitted to the engines,
        # and the data position before the first of them (what a checkpoint records)
        self._pending: deque = deque()
        self._data_before_pending = None

    # ------------------------------------------------------------------ one RL step
    def step(self) -> dict[str, float]:
        """rollout -> score -> advantages -> loss -> update -> sync (the five stages, timed)."""
        t: dict[str, float] = {}
        # 1-2. rollout and score: n responses per prompt, refilling groups whose rewards tie
        with timer(t, "rollout"):
            groups, stats = self.collect_groups(t)
        self.prefetch()  # asynchronous: the engines generate what comes next while this step trains
        exp = build_experience(groups, self.cfg.rollout.group_size, self.backend.pad_id)
        # 3. log-probs of the old policy / reference, critic values; then advantages
        with timer(t, "logprobs"):
            self.backend.annotate(exp, need_old_logp=self._needs_old_logp(len(exp)))
        with timer(t, "advantages"):
            adv_metrics = self.compute_advantages(exp)
        # 4. loss and update
        with timer(t, "train"):
            train_metrics = self.backend.train(exp, self.step_no + 1, self.kl_ctl.value)
        # 5. the rollout engine gets the new weights
        self.step_no += 1
        with timer(t, "sync"):
            self.backend.sync_weights(self.step_no)
        # the adaptive coefficient follows the KL measured this step: the reward penalty's, or the
        # loss term's (OpenRLHF feeds the actor's KL loss); with no reference there is nothing to follow
        measured = adv_metrics.get("kl/mean", train_metrics.get("kl/loss"))
        if measured is not None:
            self.kl_ctl.update(measured, len(exp))
        reward_log = merge_reward_outputs(groups).log()
        return {**stats, **reward_log, **adv_metrics, **train_metrics, **_response_stats(exp),
                **self.loader.metrics(), "kl/coef": self.kl_ctl.value, **t}

    def collect_groups(self, timings: dict[str, float]) -> tuple[list[Group], dict[str, float]]:
        """`rollout_batch_size` groups, dropping reward ties when dynamic filtering is on."""
        want = self.cfg.rollout.rollout_batch_size
        kept: list[Group] = []
        seen = dropped = rounds = 0
        logs: dict[str, float] = {}
        lags = []
        while len(kept) < want and rounds <= self.cfg.rollout.max_filter_rounds:
            batch, rows, handle = (self._pending.popleft() if rounds == 0 and self._pending
                                   else self.submit(self.step_no, rounds, want - len(kept)))
            samples, version = self.backend.collect(handle)
            lags.append(self.step_no - version)
            groups = self.make_groups(batch.items, rows, samples, version)
            with timer(timings, "reward"):
                for key, value in self.score(groups).items():  # averaged over the refill rounds
                    logs[key] = logs.get(key, 0.0) + value
            self.loader.feedback([g.item for g in groups], [g.rewards for g in groups])  # filtered ones too
            seen += len(groups)
            informative = [g for g in groups if self.keep_group(g)] if self.cfg.dynamic_filtering else groups
            dropped += len(groups) - len(informative)
            self.keep_rate.update(len(informative), len(groups))
            kept += informative
            rounds += 1
        # Data-parallel ranks take whole groups in equal shares: keep a multiple of the rank count
        # (of every actor group's, when the reference or critic has its own).
        multiple = self.backend.group_multiple
        keep = (min(len(kept), want) // multiple) * multiple
        if keep == 0:
            raise RuntimeError(f"dynamic filtering kept {len(kept)} of {seen} groups in {rounds} rounds (every other "
                               f"group's rewards tie), fewer than the {multiple} the ranks need to split them evenly; raise temperature or "
                               "rollout.max_filter_rounds, or set rollout.dynamic_filtering=false")
        return kept[:keep], {"rollout/groups_seen": seen, "rollout/groups_filtered": dropped,
                             "rollout/groups_kept": keep, "rollout/rounds": rounds,
                             "rollout/keep_rate": self.keep_rate.value,
                             "rollout/version_lag": sum(lags) / len(lags),
                             **{f"reward/{k}": v / rounds for k, v in logs.items()}}

    def keep_group(self, group: Group) -> bool:
        """Dynamic filtering: the group's rewards do not all tie, and their mean over the sampled
        members lies inside `rollout.dynamic_filtering_range` when set."""
        sampled = [r for r, off in zip(group.rewards, group.off_policy or [False] * len(group.rewards)) if not off]
        return group.informative and in_band(sum(sampled) / len(sampled), self.cfg.rollout.dynamic_filtering_range)

    def make_groups(self, items: list, rows: list, samples: list, version: int) -> list[Group]:
        """A group per prompt of its samples, and its reference transcript as an off-policy member
        when `rollout.reference_in_group` (rollout.py `add_references`)."""
        groups = [Group(item, row, s.ids, [self.backend.decode(x) for x in s.ids], rollout_logps=s.logps,
                        policy_version=version) for item, row, s in zip(items, rows, samples)]
        if self.cfg.rollout.reference_in_group:
            refs = self.backend.target_ids([u.text for u in items], [u.language for u in items])
            add_references(groups, refs, self.backend.decode)
        return groups

    def submit(self, step: int, round_no: int, need: int | None = None):
        """Draw a batch for `need` groups (default a whole one), encode it and start sampling it
        (seeds of `step` and `round_no`). With dynamic filtering the batch holds as many prompts as
        `need` groups with signal are predicted to take (rollout/refill.py)."""
        r = self.cfg.rollout
        need = r.rollout_batch_size if need is None else need
        if self.cfg.dynamic_filtering and r.max_oversample > 1:
            plan = RoundPlan(need, self.keep_rate.value, r.max_oversample)
            first = max(need, self.backend.group_multiple)  # a prompt for every rank
            batch = self.loader.next_batch(plan.enough, max(plan.max_items, first), first=first)
        else:
            batch = self.loader.next_batch()
        rows = self.backend.encode(batch)
        n = self.cfg.rollout.n_samples_per_prompt
        seeds = [sequence_seed(self.cfg.seed, step, round_no, getattr(item, "id", k), j)
                 for k, item in enumerate(batch.items) for j in range(n)]
        return batch, rows, self.backend.submit(rows, n, seeds)

    def prefetch(self) -> None:
        """Keep `async_queue_size` batches submitted ahead, in the order the synchronous loop draws
        them (each step's first round), so that only the weights they are sampled with differ."""
        r = self.cfg.rollout
        while r.async_enable and len(self._pending) < r.async_queue_size:
            if not self._pending:
                self._data_before_pending = self.loader.state_dict()
            self._pending.append(self.submit(self.step_no + 1 + len(self._pending), 0))

    def score(self, groups: list[Group]) -> dict[str, float]:
        """Rewards onto the groups; returns the reward's extra logs (e.g. a remote server's)."""
        samples = make_samples(groups, self.backend.parse)
        out = check_output(getattr(self.reward_fn, "name", "reward"), self.reward_fn(samples), len(samples))
        attach_rewards(groups, out)
        return out.extra_logs

    def compute_advantages(self, exp: Experience) -> dict[str, float]:
        a = self.cfg.algo
        mask = exp.response_mask
        # the KL estimate needs tokens the policy sampled: a reference member's rows are left out
        kl_penalty, metrics = reward_kl_penalty(exp.old_logp, exp.ref_logp, on_policy_mask(mask, exp.off_policy),
                                                a.kl_estimator, a.kl_clamp, coef=0.0 if a.use_kl_loss else self.kl_ctl.value)
        rewards = self.shape_rewards(exp)
        out = compute_advantages(a.advantage_estimator, AdvantageInputs(
            rewards=rewards, response_mask=mask, group_size=exp.group_size, values=exp.values,
            kl_penalty=kl_penalty, gamma=a.gamma, lambd=a.lambd, eps=a.group_std_eps, std_norm=a.advantage_std_norm,
            whiten_gae=a.normalize_gae_advantages, reward_clip=a.reward_clip_range))
        exp.advantages, exp.returns = out.advantages, out.returns
        metrics["advantages/mean"] = float(masked_mean(exp.advantages, mask))
        metrics["advantages/abs_mean"] = float(masked_mean(exp.advantages.abs(), mask))
        return metrics

    def shape_rewards(self, exp: Experience) -> torch.Tensor:
        """The step's sequence rewards as the estimator takes them (`algos.reward_shaping`)."""
        a, n = self.cfg.algo, len(exp)
        terms = weights = None
        if REWARD_AGGREGATIONS.spec(a.reward_aggregation).per_term:  # e.g. GDPO: each term normalised in its group
            names = self.cfg.reward.terms
            terms = torch.tensor([[0.0 if v is None else v for g in exp.groups for v in g.terms[k]] for k in names])  # None: the term does not apply to that (unlabelled) group
            weights = torch.tensor(list(names.values()))
        sampled = ~exp.off_policy if exp.off_policy is not None else torch.ones(n, dtype=torch.bool)
        penalties = LengthPenalties(self.cfg.rollout.max_new_tokens, a.overlong_buffer_len, a.overlong_penalty_factor,
                                    a.stop_properly_penalty_coef)
        ended = (ended_with_eos(exp.response_ids, exp.response_mask, self.backend.eos_id)
                 if a.stop_properly_penalty_coef is not None else None)
        return shape_rewards(exp.rewards, terms, weights, exp.group_size, a.reward_aggregation, a.group_std_eps,
                             exp.response_mask.sum(dim=-1), sampled, ended, penalties)

    def _needs_old_logp(self, n_seqs: int) -> bool:
        """Old log-probs need a forward pass unless the update is a single on-policy step, or a KL
        penalty in the reward needs them."""
        single = self.cfg.algo.max_epochs == 1 and (self.cfg.optim.train_batch_size or n_seqs) >= n_seqs
        penalty_in_reward = self.cfg.algo.init_kl_coef > 0 and not self.cfg.algo.use_kl_loss
        return not single or penalty_in_reward

    # ------------------------------------------------------------------ the run
    def fit(self) -> None:
        cfg = self.cfg
        end = StepEnd(cfg, self.logger, self.step_no, "rl", postfix="reward/mean")
        if self.eval_fn is not None and cfg.eval_steps > 0 and self.step_no == 0:
            # the start's score on the same dev utterances, so the dev curve begins at the SFT checkpoint
            self.logger.log(0, self.eval_fn())
        while self.step_no < cfg.max_steps:
            start = time.perf_counter()
            metrics = self.step()
            if end(self.step_no, metrics, start, self.save, self.eval_fn):
                break
        end.close()

    def save(self) -> None:
        # batches in flight are drawn again after a resume (sampled then with the resumed weights)
        data = self._data_before_pending if self._pending else self.loader.state_dict()
        # "workers": the key older checkpoints have the backend's state under
        state = {"step": self.step_no, "data": data, "rng": rng_state(),
                 "kl_coef": self.kl_ctl.value, "keep_rate": self.keep_rate.value, "workers": self.backend.state_dict()}
        save_checkpoint(self.output_dir, self.step_no, self.backend.save_model, state, self.cfg.max_ckpt_num,
                        save_state=self.backend.save_engine_state)

    def save_final(self):
        return save_final(self.output_dir, self.backend.save_model)

    def restore(self, ckpt) -> None:
        state = load_state(ckpt)
        self.backend.load_state_dict(state["workers"], ckpt)
        self.loader.load_state_dict(state["data"])
        set_rng_state(state["rng"])
        self.kl_ctl.value = state["kl_coef"]
        self.keep_rate.value = state.get("keep_rate", self.keep_rate.value)  # older checkpoints: none
        self.step_no = int(state["step"])
        self.backend.sync_weights(self.step_no)


def _response_stats(exp: Experience) -> dict[str, float]:
    lengths = exp.response_mask.sum(-1).float()
    return {"response/length_mean": float(lengths.mean()), "response/length_max": float(lengths.max())}


