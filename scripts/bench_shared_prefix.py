"""Benchmark: one prompt forward per group (`model.shared_prefix=true`) against the prompt repeated
per sample (`false`, the reference path), side by side in one run; the shared arm twice: its
responses attending to the prompt's keys/values in place (`model.prefix_attention=grouped`) and to
a copy gathered per response (`gather`, the earlier path).

    python scripts/bench_shared_prefix.py [--steps 4] [--rounds 1] [--only demo,voxtral_tiny,qwen3_tiny_real]
                                          [--out exp/bench_sp]

Each case runs the real GRPO loop (`asr-rl train grpo`, local backend, 1 torch thread, float32) in a
process of its own per arm, on models `asr-rl model init` builds (random weights; responses are cut
at `--new-tokens`, 28 by default: the demo's SFT model answers in ~25-30 tokens), with a KL
reference (`init_kl_coef=0.01`) and two PPO epochs (`algo.max_epochs=2`), so every phase runs:
rollout (sampling), old/reference log-probs, update. The arms take turns per case (`--order`,
`--rounds` runs of `--steps` steps each) and the table gives medians over the steps after the first
of each run (its time includes start-up effects), and the peak RSS of each arm's process. Cases
(8 utterances x 8 samples each):
    demo             Qwen2-Audio `small` on the frozen Whisper tiny.en encoder (the demo's model)
    voxtral_tiny     Voxtral `tiny`: 30 s encoder chunks, 375 audio positions per prompt
    qwen3_tiny_real  Qwen3-ASR `tiny-real`: the released 151,936-token vocabulary
The corpus is `asr-rl data synth` (espeak-ng), 64 train utterances. Run with nothing else on the
machine: the ratio is measured side by side, the seconds are not comparable across machines.
A last table (`--profile-only`: that table alone) profiles one scoring pass per case, in process,
the arms taking turns: the LLM body alone against the whole pass (the LM head and the softmax over
the vocabulary are per response token, the same in every arm), the no-grad pass, and the memory
autograd saves for the body's backward (where the per-response prompt copy shows).
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


ARMS = {"repeated": ("false", "grouped"), "gather": ("true", "gather"), "grouped": ("true", "grouped")}


def grpo(model: Path, corpus: Path, out: Path, arm: str, steps: int, new_tokens: int) -> list[dict]:
    """Run the arm (unless its metrics are there) and return its metrics rows."""
    if not (out / "metrics.jsonl").is_file():
        run("train", "grpo", f"pretrain={model}", f"train_manifest={corpus / 'train.jsonl'}", f"output_dir={out}",
            f"max_steps={steps}", "save_steps=0", "eval_steps=0", "rollout_batch_size=8", "n_samples_per_prompt=8",
            f"max_new_tokens={new_tokens}", "rollout.dynamic_filtering=false", "micro_train_batch_size=16",
            "init_kl_coef=0.01", "algo.max_epochs=2", "actor_learning_rate=1e-5", "num_threads=1",
            f"model.shared_prefix={ARMS[arm][0]}", f"model.prefix_attention={ARMS[arm][1]}",
            "logging.tensorboard=false", "logging.progress_bar=false",
            threads=1)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def phase_seconds(runs: list[list[dict]]) -> dict[str, float]:
    """Median seconds per phase over the steps after the first of each run; rollout without reward
    scoring."""
    later = [r for rows in runs for r in (rows[1:] or rows)]
    rows = [r for rows in runs for r in rows]
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


def saved_mib(fn) -> float:
    """MiB of the tensors autograd keeps for the backward while `fn` runs its forward (each storage
    once): the activation memory of a scoring pass, without the allocator's noise."""
    import torch

    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values()) / 2**20


