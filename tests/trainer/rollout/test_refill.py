"""Planning a round of rollouts (trainer/rollout/refill.py): the rule by hand, the loader growing a
round by it, and the samplers' counts, exclusions and priors."""
from __future__ import annotations

import math

import pytest

from asr_rl.data.batching import BatchLoader, UtteranceSampler
from asr_rl.data.signal_sampler import SignalSampler
from asr_rl.trainer.rollout.refill import KeepRate, RoundPlan, enough

SATURATED, ERRING = [1.0, 1.0, 1.0], [0.0, 0.5, 1.0]


def test_enough_by_hand():
    # 16 prompts at 0.5: mean 8, sd sqrt(16 * 0.25) = 2 -> 6 < 8 (z=1); at z=0 the mean 8 suffices
    assert not enough([None] * 16, 8, keep_rate=0.5)
    assert enough([None] * 16, 8, keep_rate=0.5, z=0.0)
    # 24 at 0.5: 12 - sqrt(6) = 9.55 >= 8
    assert enough([None] * 24, 8, keep_rate=0.5)
    # known priors replace the rate: 8 certain prompts fill 8 (sd 0); one unsure one does not
    assert enough([1.0] * 8, 8, keep_rate=0.1)
    assert not enough([1.0] * 7 + [0.9], 8, keep_rate=1.0)
    # 9 prompts: seven certain, two at 0.75: mean 8.5, sd sqrt(2 * 0.1875) = 0.612 -> 7.89 < 8
    assert 8.5 - math.sqrt(0.375) < 8 and not enough([1.0] * 7 + [0.75, 0.75], 8, keep_rate=1.0)


def test_keep_rate_average_and_floor():
    k = KeepRate(decay=0.5)
    k.update(2, 8)  # 0.5 * 1 + 0.5 * 0.25
    assert k.value == pytest.approx(0.625)
    k.update(0, 8)
    k.update(0, 8)
    k.update(0, 8)
    assert k.value == pytest.approx(0.078125)
    k.update(0, 8)
    assert k.value == k.floor
    k.update(5, 0)  # no round: unchanged
    assert k.value == k.floor


def test_round_plan_bounds():
    assert RoundPlan(8, 0.5, max_factor=3.0).max_items == 24
    assert RoundPlan(3, 0.5, max_factor=1.5).max_items == 5  # ceil(4.5)
    assert RoundPlan(8, 0.5, max_factor=1.0).max_items == 8


def test_loader_grows_a_round_until_enough_and_stops_at_the_cap():
    utts = [f"u{i}" for i in range(40)]
    loader = BatchLoader(utts, 8, seed=0, make_batch=list)
    # keep rate 0.5, need 8: 16 drawn (mean 8 - sd 2 = 6), 18 (9 - 2.12 = 6.88), 20 (10 - 2.24),
    # 22 (11 - 2.35 = 8.65 >= 8): 22 items, grown 2 (batch_size // 4) at a time
    plan = RoundPlan(8, 0.5, max_factor=3.0)
    batch = loader.next_batch(plan.enough, plan.max_items, first=8)
    assert len(batch) == 22 and len(set(batch)) == 22
    # the cap: a rate of 0.05 would need far more than 2 x 8
    plan = RoundPlan(8, 0.05, max_factor=2.0)
    assert len(loader.next_batch(plan.enough, plan.max_items, first=8)) == 16
    # without a plan: one batch
    assert len(loader.next_batch()) == 8


def test_signal_sampler_priors_exclusions_and_epochs():
    s = SignalSampler(6, 2, seed=1, floor=0.1, decay=0.0)
    s.feedback([0, 1], [SATURATED, ERRING])
    assert s.signal_prior([0, 1, 2]) == [0.0, 1.0, None]  # scored items by their score; 2 never scored
    drawn = s.next_indices(4)
    more = s.next_indices(2, exclude=drawn)
    assert len(set(drawn + more)) == 6  # a round never draws an item twice while others remain
    assert s.items_drawn == 6 and s.epoch == 1
    again = s.next_indices(3, exclude=list(range(6)))  # everything excluded: drawn from all again
    assert len(again) == 3
    state = s.state_dict()
    t = SignalSampler(6, 2, seed=1, floor=0.1, decay=0.0)
    t.load_state_dict(state)
    assert t.next_indices(5) == s.next_indices(5) and t.items_drawn == s.items_drawn
    old = {k: v for k, v in state.items() if k != "items_drawn"}  # a state written before the counter
    u = SignalSampler(6, 2, seed=1)
    u.load_state_dict(old)
    assert u.items_drawn == state["draws"] * 2


def test_uniform_sampler_counts_keep_the_epoch_order():
    whole = UtteranceSampler(10, 4, seed=2)
    parts = UtteranceSampler(10, 4, seed=2)
    assert parts.next_indices(3) + parts.next_indices(1) == whole.next_indices()
    assert parts.signal_prior([1, 2]) == [None, None]
    assert len(parts.next_indices(7)) == 7 and parts.epoch == 1  # 6 left in epoch 0: a new epoch
