"""Weights from trainer rank 0 to rollout engines: the policy's causal-LLM weights under standalone
`*ForCausalLM` names (`llm_named_weights`), broadcast over a dedicated gloo group (a standalone
`ProcessGroupGloo` on a `TCPStore`, apart from DeepSpeed's default group): `WeightSyncSender` on
rank 0, a `WeightSyncReceiver` in each engine actor."""
from __future__ import annotations

import datetime
import json
from collections.abc import Iterable

import torch


def is_tied(policy) -> bool:
    head = policy.model.get_output_embeddings()
    emb = policy.model.get_input_embeddings()
    return head.weight is emb.weight or head.weight.data_ptr() == emb.weight.data_ptr()


# ---------------------------------------------------------------------------------- export
def module_prefix(model: torch.nn.Module, module: torch.nn.Module) -> str:
    for name, m in model.named_modules():
        if m is module:
            return name
    raise ValueError("the language model is not a submodule of the policy model")


def llm_named_weights(policy) -> list[tuple[str, torch.Tensor]]:
    """The policy's causal-LLM weights under standalone `*ForCausalLM` names (`model.*`, plus
    `lm_head.weight` when untied), LoRA adapters merged. Tensors are the live ones (no copy) except
    merged LoRA weights; call under `GatheredParameters` with ZeRO-3."""
    lm = policy.body()
    deltas = {}
    if any("lora_" in n for n, _ in lm.named_parameters()):
        from peft.tuners.lora import LoraLayer

        for name, m in lm.named_modules():
            if isinstance(m, LoraLayer) and not m.merged:
                deltas[f"{name}.base_layer.weight"] = sum(m.get_delta_weight(a) for a in m.active_adapters)
    out = []
    for name, t in lm.state_dict().items():
        if "lora_" in name:
            continue
        if name in deltas:
            t = t + deltas[name].to(t.dtype)
        out.append(("model." + name.replace(".base_layer.", "."), t))
    if not is_tied(policy):
        out.append(("lm_head.weight", policy.model.get_output_embeddings().weight))
    return out


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


__all__ = ["llm_named_weights", "module_prefix", "is_tied", "WeightSyncSender", "WeightSyncReceiver"]
