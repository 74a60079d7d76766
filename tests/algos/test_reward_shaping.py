"""Length penalties and the dynamic-filtering band, worked out by hand."""
from __future__ import annotations

import pytest
import torch

from asr_rl.algos.reward_shaping import in_band, overlong_penalty, stop_properly


def test_overlong_penalty_ramps_over_the_buffer_before_the_limit():
    # max_new_tokens 10, buffer 4: from 6 tokens on, -(L - 6) / 4 * factor, at most -factor
    lengths = torch.tensor([5, 6, 8, 10])
    assert overlong_penalty(lengths, 10, 4.0).tolist() == [0.0, 0.0, -0.5, -1.0]
    assert overlong_penalty(lengths, 10, 4.0, factor=0.5).tolist() == [0.0, 0.0, -0.25, -0.5]
    with pytest.raises(ValueError, match=r"overlong_buffer_len must be in \(0, max_new_tokens=10\], got 12"):
        overlong_penalty(lengths, 10, 12.0)


def test_stop_properly_scales_or_replaces_the_truncated_rewards():
    rewards, truncated = torch.tensor([1.0, 0.5, -2.0]), torch.tensor([True, False, True])
    assert stop_properly(rewards, truncated, 0.5).tolist() == [0.5, 0.5, -1.0]
    assert stop_properly(rewards, truncated, -0.5).tolist() == [-0.5, 0.5, -0.5]
    assert stop_properly(rewards, truncated, 0.0).tolist() == [0.0, 0.5, 0.0]
    with pytest.raises(ValueError, match="must be in \\[0, 1\\] \\(a scale\\) or < 0"):
        stop_properly(rewards, truncated, 1.5)


def test_dynamic_filtering_band_is_open():
    assert [in_band(m, (0.0, 1.0)) for m in (0.0, 0.5, 1.0)] == [False, True, False]
    assert in_band(7.0, None)
