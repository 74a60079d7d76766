"""Asynchronous rollouts on a real embedded Ray: HF engine actors generate the next batch while the
trainer rank updates. Staleness 0 reproduces the synchronous loop step for step; staleness 1 trains
on samples one update old, recorded and corrected; a killed run resumes."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from asr_rl.rewards.pipeline import make_reward
from asr_rl.trainer.run.setup import make_logger, setup_run
from asr_rl.trainer.driver.loop import RLTrainer
from asr_rl.trainer.run.metrics import read_metrics
from asr_rl.trainer.recipes.rl import build_backend, load_rl_config
from tests.trainer.distributed.ray_probe import rank_weights
from tests.trainer.driver.test_grpo_e2e import _overrides

pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.ray]

ONE_RANK = ["backend=ray", "distributed.actor_num_gpus_per_node=1", "rollout.dynamic_filtering=false",
            "save_steps=0", "micro_train_batch_size=8"]




def _run(cfg):
    """Run the loop; (per-step metrics, each step's experience versions, final trainable weights)."""
    from asr_rl.data.batching import BatchLoader
    from asr_rl.data.manifest import read_manifest

    ctx = setup_run(cfg)
    workers = build_backend(cfg, ctx, "grpo")
    loader = BatchLoader(read_manifest(cfg.train_manifest), cfg.rollout.rollout_batch_size, seed=cfg.seed)
    trainer = RLTrainer(cfg, workers, make_reward(cfg.reward), loader, make_logger(cfg, ctx, 0), ctx.output_dir)
    versions = []
    build = trainer.compute_advantages

    def spy(exp):
        versions.append(exp.policy_versions)
        return build(exp)

    trainer.compute_advantages = spy
    try:
        trainer.fit()
        return read_metrics(ctx.output_dir), versions, rank_weights(workers)[0]
    finally:
        workers.shutdown()


def test_staleness_zero_equals_the_synchronous_loop(local_ray, tiny_model, tiny_corpus, tmp_path):
    common = _overrides(tiny_model, tiny_corpus, tmp_path / "x", *ONE_RANK, "max_steps=2")
    sync_m, _, sync_w = _run(load_rl_config("grpo", None, common + [f"output_dir={tmp_path / 'sync'}"]))
    async_m, versions, async_w = _run(load_rl_config("grpo", None, common + [
        f"output_dir={tmp_path / 'async'}", "rollout.async_enable=true", "rollout.async_queue_size=0"]))
    assert versions == [[0, 0], [1, 1]]  # every batch sampled by the weights it trains
    for a, b in zip(sync_m, async_m):
        assert a["reward/mean"] == b["reward/mean"] and a["response/length_mean"] == b["response/length_mean"]
        assert a["rollout/version_lag"] == b["rollout/version_lag"] == 0
    assert max(float((sync_w[k] - async_w[k]).abs().max()) for k in sync_w) < 1e-6


def test_staleness_one_trains_on_samples_one_update_old_and_corrects_them(local_ray, tiny_model, tiny_corpus,
                                                                          tmp_path):
    cfg = load_rl_config("grpo", None, _overrides(
        tiny_model, tiny_corpus, tmp_path / "async1", *ONE_RANK, "max_steps=3", "rollout.async_enable=true",
        "rollout.async_queue_size=1", "algo.rollout_correction=tis"))
    metrics, versions, _ = _run(cfg)
    # step 1 samples with the starting weights; steps 2 and 3 train on batches sampled before the
    # previous update (submitted while it trained)
    assert versions == [[0, 0], [0, 0], [1, 1]]
    assert [m["rollout/version_lag"] for m in metrics] == [0, 1, 1]
    # the correction sees the lag: engine and trainer log-probs differ, so the weights are not all 1
    assert metrics[0]["rollout_corr/max_abs_log_ratio"] < 1e-4
    for m in metrics[1:]:
        assert m["rollout_corr/max_abs_log_ratio"] > 1e-2 and m["rollout_corr/k3_kl"] > 1e-5


def test_a_killed_async_run_resumes_to_the_end(tiny_model, tiny_corpus, tmp_path):
    out = tmp_path / "resume"
    args = ["train", "grpo", *_overrides(tiny_model, tiny_corpus, out, *ONE_RANK, "max_steps=3", "save_steps=1",
                                         "rollout.async_enable=true", "algo.rollout_correction=tis")]
    fault = Path(__file__).resolve().parents[2] / "fault.py"
    env = {**os.environ, "RAY_ADDRESS": ""}
    res = subprocess.run([sys.executable, str(fault), "after-step", "2", "--", *args], env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == -9, res.stderr[-2000:]
    done = subprocess.run([str(Path(sys.executable).parent / "asr-rl"), *args, "resume=auto"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[-1]["rollout/version_lag"] == 0  # the batch in flight at the kill is drawn again, on-policy


def test_async_needs_ray_and_a_correction():
    for extra in (["rollout.async_enable=true", "algo.rollout_correction=tis"],
                  ["rollout.async_enable=true", "backend=ray"]):
        with pytest.raises(ValueError, match="rollout.async_enable needs backend=ray"):
            load_rl_config("grpo", None, extra)
    cfg = load_rl_config("grpo", None, ["rollout.async_enable=true", "backend=ray", "rollout.async_queue_size=0",
                                        "distributed.actor_num_gpus_per_node=1"])
    assert cfg.rollout.async_queue_size == 0
