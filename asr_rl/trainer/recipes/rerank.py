"""`asr-rl eval --rerank N --reward SPEC`: N sampled transcripts per utterance, and the one a reward
that needs no transcript scores best is the answer; no training. It is what RL on that reward
amortises into one greedy decode, at N times the decoding cost (the test-time control of
scripts/bench_adapt.py; sampling-and-reranking as in best-of-N decoding, e.g. Nakano et al. 2021).

The reward sees every line as unlabelled (its transcript hidden), as RL on unlabelled audio does; the
choice is pseudo-label's best-of-N (`choose`: the highest reward, the first sample on ties; an empty
transcript only where the reward scores it strictly best, e.g. the silence term); an utterance whose samples are
all empty gets "". Samples are seeded per (utterance id, sample): a rerun decodes the same.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from asr_rl.data.manifest import Utterance
from asr_rl.evaluation.metrics import UtteranceResult
from asr_rl.rewards.base import RewardError
from asr_rl.trainer.configs.rl import RolloutConfig

log = logging.getLogger("asr_rl.eval")


NO_REFERENCE = ("reranking passes the reward no reference (every line's transcript is hidden, as on unlabelled "
                "audio: `labels` and `references` are None)")


@dataclass(frozen=True)
class Rerank:
    """`n` samples at `temperature` per utterance, reranked by the reward `reward` (a `--reward` spec:
    builtin:..., a .py file, acoustic:DIR, judge:DIR)."""

    n: int
    reward: str
    temperature: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n < 2:
            raise ValueError(f"--rerank needs at least 2 samples an utterance, got {self.n}")
        from asr_rl.rewards.pipeline import reward_spec_config
        from asr_rl.rewards.terms import TERMS

        needy = [t for t in reward_spec_config(self.reward).terms or () if TERMS.spec(t).needs_reference]
        if needy:  # checked before any model loads
            raise ValueError(f"--reward {self.reward}: {NO_REFERENCE}, and reward term {needy[0]!r} needs it; use terms "
                             f"that need none ({', '.join(TERMS.where(needs_reference=False))})")


def rerank_transcribe(rerank: Rerank, policy, utterances: list[Utterance], batch_size: int = 8,
                      max_new_tokens: int = 96, progress: bool = False) -> list[UtteranceResult]:
    """The reranked transcript of each utterance, in input order; one that cannot be decoded gets `error`
    (`functools.partial(rerank_transcribe, rerank)` is `asr-rl eval`'s `decode`)."""
    from tqdm import tqdm

    from asr_rl.rewards.pipeline import make_reward, reward_spec_config
    from asr_rl.trainer.recipes.pseudo_label import Labeller

    rollout = RolloutConfig(mode="sample", n_samples_per_prompt=rerank.n, temperature=rerank.temperature,
                            max_new_tokens=max_new_tokens)
    labeller = Labeller(policy, rollout, make_reward(reward_spec_config(rerank.reward)), rerank.seed)
    results: dict[str, UtteranceResult] = {}
    bad: list[str] = []
    for start in tqdm(range(0, len(utterances), batch_size), desc="rerank", disable=not progress, leave=False):
        chunk = utterances[start:start + batch_size]
        hidden = [dataclasses.replace(u, text=None) for u in chunk]  # the reward never reads the transcript
        shown = {id(h): u for h, u in zip(hidden, chunk)}
        try:
            labelled = labeller.label(hidden, bad)
        except RewardError as e:  # a reward file that reads the transcript it is not given
            raise RewardError(f"--reward {rerank.reward}: {e}; {NO_REFERENCE}: a reward that reads the transcript "
                              "cannot rerank") from e
        for h, label in labelled:
            u = shown[id(h)]
            results[u.id] = UtteranceResult(u.id, u.text, label["text"] or "", u.language, u.keywords,
                                            duration=u.duration or 0.0, speaker=u.speaker, context=u.context,
                                            metadata=dict(u.meta))
    for u in utterances:
        if u.id not in results:
            why = next((b for b in bad if b.startswith(f"{u.source}:")), "could not be decoded")
            results[u.id] = UtteranceResult(u.id, u.text, "", u.language, u.keywords, error=why, speaker=u.speaker,
                                            context=u.context, metadata=dict(u.meta))
    return [results[u.id] for u in utterances]
