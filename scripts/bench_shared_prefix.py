"""Benchmark: one prompt forward per group (`model.shared_prefix=true`) against the prompt repeated
per sample (`false`, the reference path), side by side in one run.

    python scripts/bench_shared_prefix.py [--steps 4] [--only demo,voxtral_tiny,qwen3_tiny_real] [--out exp/bench_sp]

Each case runs the real GRPO loop (`asr-rl train grpo`, local backend, 1 torch thread, float32) in a
process of its own per arm, on models `asr-rl model init` builds (random weights; responses are cut
at `--new-tokens`, 28 by default: the demo's SFT model answers in ~25-30 tokens), with a KL
reference (`init_kl_coef=0.01`) and two PPO epochs (`algo.max_epochs=2`), so every phase runs:
rollout (sampling), old/reference log-probs, update. The arms alternate (shared, repeated, ...) per
case and the table gives medians over the steps after the first (its time includes start-up
effects), and the peak RSS of each arm's process. Cases (8 utterances x 8 samples each):
    demo             Qwen2-Audio `small` on the frozen Whisper tiny.en encoder (the demo's model)
    voxtral_tiny     Voxtral `tiny`: 30 s encoder chunks, 375 audio positions per prompt
    qwen3_tiny_real  Qwen3-ASR `tiny-real`: the released 151,936-token vocabulary
The corpus is `asr-rl data synth` (espeak-ng), 64 train utterances. Run with nothing else on the
machine: the ratio is measured side by side, the seconds are not comparable across machines.
A last table profiles one scoring pass per case: the LLM body alone against the whole pass (the LM
head and the softmax over the vocabulary are per response token, the same in both arms).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import ensure_corpus, ensure_model, run  # noqa: E402

CASES = {"demo": ("qwen2_audio", "small"), "voxtral_tiny": ("voxtral", "tiny"), "qwen3_tiny_real": ("qwen3_asr", "tiny-real")}
PHASES = (("rollout", "time/rollout"), ("log-probs", "time/logprobs"), ("update", "time/train"), ("step", None))


def grpo(model: Path, corpus: Path, out: Path, shared: bool, steps: int, new_tokens: int) -> list[dict]:
    """Run the arm (unless its metrics are there) and return its metrics rows."""
    if not (out / "metrics.jsonl").is_file():
        run("train", "grpo", f"pretrain={model}", f"train_manifest={corpus / 'train.jsonl'}", f"output_dir={out}",
            f"max_steps={steps}", "save_steps=0", "eval_steps=0", "rollout_batch_size=8", "n_samples_per_prompt=8",
            f"max_new_tokens={new_tokens}", "rollout.dynamic_filtering=false", "micro_train_batch_size=16",
            "init_kl_coef=0.01", "algo.max_epochs=2", "actor_learning_rate=1e-5", "num_threads=1",
            f"model.shared_prefix={str(shared).lower()}", "logging.tensorboard=false", "logging.progress_bar=false",
            threads=1)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def phase_seconds(rows: list[dict]) -> dict[str, float]:
    """Median seconds per phase over the steps after the first; rollout without reward scoring."""
    later = rows[1:] or rows
    out = {}
    for name, key in PHASES:
        if key is None:
            out[name] = statistics.median(r["time/step"] for r in later)
        elif key == "time/rollout":
            out[name] = statistics.median(r[key] - r.get("time/reward", 0.0) for r in later)
        else:
            out[name] = statistics.median(r.get(key, 0.0) for r in later)
    out["peak GiB"] = max(r.get("memory/peak_gib", 0.0) for r in rows)
    return out


def profile_pass(model: Path, corpus: Path, n: int = 8, length: int = 28) -> dict[str, float]:
    """Best-of-3 seconds of one micro-batch (2 prompts x n responses) forward + backward: the LLM
    body alone, and the whole log-prob + entropy pass (LM head and softmax over the vocabulary),
    per arm: where the time of a scoring pass goes."""
    import time

    import torch

    from asr_rl.data.batching import load_batch
    from asr_rl.data.manifest import read_manifest
    from asr_rl.models.audio_policy import AudioPolicy
    from asr_rl.models.policy_base import group_index

    torch.set_num_threads(1)
    policy = AudioPolicy.from_pretrained(model)
    policy.freeze()
    rows = policy.encode_batch(load_batch(read_manifest(corpus / "train.jsonl")[:2]))
    vocab = policy.model.get_output_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(0)
    responses = policy.pad_responses([torch.randint(5, min(1000, vocab - 5), (length,), generator=g).tolist()
                                      for _ in range(2 * n)])
    index = group_index(2, n)

    def best(fn) -> float:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    def body() -> None:
        policy.response_hidden(*policy.embed_rows(rows), responses, index).sum().backward()

    def whole() -> None:
        logp, entropy = policy.logprobs(*policy.embed_rows(rows), responses, index, with_entropy=True)
        (logp.sum() + entropy.sum()).backward()

    out = {}
    for shared in (False, True):
        policy.shared_prefix = shared
        arm = "shared" if shared else "repeated"
        out[f"body {arm}"], out[f"whole {arm}"] = best(body), best(whole)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=28)
    ap.add_argument("--only", default=",".join(CASES))
    ap.add_argument("--out", default="exp/bench_shared_prefix")
    args = ap.parse_args()
    out = Path(args.out)
    corpus = out / "corpus"
    ensure_corpus(corpus, n_train=64, n_test=8)
    table = []
    for case in args.only.split(","):
        arch, size = CASES[case]
        model = ensure_model(out / "models" / case, arch, size, corpus)
        res = {shared: phase_seconds(grpo(model, corpus, out / "runs" / f"{case}_{'shared' if shared else 'repeated'}",
                                          shared, args.steps, args.new_tokens))
               for shared in (True, False)}
        table.append((case, res[False], res[True]))
    print(f"\n{'case':<16} {'phase':<10} {'repeated s':>11} {'shared s':>9} {'speed-up':>9}")
    for case, rep, sh in table:
        for name, _ in PHASES:
            ratio = rep[name] / sh[name] if sh[name] > 0 else float("nan")
            print(f"{case:<16} {name:<10} {rep[name]:11.2f} {sh[name]:9.2f} {ratio:8.2f}x")
        print(f"{case:<16} {'peak GiB':<10} {rep['peak GiB']:11.2f} {sh['peak GiB']:9.2f}")
    print("\nwhere a scoring pass goes (2 prompts x 8 responses, forward + backward, best of 3 s):")
    print(f"{'case':<16} {'body repeated':>14} {'body shared':>12} {'whole repeated':>15} {'whole shared':>13}")
    for case, *_ in table:
        t = profile_pass(out / "models" / case, corpus)
        print(f"{case:<16} {t['body repeated']:14.3f} {t['body shared']:12.3f} {t['whole repeated']:15.3f} "
              f"{t['whole shared']:13.3f}")


if __name__ == "__main__":
    main()
