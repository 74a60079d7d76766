"""A GRPO run of the tiny model scored by a real `asr-rl reward serve` process on 127.0.0.1."""
from __future__ import annotations


import pytest

from asr_rl.trainer.run.metrics import read_metrics
from asr_rl.trainer.recipes.rl import load_rl_config, run_audio_rl
from tests.trainer.driver.test_grpo_e2e import _overrides

pytestmark = pytest.mark.slow


def test_grpo_with_a_remote_multi_term_reward_logs_each_term(tiny_model, tiny_corpus, tmp_path, reward_server):
    out = tmp_path / "remote"
    run_audio_rl(load_rl_config("grpo", None, _overrides(
        tiny_model, tiny_corpus, out, "max_steps=2", "save_steps=0", f"reward.remote_url={reward_server}",
        "reward.remote_token=s3cret", "rollout.dynamic_filtering=false")))
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    for term in ("cer", "keyword", "language", "fluency"):
        assert f"reward/{term}" in rows[-1], term
    assert "reward/mean" in rows[-1]


def test_wrong_token_fails_the_step_with_a_clear_error(tiny_model, tiny_corpus, tmp_path, reward_server):
    from asr_rl.rewards.base import RewardError

    with pytest.raises(RewardError, match=r"401.*token"):
        run_audio_rl(load_rl_config("grpo", None, _overrides(
            tiny_model, tiny_corpus, tmp_path / "r", "max_steps=1", f"reward.remote_url={reward_server}",
            "reward.remote_token=wrong")))
