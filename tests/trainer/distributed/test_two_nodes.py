"""GRPO on a Ray cluster of two nodes (a head and a second raylet on this host, joined through
RAY_ADDRESS, as a user's cluster is): the policy ranks land on different nodes, the step equals the
local one, and a node that dies mid-run stops the run with an error naming the rank, after which
`resume=auto` finishes it on a replacement node."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
import torch

from asr_rl.trainer.run.checkpoint import list_checkpoints
from tests.trainer.distributed.test_ray_backend import ATOL, _one_step
from tests.trainer.driver.test_grpo_e2e import _overrides

ray = pytest.importorskip("ray")
pytest.importorskip("deepspeed")
pytestmark = [pytest.mark.slow, pytest.mark.ray]
NODE = dict(num_cpus=1, object_store_memory=128 << 20)


@pytest.fixture
def two_nodes(monkeypatch):
    from ray.cluster_utils import Cluster

    from asr_rl.trainer.distributed.ray_utils import shutdown_ray

    shutdown_ray()  # the driver joins this cluster, not the embedded one an earlier test left running
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # a loopback-only test cluster
    cluster = Cluster(initialize_head=True, head_node_args=dict(NODE, include_dashboard=False))
    second = cluster.add_node(**NODE)
    cluster.wait_for_nodes()
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    yield cluster, second
    if ray.is_initialized():
        ray.shutdown()
    cluster.shutdown()


def _common(tiny_model, tiny_corpus, out, *extra):
    return _overrides(tiny_model, tiny_corpus, out, "micro_train_batch_size=2", "rollout.dynamic_filtering=false",
                      "distributed.actor_num_nodes=2", "distributed.actor_num_gpus_per_node=1", *extra)


def test_ranks_on_two_nodes_step_as_the_local_backend_does(two_nodes, tiny_model, tiny_corpus, tmp_path):
    from asr_rl.trainer.recipes.rl import load_rl_config

    common = _common(tiny_model, tiny_corpus, tmp_path / "x", "max_steps=1", "save_steps=0")
    (local,) = _one_step(load_rl_config("grpo", None, common + [f"output_dir={tmp_path / 'local'}"]))
    ranks, nodes = _one_step(load_rl_config("grpo", None, common + [f"output_dir={tmp_path / 'ray'}", "backend=ray"]),
                             with_nodes=True)
    assert len(ranks) == 2 and len(set(nodes)) == 2, f"both ranks on one node: {nodes}"
    diffs = {n: float((ranks[0][n] - v).abs().max()) for n, v in local.items()}
    assert not {n: d for n, d in diffs.items() if d > ATOL}, diffs
    assert all(torch.equal(ranks[0][n], ranks[1][n]) for n in local)


def _train(tiny_model, tiny_corpus, out, *extra) -> subprocess.Popen:
    args = _common(tiny_model, tiny_corpus, out, "backend=ray", "max_steps=12", "save_steps=1", *extra)
    return subprocess.Popen([sys.executable, "-m", "asr_rl.cli", "train", "grpo", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))


def test_a_node_that_dies_mid_run_is_named_and_resume_auto_finishes_the_run(two_nodes, tiny_model, tiny_corpus,
                                                                              tmp_path):
    cluster, second = two_nodes
    out = tmp_path / "run"
    proc = _train(tiny_model, tiny_corpus, out)
    deadline = time.time() + 400
    while not list_checkpoints(out) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[0][-3000:]
    cluster.remove_node(second)  # its raylet and the rank on it die mid-run
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == 2, log[-3000:]
    # the rank on the removed node: either, as the placement put bundle 0 on either node
    assert re.search(r"trainer rank [01] died during", log) and "resume with resume=auto" in log, log[-3000:]
    assert "Traceback" not in log
    assert not (out / "final").exists()
    cluster.add_node(**NODE)  # a replacement
    cluster.wait_for_nodes()
    proc = _train(tiny_model, tiny_corpus, out, "resume=auto")
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, log[-3000:]
    assert "resuming from" in log and (out / "final" / "config.json").is_file()
