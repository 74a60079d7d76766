"""Global token-mean on 2 real DeepSpeed ranks over gloo: ranks with uneven response lengths give the
gradient of the single-process step over all their tokens."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow

# rank 0 holds a response of 1 token (value 4), rank 1 one of 3 tokens (values 1, 1, 1); the loss
# is w * value per token, w = 1. Over all 4 tokens: d/dw = (4 + 1 + 1 + 1) / 4 = 1.75. Each rank
# normalising by its own tokens and DeepSpeed averaging would give (4/1 + 3/3) / 2 = 2.5.
RESPONSES = {0: [[4]], 1: [[1, 1, 1]]}


def _rank(rank: int, port: int, out: str) -> None:
    import os

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    from asr_rl.trainer.rl.actor import _epochs
    from asr_rl.trainer.distributed.deepspeed_strategy import DeepSpeedStrategy, init_distributed
    from asr_rl.algos.losses import LossOutput, aggregate_loss
    from asr_rl.trainer.rl.rollout import Group, build_experience
    from asr_rl.trainer.strategy import OptimConfig

    init_distributed(rank, 2, "127.0.0.1", port)
    module = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.ones_(module.weight)
    optim = OptimConfig(learning_rate=0.1, adam_betas=(0.9, 0.999), max_norm=1e9, lr_warmup_ratio=0.0,
                        lr_scheduler="constant_with_warmup")
    strategy = DeepSpeedStrategy(module, list(module.parameters()), optim, total_steps=10, zero_stage=2,
                                 micro_batch=1, world_size=2)
    exp = build_experience([Group(None, None, RESPONSES[rank], ["x"], rewards=[0.0])], 1, pad_id=0)
    w = module.weight.view(())
    loss_fn = lambda mb: LossOutput(aggregate_loss(w * mb.response_ids.float(), mb.response_mask, "token-mean"), {})  # noqa: E731
    metrics = _epochs(exp, 1, 1, 1, 0, strategy, loss_fn, prefix="actor", loss_agg_mode="token-mean")
    (Path(out) / f"{rank}.txt").write_text(repr(metrics["actor/grad_norm"]))


def test_two_ranks_with_uneven_lengths_normalise_by_all_tokens(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # results come back as files: a Manager's server is forked from this process, which after the
    # in-process vLLM and Ray tests of a full run holds threads a fork can leave broken
    mp.spawn(_rank, args=(port, str(tmp_path)), nprocs=2, join=True)
    out = {rank: float((tmp_path / f"{rank}.txt").read_text()) for rank in (0, 1)}
    assert out == {0: pytest.approx(1.75), 1: pytest.approx(1.75)}
