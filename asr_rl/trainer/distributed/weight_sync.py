"""Weights from policy rank 0 to rollout engine workers (the policy's causal-LLM weights under
standalone `*ForCausalLM` names, models/weights.py `llm_named_weights`), broadcast over a dedicated
gloo group (a standalone `ProcessGroupGloo` on a `TCPStore`, apart from DeepSpeed's default group):
`WeightSyncSender` on rank 0, a `WeightSyncReceiver` in each engine worker."""
from __future__ import annotations

import datetime
import json
from collections.abc import Iterable

import torch


# ---------------------------------------------------------------------------------- weight sync
class _GlooGroup:
    """A standalone gloo group on its own TCPStore (rank 0 hosts the store); all ranks must
    construct it concurrently (the constructor is a rendezvous)."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, timeout_s: float = 600.0):
        from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore

        timeout = datetime.timedelta(seconds=timeout_s)
        self.rank, self.world_size = rank, world_size
        self.store = TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout)
        self.pg = ProcessGroupGloo(PrefixStore("asr_rl_weight_sync", self.store), rank, world_size, timeout)

    def broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        self.pg.broadcast(tensor, 0).wait()
        return tensor

    def broadcast_object(self, obj=None):
        if self.rank == 0:
            payload = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)
            self.broadcast(torch.tensor([payload.numel()], dtype=torch.int64))
            self.broadcast(payload)
            return obj
        size = self.broadcast(torch.zeros(1, dtype=torch.int64))
        payload = self.broadcast(torch.empty(int(size), dtype=torch.uint8))
        return json.loads(bytes(payload.tolist()).decode())

    def close(self) -> None:
        self.pg = None
        self.store = None


class WeightSyncSender(_GlooGroup):
    """Trainer rank 0's end: `send` broadcasts names, shapes and dtypes, then each tensor."""

    def __init__(self, host: str, port: int, world_size: int, timeout_s: float = 600.0):
        super().__init__(host, port, 0, world_size, timeout_s)

    @torch.no_grad()
    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        tensors = [(n, t.detach().to("cpu").contiguous()) for n, t in named_tensors]
        self.broadcast_object([[n, list(t.shape), str(t.dtype).removeprefix("torch.")] for n, t in tensors])
        for _, t in tensors:
            self.broadcast(t)
        return len(tensors)


class WeightSyncReceiver(_GlooGroup):
    """An engine's end (ranks 1..world_size-1): `receive` returns the tensors of one `send`."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, timeout_s: float = 600.0):
        if rank < 1:
            raise ValueError(f"receiver ranks start at 1 (rank 0 sends), got {rank}")
        super().__init__(host, port, rank, world_size, timeout_s)

    @torch.no_grad()
    def receive(self) -> list[tuple[str, torch.Tensor]]:
        header = self.broadcast_object()
        return [(name, self.broadcast(torch.empty(shape, dtype=getattr(torch, dtype))))
                for name, shape, dtype in header]


__all__ = ["WeightSyncSender", "WeightSyncReceiver"]
