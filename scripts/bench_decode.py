"""Decoding a batch's audio on the loader's decoding threads against one at a time (issue 40).

    python scripts/bench_decode.py --manifest data/demo_corpus_3000/train.jsonl [--limit 200] [--workers 2]

Loads (reads, resamples and augments with the default augmentation) the manifest's first `--limit`
utterances as one lazy batch, for epochs 0-2 (the same variants in both arms), in the calling
thread and on `--workers` decoding threads, the arms taking turns; prints ms per utterance (best
epoch of each run) and the ratio.
"""
from __future__ import annotations

import argparse
import time

from asr_rl.data.augment import AugmentConfig, VariantAugmenter
from asr_rl.data.batching import lazy_batch
from asr_rl.data.manifest import read_manifest


def ms_per_utterance(utts, augmenter, workers: int) -> float:
    best = float("inf")
    for epoch in range(3):
        batch = lazy_batch(utts, augmenter=augmenter, epoch=epoch, workers=workers)
        start = time.perf_counter()
        batch.load(range(len(utts)))
        best = min(best, time.perf_counter() - start)
    return 1000 * best / len(utts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--manifest", required=True)
    p.add_argument("--limit", type=int, default=200)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    utts = list(read_manifest(args.manifest))[: args.limit]
    augmenter = VariantAugmenter(AugmentConfig(), seed=0)
    serial, threads = [], []
    for _ in range(args.rounds):
        serial.append(ms_per_utterance(utts, augmenter, 0))
        threads.append(ms_per_utterance(utts, augmenter, args.workers))
    print(f"| utterances | calling thread ms/utt | {args.workers} decoding threads ms/utt | x |")
    print("|---:|---:|---:|---:|")
    print(f"| {len(utts)} | {min(serial):.2f} | {min(threads):.2f} | {min(serial) / min(threads):.2f} |")


if __name__ == "__main__":
    main()
