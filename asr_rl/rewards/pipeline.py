"""Which reward scores a run: `make_reward` (from a config) and `load_reward_spec` (from the
`asr-rl reward serve --reward` string). Everything that needs a reward gets it from here.

How the scores are then shaped before the advantages (term aggregation, length penalties) is
`asr_rl.algos.reward_shaping.shape_rewards`, called once per step by the trainer.
"""
from __future__ import annotations

import os

from asr_rl.rewards.combine import TimedReward, WeightedReward
from asr_rl.rewards.config import RewardConfig
from asr_rl.rewards.plugins import load_reward_file
from asr_rl.rewards.terms import DEFAULT_ASR_TERMS


def make_reward(cfg: RewardConfig, reward_pretrain: str | None = None, device: str = "cpu"):
    """The reward a run scores with, chosen here and nowhere else: a reward model (`reward_pretrain`,
    the text RLHF path), remote servers (`reward.remote_url`), a user file (`reward.file`), or the
    built-in terms (`reward.terms`); local ones run under `reward.timeout`. Where it runs (in this
    process or in a pool of Ray reward workers) is the trainer's choice, not the reward's."""
    if reward_pretrain:
        from asr_rl.rewards.reward_model import RewardModelReward

        return RewardModelReward(reward_pretrain, device)
    if cfg.remote_url:
        from asr_rl.rewards.client import RemoteReward

        return RemoteReward(cfg.remote_url, token=cfg.remote_token or os.environ.get("ASR_RL_REWARD_TOKEN"),
                            timeout=cfg.remote_timeout, max_retries=cfg.remote_max_retries)
    if cfg.file:
        return TimedReward(load_reward_file(cfg.file), cfg.timeout)
    if cfg.judge:
        from asr_rl.rewards.judge import JudgeReward

        return TimedReward(JudgeReward(cfg.judge, device), cfg.timeout)
    return TimedReward(WeightedReward(cfg.terms, cfg.term_options), cfg.timeout)


def check_reward_coverage(cfg: RewardConfig, utterances: list, what: str = "train_manifest",
                          unlabelled: tuple[int, str | None] | None = None) -> None:
    """The rule for unlabelled lines (`text` absent: `Utterance.text is None`), checked before any
    model loads: each line gets the built-in terms it can be scored by. Refused, naming the term and
    the first such line: a pool with unlabelled lines whose terms all need the reference (those
    lines would get no reward), and a term that needs the reference when no line has one (it would
    never apply). A reward file or server gets None as those lines' reference and decides itself; a
    judge never reads one. `unlabelled`: `count_unlabelled(utterances)` when the caller has it."""
    from asr_rl.rewards.terms import TERMS

    if cfg.file or cfg.remote_url or cfg.judge or not cfg.terms:
        return
    n_unlabelled, first = unlabelled or count_unlabelled(utterances)
    if not n_unlabelled:
        return
    needy = [t for t in cfg.terms if TERMS.spec(t).needs_reference]
    free = TERMS.where(needs_reference=False)
    if len(needy) == len(cfg.terms):
        raise ValueError(f"{what}: reward term {needy[0]!r} needs the transcript and {first} has none "
                         f"({n_unlabelled} of {len(utterances)} lines are unlabelled); add a term that needs "
                         f"none ({', '.join(free)}), a reward file (reward.file) or a reward server, or transcripts")
    if needy and n_unlabelled == len(utterances):
        raise ValueError(f"{what}: reward term {needy[0]!r} needs the transcript and no line has one (first: {first}): "
                         f"it would never apply; drop it or use the terms that need none ({', '.join(free)})")


def count_unlabelled(utterances) -> tuple[int, str | None]:
    """(how many of `utterances` have no `text`, how the first is named), in one pass that keeps
    none of them (a pool may hold millions; a packed table's transcripts are read without making
    its items)."""
    from asr_rl.data.utterance_table import column_of

    n, first = 0, None
    for i, text in enumerate(column_of(utterances, "text")):
        if text is None:
            n, first = n + 1, i if first is None else first
    return n, None if first is None else (utterances[first].source or utterances[first].id)


def _term_weight(spec: str, item: str) -> tuple[str, float]:
    name, _, weight = item.partition("=")
    try:
        return name.strip(), float(weight) if weight.strip() else 1.0
    except ValueError:
        raise ValueError(f"reward spec {spec!r}: weight of term {name.strip()!r} is not a number: {weight!r}") from None


def _spec_terms(spec: str) -> dict[str, float]:
    names = spec.split(":", 1)[1]
    return DEFAULT_ASR_TERMS if names == "asr" else dict(_term_weight(spec, n) for n in names.split(",") if n.strip())


def load_reward_spec(spec: str):
    """`builtin:asr` (the default multi-term ASR reward), `builtin:<term>[=<weight>][,...]` (weight 1.0
    when not given, e.g. `builtin:cer,keyword=0.5`), `judge:DIR` (rewards/judge.py), `acoustic:DIR` (the
    listening term, rewards/acoustic.py), or a `.py` path."""
    if spec.startswith("builtin:"):
        return WeightedReward(_spec_terms(spec))
    if spec.startswith("judge:"):
        from asr_rl.rewards.judge import JudgeReward

        return JudgeReward(reward_spec_config(spec).judge)
    if spec.startswith("acoustic:"):
        cfg = reward_spec_config(spec)
        return WeightedReward(cfg.terms, cfg.term_options)
    return load_reward_file(spec)


def reward_spec_config(spec: str) -> RewardConfig:
    """The `RewardConfig` of a `--reward` string (terms and file checked now, before any model
    loads): `builtin:...` as `load_reward_spec`, `judge:DIR`, a `.py` reward file, or `http(s)://`
    reward servers (comma-separated, as `reward.remote_url`); `make_reward` then builds it."""
    if spec.startswith("builtin:"):
        return RewardConfig(terms=dict(_spec_terms(spec)))
    if spec.startswith("judge:"):
        return RewardConfig(terms=None, judge=spec.split(":", 1)[1])
    if spec.startswith("acoustic:"):  # the listening term alone (rewards/acoustic.py)
        folder = spec.split(":", 1)[1]
        if not os.path.isfile(os.path.join(folder, "scorer.json")):
            raise FileNotFoundError(f"acoustic:{folder}: no acoustic scorer there (scorer.json); make one with "
                                    "`asr-rl train scorer`")
        term = "acoustic"  # the registered term (terms.py) that reads the folder
        return RewardConfig(terms={term: 1.0}, term_options={term: {"scorer": folder}})
    if spec.startswith(("http://", "https://")):
        return RewardConfig(terms=None, remote_url=spec)
    if spec.endswith(".py"):
        if not os.path.isfile(spec):
            raise FileNotFoundError(f"reward file {spec} does not exist")
        return RewardConfig(terms=None, file=spec)
    raise ValueError(f"reward {spec!r}: give builtin:asr, builtin:<term>[=<weight>],... (e.g. builtin:cer,fluency=0.2), "
                     "judge:DIR (a judge reward model), acoustic:DIR (an acoustic scorer), a .py reward file or an "
                     "http(s):// reward server")


__all__ = ["make_reward", "load_reward_spec", "reward_spec_config", "check_reward_coverage"]
