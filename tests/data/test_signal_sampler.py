"""The signal sampler: weights from the groups' reward variance, a floor for saturated utterances,
logs, and exact resume."""
from __future__ import annotations

import io
import math

import pytest
import torch

from asr_rl.config import ConfigError, load_config
from asr_rl.data.batching import BatchLoader, UtteranceSampler
from asr_rl.data.signal_sampler import RLDataConfig, SignalSampler, build_sampler, group_signal

SATURATED, ERRING = [1.0, 1.0, 1.0, 1.0], [0.2, 0.5, 0.5, 1.0]


def test_score_weight_and_logs_by_hand():
    # item 0: saturated, signal, saturated with decay 0.5 from 1: 0.5, 0.75, 0.375;
    # weight 0.1 + 0.9 * 0.375 = 0.4375; item 1 never scored: weight 1
    s = SignalSampler(2, 1, floor=0.1, decay=0.5)
    for rewards in (SATURATED, ERRING, SATURATED):
        s.feedback([0], [rewards])
    assert s.scores.tolist() == [0.375, 1.0]
    assert s.weights().tolist() == pytest.approx([0.4375, 1.0])
    assert s.metrics() == pytest.approx({"sampler/saturated_share": 0.5,  # item 0's latest group tied
                                         "sampler/saturated_weight": 0.4375 / 1.4375,
                                         "sampler/mean_weight": 0.71875, "sampler/seen_share": 0.5})
    assert group_signal([0.3, 0.3 + 1e-7]) == 0.0 and group_signal([0.3, 0.4]) == 1.0


def test_erring_utterance_drawn_more_and_saturated_one_still_at_the_floor_rate():
    # decay 0: an item's weight is that of its latest group: saturated 0.1, erring 1. With one item
    # a draw, P(saturated) = 0.1 / 1.1 = 1/11 once both were seen (the floor rate), else 1/2.
    # 4000 draws: expected 363.6 saturated, binomial sd sqrt(4000 * 1/11 * 10/11) = 18.2.
    s = SignalSampler(2, 1, seed=3, floor=0.1, decay=0.0)
    counts = [0, 0]
    for _ in range(4000):
        (i,) = s.next_indices()
        counts[i] += 1
        s.feedback([i], [SATURATED if i == 0 else ERRING])
    sd = math.sqrt(4000 * (1 / 11) * (10 / 11))
    assert abs(counts[0] - 4000 / 11) < 4 * sd and counts[1] > 8 * counts[0]
    assert s.metrics()["sampler/saturated_weight"] == pytest.approx(1 / 11)
    # the uniform sampler, for contrast, draws each exactly 2000 times in 2000 epochs
    u = UtteranceSampler(2, 1, seed=3)
    assert sum(u.next_indices()[0] == 0 for _ in range(4000)) == 2000


def test_batches_hold_distinct_items_and_every_item_keeps_a_chance():
    s = SignalSampler(4, 3, seed=0, floor=0.05, decay=0.0)
    s.feedback([0, 1, 2, 3], [SATURATED] * 4)  # all saturated: all at the floor, uniform again
    seen = set()
    for _ in range(50):
        batch = s.next_indices()
        assert len(set(batch)) == 3
        seen.update(batch)
    assert seen == {0, 1, 2, 3} and s.epoch == 50 * 3 // 4


def _items(n):
    return [f"utt{i}" for i in range(n)]


def _run(loader, draws, start=0):
    out = []
    for k in range(draws):
        batch = loader.next_batch()
        out.append(batch)
        # scripted feedback: even items saturate, odd ones err, and every 3rd draw all err
        loader.feedback(batch, [ERRING if (int(u[3:]) % 2 or (start + k) % 3 == 0) else SATURATED for u in batch])
    return out


def test_loader_resume_draws_what_the_uninterrupted_run_draws():
    cfg = RLDataConfig(sampler="signal", sampler_floor=0.2, sampler_decay=0.5)
    items = _items(7)

    def loader():
        return BatchLoader(items, 2, make_batch=list, sampler=build_sampler(cfg, len(items), 2, seed=11))

    straight = loader()
    first = _run(straight, 6)
    buf = io.BytesIO()  # through torch.save / torch.load, as a checkpoint's state.pt
    torch.save({"data": straight.state_dict()}, buf)
    rest = _run(straight, 10, start=6)
    resumed = loader()
    buf.seek(0)
    resumed.load_state_dict(torch.load(buf, weights_only=False)["data"])
    assert _run(resumed, 10, start=6) == rest
    assert resumed.metrics() == straight.metrics()
    assert first != rest[:6] and len({u for b in first + rest for u in b}) == 7  # not a fixed cycle; all drawn
    with pytest.raises(ValueError, match="for 7 items, this data has 3"):
        BatchLoader(items[:3], 2, make_batch=list,
                    sampler=build_sampler(cfg, 3, 2, seed=11)).load_state_dict(straight.state_dict())


def test_feedback_for_an_unknown_item_and_the_config():
    loader = BatchLoader(_items(3), 1, make_batch=list)
    loader.feedback(loader.next_batch(), [SATURATED])  # the uniform sampler takes it and logs nothing
    assert loader.metrics() == {}
    with pytest.raises(ValueError, match="did not draw"):
        loader.feedback(["elsewhere"], [SATURATED])
    from asr_rl.trainer.configs.rl import RLConfig, SFTConfig

    assert load_config(RLConfig, None, ["data.sampler=signal"]).data.sampler_floor == 0.1
    with pytest.raises(ConfigError, match="unknown data.sampler 'often'; valid: signal, uniform"):
        load_config(RLConfig, None, ["data.sampler=often"])
    with pytest.raises(ConfigError, match="data.sampler"):  # SFT has no feedback to sample by
        load_config(SFTConfig, None, ["data.sampler=signal"])
