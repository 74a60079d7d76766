"""A judge: a reward model that scores a transcript given only its utterance's context list, no
reference (`reward.judge=DIR`, or `asr-rl reward serve --reward judge:DIR`).

Trained with `asr-rl train rm` on text pairs a user makes without audio (`asr-rl data judge-pairs`:
domain sentences against copies with recognition errors), it is the text RLHF path's reward model
used for speech: the reward for unlabelled in-domain audio that arXiv:2506.11091 gets from an LLM
judging each hypothesis with the domain's context. Scores are the model's raw outputs; GRPO's group
baseline makes their scale irrelevant.
"""
from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

from asr_rl.data.judge_pairs import judge_prompt
from asr_rl.rewards.base import RewardError, Sample
from asr_rl.rewards.reward_model import RewardModelReward


def JudgeReward(path: str | Path, device: str = "cpu") -> RewardModelReward:  # noqa: N802 (a reward, named as one)
    """The reward model in `path` as a judge: reward = its score of `judge_prompt(context)` and the
    hypothesis (the same rendering `data judge-pairs` wrote for `train rm`); it reads no reference."""
    return RewardModelReward(path, device, prompt=lambda s: judge_prompt(s.context), kind="judge")


@lru_cache(maxsize=2)
def _judge(path: str) -> RewardModelReward:
    return JudgeReward(path)


def judge_scores(samples: list[Sample], model: str | None) -> list[float]:
    """The `plausibility` term (registered in terms.py): sigmoid of the judge's score, in (0, 1) so that it
    weighs as the other terms do (under the Bradley-Terry model `train rm` fits, the probability that
    the transcript is preferred to one the judge scores 0); one judge per folder, loaded once."""
    if model is None:
        raise RewardError("the plausibility term needs its judge: reward.term_options={plausibility: {model: DIR}} "
                          "(made by `asr-rl train rm` on `asr-rl data judge-pairs`)")
    return [1.0 / (1.0 + math.exp(-r)) for r in _judge(str(Path(model).resolve()))(samples).rewards]
