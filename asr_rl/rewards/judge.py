"""A judge: a reward model that scores a transcript given only its utterance's context list, no
reference (`reward.judge=DIR`, or `asr-rl reward serve --reward judge:DIR`).

Trained with `asr-rl train rm` on text pairs a user makes without audio (`asr-rl data judge-pairs`:
domain sentences against copies with recognition errors), it is the text RLHF path's reward model
used for speech: the reward for unlabelled in-domain audio that arXiv:2506.11091 gets from an LLM
judging each hypothesis with the domain's context. Scores are the model's raw outputs; GRPO's group
baseline makes their scale irrelevant.
"""
from __future__ import annotations

from pathlib import Path

from asr_rl.data.judge_pairs import judge_prompt
from asr_rl.rewards.base import RewardOutput, Sample, check_output
from asr_rl.rewards.reward_model import load_reward_model, render_pair, score_texts


class JudgeReward:
    """The reward contract over a judge folder: reward = its score of `judge_prompt(context)` and
    the hypothesis (the same rendering `data judge-pairs` wrote for `train rm`)."""

    needs_reference = False

    def __init__(self, path: str | Path, device: str = "cpu"):
        self.name = f"judge:{Path(path).name}"
        self.model, self.tokenizer = load_reward_model(path, device)

    def __call__(self, samples: list[Sample]) -> RewardOutput:
        texts = [render_pair(self.tokenizer, judge_prompt(s.context), s.hypothesis) for s in samples]
        scores = score_texts(self.model, self.tokenizer, texts).tolist()
        return check_output(self.name, RewardOutput(scores, terms={"judge": scores}), len(samples))
