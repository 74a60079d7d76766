"""Global normalisers on 2 real DeepSpeed ranks over gloo: ranks with uneven response lengths, sequence
counts and micro-batches give the gradient of the single-process step over all their tokens
(token-mean) or all their sequences (seq-mean-token-mean)."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow

# The loss is w * value per token, w = 1, so d/dw is the aggregate of the token values. Rank 0 holds
# 3 responses, rank 1 four; micro-batches of 2 split each rank unevenly:
#   rank 0: {[4], [1, 1, 1]}, {[2, 2]}          token sum 11 over 6 tokens; sequence means 4, 1, 2
#   rank 1: {[3], [5, 5]}, {[6], [1]}           token sum 20 over 5 tokens; sequence means 3, 5, 6, 1
# token-mean over all 11 tokens: 31 / 11. seq-mean-token-mean over all 7 sequences: 22 / 7 = 3.142857;
# each rank its own sequence mean, then DeepSpeed's average: (7/3 + 15/4) / 2 = 3.0417; each
# micro-batch its own mean, weighed equally: (((4 + 1) / 2 + 2) / 2 + ((3 + 5) / 2 + (6 + 1) / 2) / 2) / 2 = 3.0.
RESPONSES = {0: [[4], [1, 1, 1], [2, 2]], 1: [[3], [5, 5], [6], [1]]}
EXPECTED = {"token-mean": 31 / 11, "seq-mean-token-mean": 22 / 7}


def _rank(rank: int, port: int, out: str) -> None:
    import os

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    from asr_rl.trainer.update.ppo import _epochs
    from asr_rl.trainer.distributed.deepspeed_strategy import DeepSpeedStrategy, init_distributed
    from asr_rl.algos.losses import LossOutput, aggregate_loss
    from asr_rl.trainer.rollout.experience import Group, build_experience
    from asr_rl.trainer.configs.optim import OptimConfig

    init_distributed(rank, 2, "127.0.0.1", port)
    optim = OptimConfig(learning_rate=0.1, adam_betas=(0.9, 0.999), max_norm=1e9, lr_warmup_ratio=0.0,
                        lr_scheduler="constant_with_warmup")
    rows = RESPONSES[rank]
    exp = build_experience([Group(None, None, rows, ["x"] * len(rows), rewards=[0.0] * len(rows))], len(rows),
                           pad_id=0)
    for mode in EXPECTED:
        module = torch.nn.Linear(1, 1, bias=False)
        torch.nn.init.ones_(module.weight)
        strategy = DeepSpeedStrategy(module, list(module.parameters()), optim, total_steps=10, zero_stage=2,
                                     micro_batch=2, world_size=2)
        w = module.weight.view(())
        loss_fn = lambda mb: LossOutput(aggregate_loss(w * mb.response_ids.float(), mb.response_mask, mode), {})  # noqa: E731,B023
        metrics = _epochs(exp, 1, 2, len(rows), 0, strategy, loss_fn, prefix="actor", loss_agg_mode=mode)
        (Path(out) / f"{mode}.{rank}.txt").write_text(repr(metrics["actor/grad_norm"]))
    # both ranks leave the group together: a rank exiting while its peer is still in gloo can abort
    # in the process group's teardown ("terminate called without an active exception")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def test_two_ranks_with_uneven_micro_batches_normalise_by_all_tokens_or_sequences(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # results come back as files: a Manager's server is forked from this process, which after the
    # in-process vLLM and Ray tests of a full run holds threads a fork can leave broken
    mp.spawn(_rank, args=(port, str(tmp_path)), nprocs=2, join=True)
    for mode, expected in EXPECTED.items():
        out = {rank: float((tmp_path / f"{mode}.{rank}.txt").read_text()) for rank in (0, 1)}
        assert out == {0: pytest.approx(expected), 1: pytest.approx(expected)}, mode
