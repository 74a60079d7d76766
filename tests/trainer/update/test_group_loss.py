"""A grouped policy loss (mwer) at config load and in the update: what it refuses, and micro-batches
that hold whole groups."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from asr_rl.config import ConfigError, load_config
from asr_rl.trainer.configs.rl import RLConfig
from asr_rl.algos.losses import LossOutput
from asr_rl.trainer.update.ppo import _epochs
from asr_rl.trainer.update.group_loss import epoch_order
from asr_rl.trainer.rollout.experience import Group, build_experience

MWER = ["rollout.mode=beam", "policy_loss=mwer", "advantage_estimator=mwer", "loss_agg_mode=seq-mean-token-mean"]


def test_an_mwer_config_loads_and_beam_rollouts_need_an_engine_that_declares_beam_search():
    cfg = load_config(RLConfig, None, MWER + ["algo.sft_coef=0.1"])
    assert (cfg.rollout.mode, cfg.algo.policy_loss, cfg.dynamic_filtering) == ("beam", "mwer", True)
    assert load_config(RLConfig, None, []).rollout.mode == "sample"
    # MWER on samples is defined too (the samples' renormalised probabilities)
    assert load_config(RLConfig, None, MWER[1:]).rollout.mode == "sample"
    with pytest.raises(ConfigError, match=r"rollout.mode=beam needs an engine that returns the beam N-best "
                                          r"\(EngineSpec.beam_search: hf\); rollout.engine=vllm has none"):
        load_config(RLConfig, None, MWER + ["rollout.engine=vllm"])
    with pytest.raises(ConfigError, match=r"`rollout.mode` expects .*must be one of 'sample', 'beam'"):
        load_config(RLConfig, None, ["rollout.mode=nbest"])


@pytest.mark.parametrize("overrides, message", [
    (["policy_loss=ppo", "loss_agg_mode=token-mean"],
     r"advantage_estimator=mwer passes the rewards through and leaves the baseline to a group loss: use "
     r"policy_loss=mwer"),
    (["loss_agg_mode=token-mean"], r"policy_loss=mwer is a mean over groups.*loss_agg_mode=token-mean weighs them "
                                   r"by their tokens: set algo.loss_agg_mode=seq-mean-token-mean\|seq-mean-token-sum"),
    (["advantage_estimator=gae"], r"advantage_estimator=gae gives a critic's per-token advantages: use "
                                  r"advantage_estimator=mwer"),
    (["algo.sft_coef=0.2"], r"policy_loss=mwer takes the cross-entropy .* algo.sft_coef must be <= 0.1, got 0.2"),
    (["algo.rollout_correction=tis"], r"policy_loss=mwer has no importance ratio to correct"),
    (["algo.entropy_token_top_ratio=0.2"], r"policy_loss=mwer weighs whole hypotheses, not tokens"),
    # a micro-batch smaller than a group is refused (not rounded up): the renormalisation is over the group
    (["micro_train_batch_size=4"], r"policy_loss=mwer renormalises over each prompt's whole group of 8 rows "
                                   r"\(n_samples_per_prompt\).*micro_train_batch_size 4 must be a multiple of 8"),
    # on Ray, 4 sequences an optimiser step over 2 ranks would give each half a group
    (["n_samples_per_prompt=4", "micro_train_batch_size=4", "train_batch_size=4", "backend=ray"],
     r"train_batch_size 4 \(2 policy rank\(s\)\) must be a multiple of 4 per rank"),
])
def test_a_group_loss_refuses_at_load_what_it_cannot_run_with(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(RLConfig, None, MWER + overrides)


def test_whole_groups_with_the_reference_in_the_group_count_its_row():
    with pytest.raises(ConfigError, match=r"group of 9 rows \(n_samples_per_prompt \+ the reference\)"):
        load_config(RLConfig, None, MWER + ["rollout.reference_in_group=true", "micro_train_batch_size=8",
                                            "rollout_batch_size=8"])


def test_epoch_order_keeps_groups_whole_and_shuffles_them():
    # 4 groups of 3; without shuffling: rows in order
    assert epoch_order(12, 3, seed=0, epoch=0, shuffle=False, whole_groups=True).tolist() == list(range(12))
    # seed 0, epoch 0 permutes 4 groups as [2, 0, 1, 3] (numpy's default_rng([0, 0]).permutation(4))
    assert np.random.default_rng([0, 0]).permutation(4).tolist() == [2, 0, 1, 3]
    assert epoch_order(12, 3, seed=0, epoch=0, shuffle=True, whole_groups=True).tolist() == \
        [6, 7, 8, 0, 1, 2, 3, 4, 5, 9, 10, 11]
    with pytest.raises(ValueError, match="13 rows are not whole groups of 3"):
        epoch_order(13, 3, 0, 0, True, True)
    # not grouped: the sequence permutation the update always used
    assert np.array_equal(epoch_order(12, 3, 1, 0, True, False), np.random.default_rng([1, 0]).permutation(12))


class _Strategy:
    lr = 0.1

    def __init__(self):
        self.steps = 0

    def backward(self, loss, last):
        pass

    def step(self):
        self.steps += 1
        return 0.0

    def mean_over_ranks(self, x):
        return x


def test_the_update_gives_a_grouped_loss_micro_batches_of_whole_groups():
    # group k's two responses are [k + 1] and [k + 1, k + 1]: the first token names the group
    groups = [Group(None, None, [[k + 1], [k + 1, k + 1]], ["a", "b"], rewards=[0.0, 1.0]) for k in range(4)]
    exp = build_experience(groups, 2, pad_id=0)
    seen = []

    def loss_fn(mb):
        seen.append((mb.response_ids[:, 0].tolist(), mb.prompt_index.tolist()))
        return LossOutput(torch.tensor(0.0), {})

    _epochs(exp, 2, 4, 8, 0, _Strategy(), loss_fn, "actor", "seq-mean-token-mean", whole_groups=True)
    # 2 epochs x 2 micro-batches of 4 rows; epoch 0 orders the groups [2, 0, 1, 3] (seed 0, above):
    # micro-batches {2, 0} and {1, 3}, each row with its group's prompt row
    assert len(seen) == 4 and seen[:2] == [([3, 3, 1, 1], [1, 1, 0, 0]), ([2, 2, 4, 4], [0, 0, 1, 1])]
    assert all(sorted(first) == sorted(list(set(first)) * 2) for first, _ in seen)  # every group whole
    with pytest.raises(ValueError, match=r"micro-batches \(3\) and minibatches \(8\) of whole groups of 2"):
        _epochs(exp, 1, 3, 8, 0, _Strategy(), loss_fn, "actor", "seq-mean-token-mean", whole_groups=True)