def profile_pass(model: Path, corpus: Path, n: int = 8, length: int = 28) -> dict[str, float]:
    """One micro-batch (2 prompts x n responses) per arm, the arms taking turns, best of 5 seconds:
    the LLM body forward + backward, the whole log-prob + entropy pass (LM head and softmax over
    the vocabulary) forward + backward, the no-grad log-prob pass (the old/reference one); and the
    MiB autograd saves for the body's backward: where the time and memory of a scoring pass go."""
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
    parts = {
        "body": lambda: policy.response_hidden(*policy.embed_rows(rows), responses, index).sum().backward(),
        "whole": lambda: sum(t.sum() for t in policy.logprobs(*policy.embed_rows(rows), responses, index,
                                                               with_entropy=True)).backward(),
        "no-grad": lambda: torch.no_grad()(policy.logprobs)(*policy.embed_rows(rows), responses, index),
    }
    out: dict[str, float] = {}
    for _ in range(5):
        for arm, (shared, attention) in ARMS.items():
            policy.shared_prefix, policy.prefix_attention = shared == "true", attention
            for part, fn in parts.items():
                start = time.perf_counter()
                fn()
                took = time.perf_counter() - start
                out[f"{part} {arm}"] = min(out.get(f"{part} {arm}", took), took)
    for arm, (shared, attention) in ARMS.items():
        policy.shared_prefix, policy.prefix_attention = shared == "true", attention
        out[f"MiB {arm}"] = saved_mib(lambda: policy.response_hidden(*policy.embed_rows(rows), responses, index))
    return out


def print_phases(table: list) -> None:
    print(f"\n{'case':<16} {'phase':<10} {'repeated s':>11} {'gather s':>9} {'x':>6} {'grouped s':>10} {'x':>6}")
    for case, res in table:
        rep, ga, gr = res["repeated"], res["gather"], res["grouped"]
        for name, _ in PHASES:
            x = lambda t: rep[name] / t[name] if t[name] > 0 else float("nan")  # noqa: E731
            print(f"{case:<16} {name:<10} {rep[name]:11.2f} {ga[name]:9.2f} {x(ga):5.2f}x {gr[name]:10.2f} {x(gr):5.2f}x")
        print(f"{case:<16} {'peak GiB':<10} {rep['peak GiB']:11.2f} {ga['peak GiB']:9.2f} {'':>6} {gr['peak GiB']:10.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=28)
    ap.add_argument("--only", default=",".join(CASES))
    ap.add_argument("--out", default="exp/bench_shared_prefix")
    ap.add_argument("--order", default="grouped,repeated,gather", help="the order the arms take turns in")
    ap.add_argument("--rounds", type=int, default=1, help="runs of --steps steps per arm, the arms taking turns")
    ap.add_argument("--profile-only", action="store_true", help="only the last table (no GRPO runs)")
    args = ap.parse_args()
    out = Path(args.out)
    corpus = out / "corpus"
    ensure_corpus(corpus, n_train=64, n_test=8)
    table = []
    for case in args.only.split(","):
        arch, size = CASES[case]
        model = ensure_model(out / "models" / case, arch, size, corpus)
        runs = {arm: [] for arm in args.order.split(",")}
        # the arms take turns, so a drift in the machine's load hits each alike
        for k in range(0 if args.profile_only else args.rounds):
            for arm in runs:
                runs[arm].append(grpo(model, corpus, out / "runs" / f"{case}_{arm}_{k}", arm, args.steps,
                                      args.new_tokens))
        table.append((case, {arm: phase_seconds(r) for arm, r in runs.items() if r}))
    if not args.profile_only:
        print_phases(table)
    print("\nwhere a scoring pass goes (2 prompts x 8 responses; best of 5 s, MiB saved for the body's backward):")
    print(f"{'case':<16} {'part':<8} {'repeated':>9} {'gather':>8} {'grouped':>8}   repeated / gather, grouped")
    for case, _ in table:
        t = profile_pass(out / "models" / case, corpus)
        for part in ("body", "whole", "no-grad", "MiB"):
            print(f"{case:<16} {part:<8} {t[part + ' repeated']:9.3f} {t[part + ' gather']:8.3f} "
                  f"{t[part + ' grouped']:8.3f}   x {t[part + ' repeated'] / t[part + ' gather']:.2f} / "
                  f"{t[part + ' repeated'] / t[part + ' grouped']:.2f}")


if __name__ == "__main__":
    main()
