"""Benchmark: the acoustic scorer's training step, BiLSTM body against the convolutional one (issue 54, point 8).

    OMP_NUM_THREADS=1 python scripts/bench_scorer_body.py [--frames 100] [--batch 16] [--steps 20]

One optimiser step (forward, CTC loss, backward, AdamW) on frame states of the demo's shape: Whisper
tiny.en's width (384), 1,500 frames cut to `--frames` per utterance (25 frames/s: 4 s), `--batch`
utterances of 60-100% of that length, 30 characters each, the default width and depth (256, 2
layers; `--conv-layers` the convolutional body's depths). Prints the median step time of each body and
the ratio to the BiLSTM, measured side by side in one run, one thread. It times the scorer alone:
the encoder's states come from the cache in `train scorer`, so this is the step's own cost; whether
the conv body ranks transcripts as well is scripts/bench_scorer_ranking.py's question.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from asr_rl.rewards.acoustic_scorer import AcousticScorer


def step_times(scorer: AcousticScorer, states, texts, steps: int, warmup: int = 3) -> list[float]:
    opt = torch.optim.AdamW(scorer.parameters(), lr=1e-3)
    out = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        scorer.loss(states, texts).backward()
        opt.step()
        if i >= warmup:
            out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=100)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--conv-layers", default="2,4", help="the conv body's depths to time")
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    chars = list("abcdefghijklmnopqrstuvwxyz '")
    lengths = torch.randint(int(0.6 * args.frames), args.frames + 1, (args.batch,), generator=gen)
    states = [torch.randn(int(n), 384, generator=gen) for n in lengths]
    texts = ["".join(chars[i] for i in torch.randint(0, 26, (30,), generator=gen)) for _ in states]
    rows = {}
    for body, layers in (("lstm", 2), *(("conv", int(k)) for k in args.conv_layers.split(","))):
        torch.manual_seed(0)
        scorer = AcousticScorer(384, chars, hidden=256, layers=layers, labels_per_frame=2, body=body)
        rows[f"{body}, {layers} layers"] = (layers, sum(p.numel() for p in scorer.parameters()),
                      statistics.median(step_times(scorer.train(), states, texts, args.steps)))
    print(f"scorer step, {args.batch} utterances of <= {args.frames} frames, median of {args.steps} steps, 1 thread")
    print("| body | parameters | step ms | vs lstm |")
    print("|---|---:|---:|---:|")
    base = rows["lstm, 2 layers"][2]
    for body, (_, params, t) in rows.items():
        print(f"| {body} | {params:,} | {1000 * t:.1f} | {t / base:.2f}x |")


if __name__ == "__main__":
    main()
