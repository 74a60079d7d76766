"""A weighted sum of built-in terms behind the reward contract, and the time limit a local reward
runs under (which reward a config asks for is chosen in pipeline.py)."""
from __future__ import annotations

import queue
import threading

from asr_rl.rewards.base import RewardError, RewardOutput, Sample, check_output
from asr_rl.rewards.terms import TERMS, get_term


class WeightedReward:
    """reward_i = sum_k w_k * term_k(sample_i) over the terms that apply to sample i (a term that
    needs the reference does not apply to an unlabelled sample, whose value is then None in the
    logged terms); every term is logged."""

    name = "builtin"

    def __init__(self, weights: dict[str, float], options: dict[str, dict] | None = None):
        if not weights:
            raise ValueError("reward.terms is empty: give at least one term, e.g. {cer: 1.0}")
        self.terms = {name: get_term(name) for name in weights}
        self.needs_reference = {name for name in weights if TERMS.spec(name).needs_reference}
        self.weights = dict(weights)
        self.options = options or {}
        unknown = set(self.options) - set(self.terms)
        if unknown:
            raise ValueError(f"reward.term_options names terms that are not in reward.terms: {sorted(unknown)}")

    def __call__(self, samples: list[Sample]) -> RewardOutput:
        values: dict[str, list[float | None]] = {}
        labelled = [i for i, s in enumerate(samples) if s.reference is not None]
        for name, fn in self.terms.items():
            rows = labelled if name in self.needs_reference else range(len(samples))
            try:
                scored = fn([samples[i] for i in rows], **self.options.get(name, {})) if rows else []
            except Exception as e:  # name the term, not just the traceback
                raise RewardError(f"reward term {name!r} raised {type(e).__name__}: {e}") from e
            values[name] = [None] * len(samples)
            for i, v in zip(rows, scored, strict=True):
                values[name][i] = v
        total = []
        for i, s in enumerate(samples):
            applied = [self.weights[k] * v[i] for k, v in values.items() if v[i] is not None]
            if not applied:
                raise RewardError(f"sample {i} ({s.prompt!r}) has no reference and every reward term "
                                  f"({', '.join(self.terms)}) needs one; add a term that needs none "
                                  f"({', '.join(TERMS.where(needs_reference=False))})")
            total.append(sum(applied))
        return check_output(self.name, RewardOutput(rewards=total, terms=values), len(samples))


class TimedReward:
    """A local reward with a time limit: a call that overruns `timeout` seconds stops the step with
    an error naming the reward and the samples. The call runs in a daemon thread, which Python
    cannot stop: the error ends the run, and the thread with it."""

    def __init__(self, reward, timeout: float):
        self.reward, self.timeout = reward, timeout
        self.name = getattr(reward, "name", type(reward).__name__)

    def __call__(self, samples: list[Sample]) -> RewardOutput:
        box: queue.Queue = queue.Queue(maxsize=1)

        def run() -> None:
            try:
                box.put((True, self.reward(samples)))
            except BaseException as e:  # re-raised in the caller's thread
                box.put((False, e))

        threading.Thread(target=run, name=f"reward-{self.name}", daemon=True).start()
        try:
            ok, value = box.get(timeout=self.timeout)
        except queue.Empty:
            ids = sorted({s.prompt for s in samples})
            raise RewardError(f"reward {self.name!r} did not return within reward.timeout={self.timeout:g} s for "
                              f"{len(samples)} samples (utterances {', '.join(map(str, ids[:5]))}"
                              f"{', ...' if len(ids) > 5 else ''}); fix the reward or raise reward.timeout") from None
        if not ok:
            raise value
        return value

    def __getattr__(self, name):  # shutdown() and the like reach the wrapped reward
        if name.startswith("__") or name == "reward":
            raise AttributeError(name)
        return getattr(self.reward, name)
