"""Rewards scored by Ray actors on a real embedded local Ray."""
from __future__ import annotations

import pytest

from asr_rl.rewards.base import RewardError, Sample
from asr_rl.rewards.pipeline import load_reward_spec

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.ray]




def _samples(n):
    return [Sample(f"call ana {i}", f"call anna {i}", "en", ("anna",), prompt=f"u{i}", group_id=i // 2) for i in range(n)]


def test_pool_matches_inline_scoring_in_order(local_ray, tmp_path):
    from asr_rl.trainer.distributed.ray_rewards import RayRewardPool

    path = tmp_path / "r.py"
    path.write_text("import os\n\ndef reward_func(queries, prompts, labels, **kw):\n"
                    "    return {'rewards': [float(p[1:]) for p in prompts], 'extra_logs': {'pid': os.getpid()}}\n")
    pool = RayRewardPool(str(path), num_workers=2)
    out = pool(_samples(7))
    assert out.rewards == [float(i) for i in range(7)]
    builtin = RayRewardPool("builtin:asr", num_workers=2)
    samples = _samples(5)
    assert builtin(samples).rewards == pytest.approx(load_reward_spec("builtin:asr")(samples).rewards)


def test_pool_error_names_reward_samples_and_cause(local_ray, tmp_path):
    from asr_rl.trainer.distributed.ray_rewards import RayRewardPool

    path = tmp_path / "bad.py"
    path.write_text("def reward_func(queries, prompts, labels, **kw):\n"
                    "    if 'u5' in prompts:\n        raise KeyError('no label for u5')\n"
                    "    return [0.0] * len(queries)\n")
    with pytest.raises(RewardError, match=r"failed on samples 4-7: .*no label for u5"):
        RayRewardPool(str(path), num_workers=2)(_samples(8))


def test_pool_from_a_reward_config_keeps_weights(local_ray):
    from asr_rl.rewards.pipeline import make_reward
    from asr_rl.rewards.config import RewardConfig
    from asr_rl.trainer.distributed.ray_rewards import RayRewardPool

    cfg = RewardConfig(terms={"cer": 2.0, "keyword": 0.5})
    samples = _samples(4)
    assert RayRewardPool(cfg, num_workers=2)(samples).rewards == pytest.approx(make_reward(cfg)(samples).rewards)


def test_pool_hands_a_group_reading_term_whole_groups(local_ray):
    """consensus in 2 actors, groups of 3 in a batch of 9: a half-way cut would split group 1 and give
    other scores; the pool cuts between groups and matches the local reward."""
    from asr_rl.rewards.config import RewardConfig
    from asr_rl.rewards.pipeline import make_reward
    from asr_rl.trainer.distributed.ray_rewards import RayRewardPool

    cfg = RewardConfig(terms={"consensus": 1.0})
    texts = ["call anna", "call ana", "call bob", "a b", "a c", "a b", "打开灯", "打开灯", "打开门"]
    samples = [Sample(t, None, group_id=i // 3, prompt=f"u{i // 3}") for i, t in enumerate(texts)]
    want = make_reward(cfg)(samples).rewards
    assert RayRewardPool(cfg, num_workers=2)(samples).rewards == pytest.approx(want)
    assert want[3] != pytest.approx(make_reward(cfg)(samples[3:5]).rewards[0])  # a split group scores otherwise
