"""Benchmark: the RL step's vocabulary-bound parts, each against the path it replaced, side by side
in one run (quiet machine, 1 thread).

    python scripts/bench_rl_throughput.py [--out exp/bench_rl_throughput] [--only qwen3_tiny_real,voxtral_tiny,demo]

Per model (`asr-rl model init` on a small synthesised corpus):
- rollout: tokens/s of the policy's seeded sampling of 4 prompts x 8 samples x up to 32 tokens, with
  the inverse-CDF sampler (one hash per sequence and step) against the Gumbel sampler (a hash per
  vocabulary entry per step), the draws' placement invariance being the same;
- scoring: 2 prompts x 8 responses of 24-28 tokens through `head_logprobs` (the head on valid
  positions only, reduced chunk by chunk, one softmax for log-probs and entropy) against the plain
  path (the whole `(N, T, V)` float32 log-softmax), best of 3: the update's pass (log-probs and
  entropy, forward and backward) and the old-policy / reference pass (log-probs, no grad).
Targets (issue 38): rollout tokens/s >= 3x and scoring >= 2x at the released vocabularies.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import ensure_corpus, ensure_model  # noqa: E402

CASES = {"qwen3_tiny_real": ("qwen3_asr", "tiny-real"), "voxtral_tiny": ("voxtral", "tiny"),
         "demo": ("qwen2_audio", "small")}


def best(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def rollout_tokens_per_s(policy, rows, sampler, n: int = 8, new_tokens: int = 32) -> float:
    embeds, mask = policy.embed_rows(rows)
    seeds = list(range(len(rows) * n))
    out = {}

    def go() -> None:
        out["r"] = policy.generate_from_embeds(embeds, mask, n, max_new_tokens=new_tokens, seeds=seeds,
                                               temperature=1.0, sampler=sampler)

    seconds = best(go, 2)
    return float(out["r"].mask.sum()) / seconds


def scoring_seconds(policy, rows, plain: bool, grad: bool = True, n: int = 8, length: int = 28) -> float:
    """One scoring pass: with `grad` the update's (log-probs and entropy, forward and backward),
    else the old-policy / reference pass (log-probs under no_grad)."""
    import torch

    from asr_rl.models.policy_base import group_index

    vocab = policy.model.get_output_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(0)
    responses = policy.pad_responses([torch.randint(5, min(1000, vocab - 5), (length - (i % 5),), generator=g).tolist()
                                      for i in range(len(rows) * n)])
    index = group_index(len(rows), n)

    def new() -> None:
        with torch.set_grad_enabled(grad):
            out = policy.logprobs(*policy.embed_rows(rows), responses, index, with_entropy=grad)
        if grad:
            (out[0].sum() + out[1].sum()).backward()

    def old() -> None:  # the plain path: every position through the head, the whole log-softmax
        with torch.set_grad_enabled(grad):
            logits = policy.response_logits(*policy.embed_rows(rows), responses, index)
            logp_all = torch.log_softmax(logits, dim=-1)
            logp = logp_all.gather(-1, responses.ids[..., None]).squeeze(-1).masked_fill(responses.mask == 0, 0)
            if grad:
                entropy = -(logp_all.exp() * logp_all).sum(-1).masked_fill(responses.mask == 0, 0)
                (logp.sum() + entropy.sum()).backward()

    return best(old if plain else new)


def measure(model: Path, corpus: Path) -> dict[str, float]:
    import torch

    from asr_rl.data.batching import load_batch
    from asr_rl.data.manifest import read_manifest
    from asr_rl.models.audio_policy import AudioPolicy
    from asr_rl.models.sampling import SeededGumbelSampler, SeededSampler

    torch.set_num_threads(1)
    policy = AudioPolicy.from_pretrained(model)
    policy.freeze()
    utts = read_manifest(corpus / "train.jsonl")
    rows4, rows2 = policy.encode_batch(load_batch(utts[:4])), policy.encode_batch(load_batch(utts[:2]))
    return {"vocab": policy.model.get_output_embeddings().weight.shape[0],
            "gumbel tok/s": rollout_tokens_per_s(policy, rows4, SeededGumbelSampler),
            "inverse-cdf tok/s": rollout_tokens_per_s(policy, rows4, SeededSampler),
            "plain scoring s": scoring_seconds(policy, rows2, plain=True),
            "head scoring s": scoring_seconds(policy, rows2, plain=False),
            "plain no-grad s": scoring_seconds(policy, rows2, plain=True, grad=False),
            "head no-grad s": scoring_seconds(policy, rows2, plain=False, grad=False)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(CASES))
    ap.add_argument("--out", default="exp/bench_rl_throughput")
    args = ap.parse_args()
    out = Path(args.out)
    corpus = out / "corpus"
    ensure_corpus(corpus, n_train=16, n_test=4)
    print(f"\n{'case':<16} {'vocab':>7} {'Gumbel tok/s':>13} {'inv-CDF tok/s':>14} {'x':>6} "
          f"{'plain score s':>14} {'head score s':>13} {'x':>6} {'plain no-grad':>14} {'head no-grad':>13} {'x':>6}")
    for case in args.only.split(","):
        arch, size = CASES[case]
        model = ensure_model(out / "models" / case, arch, size, corpus)
        m = measure(model, corpus)
        print(f"{case:<16} {m['vocab']:>7} {m['gumbel tok/s']:13.1f} {m['inverse-cdf tok/s']:14.1f} "
              f"{m['inverse-cdf tok/s'] / m['gumbel tok/s']:5.2f}x {m['plain scoring s']:14.3f} "
              f"{m['head scoring s']:13.3f} {m['plain scoring s'] / m['head scoring s']:5.2f}x "
              f"{m['plain no-grad s']:14.3f} {m['head no-grad s']:13.3f} "
              f"{m['plain no-grad s'] / m['head no-grad s']:5.2f}x", flush=True)


if __name__ == "__main__":
    main()
