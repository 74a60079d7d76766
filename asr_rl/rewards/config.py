"""Reward configuration (the `reward.*` keys of every RL config)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RewardConfig:
    """Attributes:
        terms: built-in terms and their weights, e.g. `{cer: 1.0, keyword: 0.3}`.
        term_options: per-term keyword arguments, e.g. `{cer: {floor: -1.0}}`.
        file: a user `.py` file defining `reward_func` (OpenRLHF) or a TRL-style function.
        remote_url: comma-separated reward servers speaking OpenRLHF's `/get_reward` protocol.
    """

    terms: dict[str, float] = field(default_factory=lambda: {"cer": 1.0})
    term_options: dict[str, dict] = field(default_factory=dict)
    file: str | None = None
    remote_url: str | None = None
