"""Reward configuration (the `reward.*` keys of every RL config)."""
from __future__ import annotations

from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any

from asr_rl.settings import setting


@dataclass(frozen=True)
class RewardConfig:
    """Attributes:
        terms: built-in terms and their weights, e.g. `{cer: 1.0, keyword: 0.3}`; null with a
            `file` or `remote_url` reward (terms set there do not apply and are refused).
        term_options: per-term keyword arguments, e.g. `{cer: {floor: -1.0}}`.
        file: a user `.py` file defining `reward_func` (OpenRLHF) or TRL-style functions.
        remote_url: comma-separated reward servers speaking OpenRLHF's `/get_reward` protocol.
        judge: a reward-model folder that scores each transcript given its context list, no
            reference (`asr-rl train rm` on `asr-rl data judge-pairs`: rewards/judge.py).
        remote_token: bearer token for the servers (default: $ASR_RL_REWARD_TOKEN).
        remote_timeout: seconds per request before it is retried.
        remote_max_retries: attempts per request before the step fails.
        num_workers: with backend=ray, score local/built-in rewards in this many Ray tasks (0 = inline).
        timeout: seconds a local reward (built-in terms or `file`) may take for one batch before the
            step stops with an error naming the reward and the samples (remote rewards use
            `remote_timeout`).
    """

    terms: dict[str, float] | None = field(default_factory=lambda: {"cer": 1.0})
    term_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    file: str | None = None
    remote_url: str | None = None
    judge: str | None = None
    remote_token: str | None = None
    remote_timeout: float = setting(30.0, gt=0)
    remote_max_retries: int = setting(3, ge=1)
    num_workers: int = setting(0, ge=0)
    timeout: float = setting(300.0, gt=0)

    def __post_init__(self) -> None:
        if self.file and self.remote_url:
            raise ValueError("set reward.file or reward.remote_url, not both (serve the file with "
                             "`asr-rl reward serve --reward FILE.py` to use it remotely)")
        if self.judge and (self.file or self.remote_url):
            raise ValueError("set reward.judge, reward.file or reward.remote_url, one of them (serve the judge with "
                             "`asr-rl reward serve --reward judge:DIR` to use it remotely)")
        # a setting that does not apply to the reward chosen is a mistake, not a no-op
        default = RewardConfig.__dataclass_fields__
        keys = ("remote_timeout", "remote_max_retries", "remote_token", "timeout", "terms", "term_options")
        changed = {k for k in keys if getattr(self, k) not in (None, default[k].default_factory() if
                                                                 default[k].default_factory is not MISSING
                                                                 else default[k].default)}
        kind = "remote_url" if self.remote_url else "file" if self.file else "judge" if self.judge else "terms"
        if kind == "terms" and not self.terms:
            raise ValueError("reward.terms is empty: give built-in terms (e.g. {cer: 1.0}), reward.file or "
                             "reward.remote_url")
        applies = {"remote_url": {"remote_timeout", "remote_max_retries", "remote_token"},
                   "file": {"timeout"}, "judge": {"timeout"}, "terms": {"timeout", "terms", "term_options"}}[kind]
        extra = sorted(changed - applies)
        if extra:
            why = {"remote_url": " (a remote reward's time limit is reward.remote_timeout)",
                   "file": " (a reward file computes its own terms)",
                   "judge": " (the judge is the whole reward)",
                   "terms": " (remote settings need reward.remote_url)"}[kind]
            clear = "; a config file's terms can be cleared with reward.terms=null" if "terms" in extra else ""
            names = ", ".join(f"reward.{k}" for k in extra)
            raise ValueError(f"{names} does not apply to a reward given by reward.{kind}{why}{clear}")
        self._check_names(kind)

    def _check_names(self, kind: str) -> None:
        """Term names and server URLs are checked here, at config load, so that a typo stops the
        run before any model loads or Ray starts."""
        if kind == "remote_url":
            from asr_rl.rewards.client import endpoints

            try:
                endpoints(self.remote_url)
            except ValueError as e:
                raise ValueError(f"reward.remote_url: {e}") from None
        elif kind == "file" and Path(self.file).is_file():  # a missing one is named by the run's path checks
            from asr_rl.rewards.plugins import load_reward_file

            try:
                load_reward_file(self.file)  # imported and its functions checked, before any model loads
            except (ValueError, FileNotFoundError) as e:
                raise ValueError(f"reward.file: {e}") from None
        elif kind == "judge" and not (Path(self.judge) / "config.json").is_file():
            raise ValueError(f"reward.judge: {self.judge} is not a reward-model folder (no config.json); make one with "
                             "`asr-rl data judge-pairs` and `asr-rl train rm`")
        elif kind == "terms":
            from asr_rl.rewards.terms import TERMS

            for name in self.terms:
                try:
                    TERMS.check(name)
                except ValueError as e:
                    raise ValueError(f"reward.terms: {e}") from None
            unknown = sorted(set(self.term_options) - set(self.terms))
            if unknown:
                raise ValueError(f"reward.term_options names terms that are not in reward.terms: {unknown}")
            from asr_rl.rewards.term_options import check_term_options

            for name in self.terms:  # a term that needs an option (a folder) is named without one, too
                check_term_options(name, self.term_options.get(name, {}), TERMS.get(name),
                                   TERMS.spec(name).check_options)
