"""Several datasets in one RL run (data/mixture.py): each slot's dataset drawn by its probability,
each dataset's own sampler within it, a resumed sampler drawing what an uninterrupted one would."""
from __future__ import annotations

import numpy as np
import pytest

from asr_rl.data.batching import UtteranceSampler
from asr_rl.data.mixture import build_mixture, check_probs, split_paths
from asr_rl.data.signal_sampler import SignalSampler


def _mixture(sizes=(100, 10), probs=(0.5, 0.5), batch=8, signal=False):
    make = (lambda n, b, s: SignalSampler(n, b, seed=s)) if signal else (lambda n, b, s: UtteranceSampler(n, b, seed=s))
    return build_mixture(make, list(sizes), list(probs), batch, seed=3)


def test_each_dataset_gets_its_share_and_a_small_one_cycles_through_its_lines():
    m = _mixture()
    drawn = [i for _ in range(500) for i in m.next_indices()]
    small = [i - 100 for i in drawn if i >= 100]
    assert len(drawn) == 4000 and abs(len(small) / len(drawn) - 0.5) < 0.03  # binomial sd 0.008
    counts = np.bincount(small, minlength=10)
    assert counts.max() - counts.min() <= 1  # epochs of its own: each line once before any twice
    assert m.metrics()["data/share_1"] == pytest.approx(len(small) / len(drawn))
    assert m.epoch == 4000 // 110


def test_a_round_never_draws_more_of_a_dataset_than_it_holds_nor_an_excluded_line():
    m = _mixture(sizes=(100, 3), probs=(0.01, 0.99), signal=True)
    first = m.next_indices(2)
    more = m.next_indices(8, exclude=first)
    assert len(first) + len(more) == 10 and not set(first) & set(more)
    assert sum(i >= 100 for i in first + more) <= 3 + 0  # the small dataset: 3 lines, none twice in the round


def test_feedback_reaches_the_dataset_the_line_came_from_and_resume_draws_the_same():
    m = _mixture(signal=True)
    idx = m.next_indices()
    m.feedback(idx, [[1.0, 1.0]] * len(idx))  # every group tied: those lines' scores fall
    for g in idx:
        d, i = (0, g) if g < 100 else (1, g - 100)
        assert m.parts[d].last[i] == 0 and m.signal_prior([g]) == [0.5]
    state = m.state_dict()
    again = _mixture(signal=True)
    again.load_state_dict(state)
    assert [again.next_indices() for _ in range(5)] == [m.next_indices() for _ in range(5)]
    with pytest.raises(ValueError, match="for 2 datasets, this run has 3"):
        _mixture(sizes=(5, 5, 5), probs=(1, 1, 1)).load_state_dict(state)


def test_probabilities_are_checked_never_silently_rescaled():
    assert split_paths("a.jsonl, b.jsonl,") == ["a.jsonl", "b.jsonl"]
    assert check_probs([0.75, 0.25], 2) == [0.75, 0.25] and check_probs(None, 1) == [1.0]
    with pytest.raises(ValueError, match="names 2 datasets: give train_manifest_probs"):
        check_probs(None, 2)
    with pytest.raises(ValueError, match="has 3 values for the 2 datasets"):
        check_probs([1, 1, 1], 2)
    with pytest.raises(ValueError, match=r"must be finite numbers >= 0, got \[-1, 2\]"):
        check_probs([-1, 2], 2)
    for bad in ([float("nan"), 0.5], [float("inf"), 0.5]):
        with pytest.raises(ValueError, match="must be finite numbers >= 0"):
            check_probs(bad, 2)
    with pytest.raises(ValueError, match=r"must sum to 1 .*got \[0\.7, 0\.7\] \(sum 1\.4\); for these proportions give "
                                         r"\[0\.5, 0\.5\]"):
        check_probs([0.7, 0.7], 2)


def test_the_same_dataset_twice_is_refused(tmp_path):
    from asr_rl.trainer.recipes.rl import load_rl_config

    (tmp_path / "pool.jsonl").touch()
    twice = f"{tmp_path / 'pool.jsonl'},{tmp_path}/./pool.jsonl"
    with pytest.raises(ValueError, match=r"pool\.jsonl \(as .*\) twice: give each dataset once, with the sum of its "
                                         r"shares"):
        load_rl_config("grpo", None, [f"train_manifest={twice}", "train_manifest_probs=[0.5, 0.5]"])
