"""The shared `optim` section builds the optimiser and schedule the same way for every trainer."""
import math

import pytest
import torch

from asr_rl.trainer.strategy import LocalStrategy, OptimConfig


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
