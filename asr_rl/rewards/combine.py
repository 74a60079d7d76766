"""A weighted sum of built-in terms behind the reward contract, and the builder that picks the
reward a config asks for."""
from __future__ import annotations

from asr_rl.rewards.base import RewardError, RewardOutput, Sample, check_output
from asr_rl.rewards.config import RewardConfig
from asr_rl.rewards.terms import get_term


class WeightedReward:
    """reward_i = sum_k w_k * term_k(sample_i); every term is logged."""

    name = "builtin"

    def __init__(self, weights: dict[str, float], options: dict[str, dict] | None = None):
        if not weights:
            raise ValueError("reward.terms is empty: give at least one term, e.g. {cer: 1.0}")
        self.terms = {name: get_term(name) for name in weights}
        self.weights = dict(weights)
        self.options = options or {}
        unknown = set(self.options) - set(self.terms)
        if unknown:
            raise ValueError(f"reward.term_options names terms that are not in reward.terms: {sorted(unknown)}")

    def __call__(self, samples: list[Sample]) -> RewardOutput:
        values: dict[str, list[float]] = {}
        for name, fn in self.terms.items():
            try:
                values[name] = fn(samples, **self.options.get(name, {}))
            except Exception as e:  # name the term, not just the traceback
                raise RewardError(f"reward term {name!r} raised {type(e).__name__}: {e}") from e
        total = [sum(self.weights[k] * values[k][i] for k in values) for i in range(len(samples))]
        return check_output(self.name, RewardOutput(rewards=total, terms=values), len(samples))


def build_reward(cfg: RewardConfig):
    """The reward the config selects: a remote server, a user file, or the built-in terms."""
    if cfg.remote_url:
        import os

        from asr_rl.rewards.client import RemoteReward

        return RemoteReward(cfg.remote_url, token=cfg.remote_token or os.environ.get("ASR_RL_REWARD_TOKEN"),
                            timeout=cfg.remote_timeout, max_retries=cfg.remote_max_retries)
    if cfg.file:
        from asr_rl.rewards.plugins import load_reward_file

        return load_reward_file(cfg.file)
    return WeightedReward(cfg.terms, cfg.term_options)
