"""`asr-rl data pairs`: preference pairs from a model's own N-best lists.

For each utterance the model samples n hypotheses (the RL rollout engine, with one seed per
hypothesis), the configured reward scores them (CER, keywords, language, fluency: the same terms
as GRPO), and pairs of distinct transcripts are kept: the best against the worst, or every pair
whose scores differ by more than `margin`. Each pair is written as a manifest line plus `chosen`,
`rejected`, `chosen_score`, `rejected_score`: what `asr-rl train dpo` (and `kto`) reads.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

from asr_rl.data.manifest import manifest_row

log = logging.getLogger("asr_rl.pairs")


@dataclass(frozen=True)
class PairsReport:
    utterances: int
    pairs: int
    tied: int  # utterances whose distinct hypotheses all scored within the margin
    seconds: float


def select_pairs(hypotheses: list[tuple[str, float]], mode: str, margin: float) -> list[tuple[str, float, str, float]]:
    """(chosen, score, rejected, score) from scored transcripts: the best distinct transcript against
    the worst (`best_worst`) or every pair of distinct ones (`all`), when the scores differ by more
    than `margin`. Equal transcripts keep their best score."""
    best: dict[str, float] = {}
    for text, score in hypotheses:
        if text.strip():
            best[text] = max(score, best.get(text, float("-inf")))
    ranked = sorted(best.items(), key=lambda kv: -kv[1])
    if mode == "best_worst":
        candidates = [(ranked[0], ranked[-1])] if len(ranked) > 1 else []
    elif mode == "all":
        candidates = list(combinations(ranked, 2))
    else:
        raise ValueError(f"pair mode {mode!r}: use best_worst or all")
    return [(c, sc, r, sr) for (c, sc), (r, sr) in candidates if sc - sr > margin]


def build_pairs(model: str, manifest: str, out: str, *, n: int = 8, temperature: float = 1.0, top_p: float = 1.0,
                max_new_tokens: int = 96, mode: str = "best_worst", margin: float = 0.0, batch_size: int = 8,
                reward_cfg=None, seed: int = 0, device: str = "cpu") -> PairsReport:
    """Sample, score and write the pairs of every utterance of `manifest` to `out` (JSONL)."""
    from asr_rl.data.batching import lazy_batch
    from asr_rl.data.manifest import read_manifest
    from asr_rl.models.audio_policy import AudioPolicy
    from asr_rl.models.sampling import sequence_seed
    from asr_rl.rewards.base import check_output
    from asr_rl.rewards.pipeline import make_reward
    from asr_rl.rewards.config import RewardConfig
    from asr_rl.trainer.configs.rl import RolloutConfig
    from asr_rl.trainer.rollout.experience import Group, make_samples
    from asr_rl.trainer.rollout.engines import HFRolloutEngine

    utts = read_manifest(manifest)
    policy = AudioPolicy.from_pretrained(model, device=device).eval()
    policy.requires_grad_(False)  # inference: the encoder cache serves every hypothesis
    engine, reward = HFRolloutEngine(policy), make_reward(reward_cfg or RewardConfig())
    rollout = RolloutConfig(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                            n_samples_per_prompt=n)
    start, written, tied = time.perf_counter(), 0, 0
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for b in range(0, len(utts), batch_size):
            chunk = utts[b:b + batch_size]
            rows = policy.encode_batch(lazy_batch(chunk, policy.sample_rate))
            seeds = [sequence_seed(seed, 0, 0, u.id, j) for u in chunk for j in range(n)]
            sampled = engine.generate(rows, n, rollout, seeds)
            groups = [Group(u, r, s.ids, policy.pad_responses(s.ids).texts) for u, r, s in zip(chunk, rows, sampled)]
            samples = make_samples(groups, policy.parse)
            scores = check_output("reward", reward(samples), len(samples)).rewards
            for i, u in enumerate(chunk):
                hyps = [(s.hypothesis, scores[i * n + j]) for j, s in enumerate(samples[i * n:(i + 1) * n])]
                pairs = select_pairs(hyps, mode, margin)
                tied += not pairs
                for c, sc, r, sr in pairs:
                    f.write(json.dumps({**manifest_row(u), "chosen": c, "rejected": r, "chosen_score": sc,
                                        "rejected_score": sr}, ensure_ascii=False) + "\n")
                    written += 1
    report = PairsReport(len(utts), written, tied, time.perf_counter() - start)
    log.info("%d pairs from %d utterances (%d without one) in %.1f s", written, len(utts), tied, report.seconds)
    return report


__all__ = ["build_pairs", "select_pairs", "PairsReport"]
