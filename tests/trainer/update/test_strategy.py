"""The shared `optim` section builds the optimiser and schedule the same way for every trainer."""
import math

import pytest
import torch

from asr_rl.trainer.configs.optim import OptimConfig
from asr_rl.trainer.update.strategy import LocalStrategy


def _lrs(cfg: OptimConfig, total: int) -> list[float]:
    w = torch.nn.Parameter(torch.ones(2, 2))
    strategy = LocalStrategy.from_config([w], cfg, total)
    lrs = []
    for _ in range(total):
        lrs.append(strategy.lr)
        w.grad = torch.zeros_like(w)
        strategy.step()
    return lrs


def test_warmup_then_cosine_to_the_floor_by_hand():
    # 10 steps, warmup ceil(0.2 * 10) = 2: factors 1/3, 2/3, then 0.1 + 0.9 * (1 + cos(pi * k / 8)) / 2
    lrs = _lrs(OptimConfig(learning_rate=1.0, lr_warmup_ratio=0.2, min_lr_ratio=0.1), 10)
    expected = [1 / 3, 2 / 3] + [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k / 8)) for k in range(8)]
    assert lrs == pytest.approx(expected)


def test_constant_with_warmup_stays_at_the_peak():
    lrs = _lrs(OptimConfig(learning_rate=0.5, lr_warmup_ratio=0.2, lr_scheduler="constant_with_warmup"), 10)
    assert lrs[:2] == pytest.approx([0.5 / 3, 1.0 / 3]) and lrs[2:] == [0.5] * 8


def test_from_config_takes_the_section_and_an_explicit_peak_rate():
    weight, bias = torch.nn.Parameter(torch.ones(2, 2)), torch.nn.Parameter(torch.ones(2))
    frozen = torch.nn.Parameter(torch.ones(1), requires_grad=False)
    cfg = OptimConfig(learning_rate=0.3, adam_betas=(0.8, 0.9), adam_eps=1e-6, weight_decay=0.05, max_norm=2.0,
                      lr_warmup_ratio=0.0)
    strategy = LocalStrategy.from_config([weight, bias, frozen], cfg, total_steps=4)
    decay, no_decay = strategy.optimizer.param_groups
    assert decay["params"] == [weight] and no_decay["params"] == [bias]  # the frozen one is left out
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.05, 0.0)
    assert (decay["lr"], decay["betas"], decay["eps"], strategy.max_norm) == (0.3, (0.8, 0.9), 1e-6, 2.0)
    # RL gives the actor's or the critic's rate
    assert LocalStrategy.from_config([weight], cfg, 4, lr=0.01).optimizer.param_groups[0]["lr"] == 0.01


def test_warmup_stable_decay_by_hand():
    # 10 steps, warmup ceil(0.2 * 10) = 2, decay the last ceil(0.4 * 10) = 4, floor 0.1: factors 1/3,
    # 2/3, the peak for 4 steps, then linear 0.1 + 0.9 * (1 - j / 4) for j = 1..4: the last step at the floor
    cfg = OptimConfig(learning_rate=1.0, lr_warmup_ratio=0.2, lr_scheduler="warmup_stable_decay", lr_decay_ratio=0.4,
                      lr_decay_style="linear", min_lr_ratio=0.1)
    assert _lrs(cfg, 10) == pytest.approx([1 / 3, 2 / 3, 1, 1, 1, 1, 0.775, 0.55, 0.325, 0.1])
    cosine = _lrs(OptimConfig(learning_rate=2.0, lr_warmup_ratio=0.2, lr_scheduler="warmup_stable_decay",
                              lr_decay_ratio=0.4, min_lr_ratio=0.1), 10)
    assert cosine == pytest.approx([2 / 3, 4 / 3, 2, 2, 2, 2] + [2 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * j / 4)))
                                                               for j in range(1, 5)])
    assert cosine[-1] == pytest.approx(0.2)


def test_a_decay_begun_early_anneals_from_the_rate_of_the_last_step_and_survives_a_resume():
    # WSD over 20 steps (no warmup, decay planned for the last 4): after step 5, decay over 3 steps:
    # linear from the peak 1.0 to 0.1: 0.7, 0.4, then the floor, which it keeps
    cfg = OptimConfig(learning_rate=1.0, lr_warmup_ratio=0.0, lr_scheduler="warmup_stable_decay", lr_decay_ratio=0.2,
                      lr_decay_style="linear", min_lr_ratio=0.1)
    w = torch.nn.Parameter(torch.ones(2, 2))
    strategy = LocalStrategy.from_config([w], cfg, 20)
    for _ in range(5):
        w.grad = torch.zeros_like(w)
        strategy.step()
    assert strategy.lr == 1.0
    strategy.decay_now(3)
    assert strategy.lr == pytest.approx(0.7)  # the next step's rate is set at once
    resumed = LocalStrategy.from_config([w], cfg, 20)
    resumed.load_state_dict(strategy.state_dict())
    lrs = []
    for _ in range(5):
        lrs.append(resumed.lr)
        w.grad = torch.zeros_like(w)
        resumed.step()
    assert lrs == pytest.approx([0.7, 0.4, 0.1, 0.1, 0.1])


def test_a_decay_begun_early_on_a_cosine_starts_from_where_the_cosine_is():
    # cosine to 0 over 10 steps: step 5 trained at 0.5 * (1 + cos(pi * 4 / 10)) = 0.6545; a linear decay
    # over 2 steps then gives half of that, then 0
    cfg = OptimConfig(learning_rate=1.0, lr_warmup_ratio=0.0, min_lr_ratio=0.0, lr_decay_style="linear")
    w = torch.nn.Parameter(torch.ones(2, 2))
    strategy = LocalStrategy.from_config([w], cfg, 10)
    for _ in range(5):
        w.grad = torch.zeros_like(w)
        strategy.step()
    strategy.decay_now(2)
    top = 0.5 * (1 + math.cos(math.pi * 4 / 10))
    assert strategy.lr == pytest.approx(top / 2)
    w.grad = torch.zeros_like(w)
    strategy.step()
    assert strategy.lr == pytest.approx(0.0)


def test_warmup_and_decay_longer_than_the_run_are_refused():
    with pytest.raises(ValueError, match="lr_warmup_ratio 0.5 \\+ optim.lr_decay_ratio 0.6 exceed the run"):
        OptimConfig(lr_scheduler="warmup_stable_decay", lr_warmup_ratio=0.5, lr_decay_ratio=0.6)
    assert OptimConfig(lr_warmup_ratio=0.5, lr_decay_ratio=0.6).lr_decay_ratio == 0.6  # only WSD decays by it
