"""What one policy rank of an RL run will hold, estimated before the first step, and a warning when
it will not fit.

Exact for what the model's tensors are: weights, gradients and AdamW state of what trains, and
what the KL reference owns. Estimated by formula for the rest:
- rollout KV cache: 2 (K, V) x layers x KV heads x head dim x bytes x sequences x (prompt + response);
- the LM head's output during the loss: logits, log-softmax and the entropy term, 4 float32
  copies of micro x response x vocab (the biggest transient for a 151,936-token vocabulary);
- other activations kept for backward: 34 x tokens x hidden bytes per layer at 16-bit (Korthikanti
  et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", arXiv:2205.05198,
  eq. 1 without the attention-score term, which SDPA does not keep), twice that in float32;
- the runtime (Python, torch, transformers, the data), measured on this machine kind;
- the frozen encoder's cached states in RAM: all of them, or `model.encoder_cache_max_gib` when
  fewer (models/cache_plan.py).
With a shared prompt (`model.shared_prefix`) a micro-batch runs each of its prompts once (its
sequences come in groups of n, so about micro / n + 1 prompts), and keeps the prompt's keys and
values gathered per sequence for the responses' attention; the rollout cache is the same size
(the prefilled prompt is repeated for the n samples).

With DeepSpeed ZeRO over `world_size` data-parallel ranks (Rajbhandari et al. 2020, "ZeRO: Memory
Optimizations Toward Training Trillion Parameter Models", arXiv:1910.02054, sec. 5.1), stage 1
partitions the optimizer state, stage 2 also the gradients, stage 3 also the weights (the
reference stays whole: it is a plain module beside the engine). DeepSpeed in bf16 keeps an fp32
master copy and fp32 moments: 12 bytes per trainable parameter.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

log = logging.getLogger("asr_rl.train")

RUNTIME_BYTES = 900 * 2**20  # RSS of a process that imported torch + transformers and read the data here


@dataclass
class MemoryEstimate:
    """Bytes per component; `total` is their sum."""

    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def table(self) -> str:
        rows = [f"  {k:<22} {v / 2**20:10.1f} MiB" for k, v in self.parts.items()]
        return "\n".join(rows + [f"  {'total':<22} {self.total / 2**20:10.1f} MiB"])


def _bytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def estimate_rl_memory(policy, *, reference: bool, share_frozen: bool, sequences: int, prompt_len: int,
                       response_len: int, micro_batch: int, optimizer_bytes_per_param: float | None = None,
                       zero_stage: int = 0, world_size: int = 1, runtime_bytes: int = RUNTIME_BYTES,
                       group_size: int = 1, shared_prefix: bool = False,
                       encoder_cache_bytes: int = 0) -> MemoryEstimate:
    """The peak of one policy rank during an RL step.

    Args:
        policy: the loaded policy (its parameters and `trainable_parameters()` are read).
        reference: a KL reference lives in this process.
        share_frozen: the reference shares the frozen weights (`CausalPolicy.reference_copy`).
        sequences: sequences this rank samples at once (its share of rollout_batch_size x
            n_samples_per_prompt).
        prompt_len, response_len: longest prompt (audio frames + text) and response, in tokens.
        micro_batch: sequences per forward/backward.
        optimizer_bytes_per_param: AdamW state per trainable parameter; default two moments in the
            parameter's dtype (torch AdamW); DeepSpeed bf16 keeps an fp32 master copy too (12).
        zero_stage, world_size: DeepSpeed ZeRO partitioning over the data-parallel ranks.
        group_size, shared_prefix: sequences per prompt, and whether they share its forward.
        encoder_cache_bytes: the encoder cache's RAM (`CachePlan.ram_bytes`).
    """
    params = list(policy.model.parameters())
    trainable = [p for _, p in policy.trainable_parameters()]
    elem = trainable[0].element_size() if trainable else 4
    tower = getattr(getattr(policy, "spec", None), "audio_tower", None)
    tower_bytes = _bytes(tower(policy.model).parameters()) if tower is not None and policy.encoder_frozen else 0
    opt = optimizer_bytes_per_param if optimizer_bytes_per_param is not None else 2 * elem
    cfg = policy.model.config.get_text_config()
    layers, hidden, vocab = cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size
    head_dim = getattr(cfg, "head_dim", None) or hidden // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    kv_per_token = 2 * layers * kv_heads * head_dim * elem
    prompts = min(micro_batch, -(-micro_batch // group_size) + 1) if shared_prefix and group_size > 1 else micro_batch
    tokens = prompts * prompt_len + micro_batch * response_len
    shard = [1 / world_size if zero_stage >= s else 1.0 for s in (3, 2, 1)]  # weights, grads, optimizer
    parts = {  # ZeRO-3 partitions every parameter of the engine's module, frozen ones too
        "weights": int(_bytes(params) * shard[0]),
        "gradients": int(_bytes(trainable) * shard[1]),
        "optimizer state": int(opt * sum(p.numel() for p in trainable) * shard[2]),
        "reference": (_bytes(trainable) if share_frozen else _bytes(params) - tower_bytes) if reference else 0,
        "rollout KV cache": kv_per_token * sequences * (prompt_len + response_len),
        "shared prompt KV": kv_per_token * micro_batch * prompt_len if prompts < micro_batch else 0,
        "LM-head outputs": 4 * 4 * micro_batch * response_len * vocab,
        "activations": int(34 * tokens * hidden * layers * elem / 2),
        "encoder cache": encoder_cache_bytes,
        "runtime": runtime_bytes,
    }
    return MemoryEstimate(parts)


def rank_estimate(cfg, policy, *, reference: bool, prompt_len: int, world_size: int = 1,
                  deepspeed: bool = False, cache_bytes: int = 0) -> MemoryEstimate:
    """`estimate_rl_memory` for one policy rank of the run `cfg` (an RLConfig): its share of the
    rollout, its micro-batch, on DeepSpeed the ZeRO stage and the optimizer's state size, and the
    encoder cache's RAM (`cache_bytes`)."""
    r, d = cfg.rollout, cfg.distributed
    elem = next((p.element_size() for _, p in policy.trainable_parameters()), 4)
    opt = (12 if elem == 2 else 8) if deepspeed else None
    return estimate_rl_memory(policy, reference=reference, share_frozen=not (deepspeed and d.zero_stage == 3),
                              sequences=-(-r.rollout_batch_size * r.n_samples_per_prompt // world_size),
                              prompt_len=prompt_len, response_len=r.max_new_tokens,
                              micro_batch=cfg.optim.micro_train_batch_size, optimizer_bytes_per_param=opt,
                              zero_stage=d.zero_stage if deepspeed else 0, world_size=world_size,
                              group_size=r.n_samples_per_prompt, shared_prefix=cfg.model.shared_prefix,
                              encoder_cache_bytes=cache_bytes)


def prompt_length(policy, utterance, sample_rate: int) -> int:
    """Prompt tokens (audio frames + text) of one utterance, from the processor alone (the encoder
    does not run)."""
    from asr_rl.data.batching import load_batch

    batch = load_batch([utterance], sample_rate=sample_rate)
    return policy.prepare(list(batch.waveforms), batch.languages, [utterance.id], batch.contexts).input_ids.shape[1]


def available_bytes(device: str) -> int | None:
    """Free memory where the step runs: the GPU's free memory, else the machine's MemAvailable."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.mem_get_info()[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def peak_memory_gib() -> float:
    """The process's peak so far: allocated GPU memory on CUDA, else the peak RSS."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def report_memory(estimate: MemoryEstimate, device: str) -> None:
    """Log the estimate; warn when it exceeds what is available."""
    free = available_bytes(device)
    log.info("memory estimate per policy rank (%s):\n%s", device, estimate.table())
    if free is not None and estimate.total > free:
        log.warning("the estimated %.1f GiB per policy rank exceed the %.1f GiB available on %s: expect an "
                    "out-of-memory stop. Lower micro_train_batch_size or rollout_batch_size x n_samples_per_prompt, "
                    "train in bf16 (model.dtype=bfloat16), use LoRA (model.lora_rank), or more ranks with ZeRO",
                    estimate.total / 2**30, free / 2**30, device)


__all__ = ["MemoryEstimate", "estimate_rl_memory", "rank_estimate", "prompt_length", "available_bytes", "peak_memory_gib", "report_memory", "RUNTIME_BYTES"]
