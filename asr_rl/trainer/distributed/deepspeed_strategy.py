"""DeepSpeed behind the strategy interface of trainer/update/strategy.py (`backward`, `step`, `lr`).

ZeRO stage 0-3, fp32 or bf16, optional optimizer offload. Gradient accumulation is the caller's:
each `backward` gets a loss already scaled per micro-batch and says whether it is the minibatch's
last; the engine's accumulation boundary is set from that (`set_gradient_accumulation_boundary`),
so the minibatch size may change from step to step (dynamic filtering) and the update code stays
identical to the single-process one. On CPU the gloo backend is used and the
JIT-compiled shared-memory op is skipped (its g++ build takes minutes on first use).
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path

import torch

from asr_rl.trainer.configs.optim import AdamWConfig
from asr_rl.trainer.update.strategy import build_optimizer, build_scheduler


def init_distributed(rank: int, world_size: int, master_addr: str, master_port: int) -> None:
    """Join the policy ranks' process group (gloo on CPU, NCCL on GPUs) through DeepSpeed."""
    os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank if not torch.cuda.is_available() else 0))
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        # The CPU accelerator JIT-compiles a shared-memory comm op with g++ (minutes); gloo needs none.
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo", auto_mpi_discovery=False)


def ds_config(zero_stage: int, micro_batch: int, world_size: int, max_norm: float, bf16: bool,
              offload_optimizer: bool) -> dict:
    zero: dict = {"stage": zero_stage}
    if offload_optimizer and zero_stage > 0:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    if zero_stage == 3:
        zero.update(stage3_param_persistence_threshold=0, stage3_max_live_parameters=1e9)
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "train_batch_size": micro_batch * world_size,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": max_norm,
        "zero_optimization": zero,
        "bf16": {"enabled": bf16},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


class DeepSpeedStrategy:
    """One DeepSpeed engine around `module`; `params` are the trainable ones, under the same `optim`
    section as `LocalStrategy.from_config` (`lr`: the peak rate, default `optim_cfg.learning_rate`)."""

    def __init__(self, module: torch.nn.Module, params: list[torch.nn.Parameter], optim_cfg: AdamWConfig,
                 total_steps: int, lr: float | None = None, *, zero_stage: int, micro_batch: int, world_size: int,
                 bf16: bool = False, offload_optimizer: bool = False):
        import deepspeed

        params = [p for p in params if p.requires_grad]
        # torch AdamW (not DeepSpeedCPUAdam, which compiles for minutes): same math as the local backend.
        optimizer = build_optimizer(params, optim_cfg, optim_cfg.learning_rate if lr is None else lr)
        scheduler = build_scheduler(optimizer, optim_cfg, total_steps)
        config = ds_config(zero_stage, micro_batch, world_size, optim_cfg.max_norm, bf16, offload_optimizer)
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=module, optimizer=optimizer, lr_scheduler=scheduler, config=config)
        self.zero_stage = zero_stage

    def backward(self, loss: torch.Tensor, last: bool = True) -> None:
        # The policy runs its modules directly, not through `engine.forward`, which is where ZeRO
        # advances its micro-step counter; without it ZeRO-3 overwrites instead of accumulating.
        clear = getattr(self.engine.optimizer, "clear_backward_seen_flag", None)
        if clear is not None:
            clear()
        self.engine.set_gradient_accumulation_boundary(last)
        self.engine.backward(loss, scale_wrt_gas=False)

    def step(self) -> float:
        self.engine.set_gradient_accumulation_boundary(True)
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else 0.0

    def mean_over_ranks(self, x: float) -> float:
        """The mean of `x` over the data-parallel ranks (an all-reduce: every rank calls it together)."""
        import torch.distributed as dist

        t = torch.tensor([float(x)], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t) / dist.get_world_size()

    @property
    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def save(self, folder: str | Path, tag: str = "engine") -> None:
        """DeepSpeed's own checkpoint (optimizer shards, scheduler, partitioned weights); every rank calls it."""
        self.engine.save_checkpoint(str(folder), tag=tag, save_latest=False)

    def load(self, folder: str | Path, tag: str = "engine") -> None:
        self.engine.load_checkpoint(str(folder), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True)

    def gathered(self, params: list[torch.nn.Parameter]):
        """Context in which ZeRO-3 partitioned `params` hold their full values on every rank
        (a no-op below stage 3). Every rank must enter it together."""
        import contextlib

        if self.zero_stage != 3:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(params, modifier_rank=None)
