"""Built-in or user-file rewards scored in parallel Ray actors (`reward.num_workers`).

Each actor loads the reward once (a user file is imported in the actor's process) and scores a
contiguous chunk of the batch, cut between utterances' groups (a term such as `consensus` reads a
sample's whole group; rewards/groups.py); the pool reassembles the chunks in order behind the same reward
contract, so the loop cannot tell it from an inline reward.
"""
from __future__ import annotations

import ray

from asr_rl.rewards.base import RewardError, RewardOutput, Sample, check_output
from asr_rl.rewards.groups import group_chunks


@ray.remote(num_cpus=0)
class RewardActor:
    def __init__(self, source):
        """`source`: a spec string (`builtin:asr`, `PATH.py`) or a `RewardConfig`."""
        from asr_rl.rewards.pipeline import load_reward_spec, make_reward

        self.reward = load_reward_spec(source) if isinstance(source, str) else make_reward(source)

    def score(self, samples: list[Sample]) -> RewardOutput:
        return self.reward(samples)


class RayRewardPool:
    def __init__(self, source, num_workers: int, timeout: float = 300.0):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        label = source if isinstance(source, str) else (source.file or ",".join(source.terms))
        self.name = f"ray[{label}]"
        self.timeout = timeout
        self.actors = [RewardActor.remote(source) for _ in range(num_workers)]

    def __call__(self, samples: list[Sample]) -> RewardOutput:
        cuts = group_chunks([s.group_id for s in samples], parts=len(self.actors))
        chunks = [(a, samples[a:b]) for a, b in cuts]
        refs = [a.score.remote(c) for a, (_, c) in zip(self.actors, chunks)]
        outs = []
        for (start, chunk), ref in zip(chunks, refs):
            try:
                outs.append(check_output(self.name, ray.get(ref, timeout=self.timeout), len(chunk)))
            except (ray.exceptions.RayError, RewardError) as e:
                cause = getattr(e, "cause", None) or e
                raise RewardError(f"reward {self.name!r} failed on samples {start}-{start + len(chunk) - 1}: "
                                  f"{type(cause).__name__}: {cause}") from None
        return _merge(outs)

    def shutdown(self) -> None:
        for a in self.actors:
            ray.kill(a)


def _merge(outs: list[RewardOutput]) -> RewardOutput:
    terms: dict[str, list] = {}
    for o in outs:
        for name, vals in o.terms.items():
            terms.setdefault(name, []).extend(vals)
    scores = None if any(o.scores is None for o in outs) else [s for o in outs for s in o.scores]
    logs: dict[str, float] = {}
    for o in outs:
        for key, v in o.extra_logs.items():
            logs[key] = logs.get(key, 0.0) + v / len(outs)
    return RewardOutput([r for o in outs for r in o.rewards], scores=scores, terms=terms, extra_logs=logs)
