"""Reward configuration (the `reward.*` keys of every RL config)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RewardConfig:
    """Attributes:
        terms: built-in terms and their weights, e.g. `{cer: 1.0, keyword: 0.3}`.
        term_options: per-term keyword arguments, e.g. `{cer: {floor: -1.0}}`.
        file: a user `.py` file defining `reward_func` (OpenRLHF) or TRL-style functions.
        remote_url: comma-separated reward servers speaking OpenRLHF's `/get_reward` protocol.
        remote_token: bearer token for the servers (default: $ASR_RL_REWARD_TOKEN).
        remote_timeout: seconds per request before it is retried.
        remote_max_retries: attempts per request before the step fails.
        num_workers: with backend=ray, score local/built-in rewards in this many Ray tasks (0 = inline).
    """

    terms: dict[str, float] = field(default_factory=lambda: {"cer": 1.0})
    term_options: dict[str, dict] = field(default_factory=dict)
    file: str | None = None
    remote_url: str | None = None
    remote_token: str | None = None
    remote_timeout: float = 30.0
    remote_max_retries: int = 3
    num_workers: int = 0

    def __post_init__(self) -> None:
        if self.file and self.remote_url:
            raise ValueError("set reward.file or reward.remote_url, not both (serve the file with "
                             "`asr-rl reward serve --reward FILE.py` to use it remotely)")
