"""`asr-rl eval --verifier FILE.py [--verifier-pass 1.0]`: a domain's checker of transcripts.

The verifier is a reward file (`rewards/plugins.py`: OpenRLHF's `reward_func` or TRL-style
functions) called once per test set with one `Sample` per scored line, built as the trainer builds
them: the hypothesis, the reference, language, keywords, context, duration and the line's other
manifest fields as `metadata` (e.g. `entities`); the utterance id is the prompt, and the response is
the transcript (eval keeps no raw response). A line passes when its reward reaches the threshold.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from asr_rl.rewards.base import Sample, check_output


@dataclass(frozen=True)
class Verifier:
    reward: object  # a Reward: list[Sample] -> RewardOutput
    threshold: float = 1.0
    path: str = ""


def load_verifier(path: str | Path, threshold: float = 1.0) -> Verifier:
    """The reward `path` defines, as a verifier passing at `threshold`."""
    from asr_rl.rewards.plugins import load_reward_file

    return Verifier(load_reward_file(path), float(threshold), str(path))


def verifier_from_args(path: str | Path | None, threshold: float | None) -> Verifier | None:
    """`--verifier PATH [--verifier-pass T]` (T 1.0 unless given); a threshold alone is an error."""
    if path is None:
        if threshold is not None:
            raise ValueError("--verifier-pass sets the threshold of a --verifier FILE.py: give the verifier too")
        return None
    return load_verifier(path, 1.0 if threshold is None else threshold)


def verify(results: list, verifier: Verifier) -> list:
    """`results` (UtteranceResults) with `verifier_reward` and `verifier_pass` set on those scored
    (without `error`); the others unchanged."""
    idx = [i for i, r in enumerate(results) if r.error is None]
    if not idx:
        return list(results)
    samples = [Sample(hypothesis=r.hypothesis, reference=r.reference, language=r.language, keywords=tuple(r.keywords),
                      prompt=r.id, response=r.hypothesis, predicted_language=r.predicted_language,
                      duration=r.duration or None, group_id=k, context=tuple(r.context), metadata=dict(r.metadata))
               for k, r in enumerate(results[i] for i in idx)]
    name = getattr(verifier.reward, "name", verifier.path)
    rewards = check_output(name, verifier.reward(samples), len(samples)).rewards
    out = list(results)
    for i, reward in zip(idx, rewards):
        out[i] = replace(out[i], verifier_reward=reward, verifier_pass=reward >= verifier.threshold)
    return out
