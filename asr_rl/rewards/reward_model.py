"""A learned reward model (`reward_pretrain=DIR`): a Hugging Face sequence-classification model
with one output, scoring the prompt and response rendered as a chat, behind the reward contract."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from asr_rl.rewards.base import RewardOutput, Sample, check_output


def load_reward_model(path: str | Path, device: str = "cpu"):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from asr_rl.models.tokenizer import load_tokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"reward model folder {path} does not exist or has no config.json")
    config = AutoConfig.from_pretrained(path)
    if not any(a.endswith("ForSequenceClassification") for a in (config.architectures or [])):
        raise ValueError(f"{path} holds a {config.architectures} model; a reward model is a "
                         "*ForSequenceClassification model with one label (train one with `asr-rl train rm`)")
    model = AutoModelForSequenceClassification.from_pretrained(path).to(device).eval()
    tokenizer = load_tokenizer(path)
    return model, tokenizer


def render_pair(tokenizer, prompt: str, response: str) -> str:
    """The text a reward model scores: the chat (user prompt, assistant response) when the tokenizer
    has a template, else prompt and response on two lines."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt},
                                              {"role": "assistant", "content": response}], tokenize=False)
    return f"{prompt}\n{response}"


@torch.no_grad()
def score_texts(model, tokenizer, texts: list[str], batch_size: int = 32, max_len: int = 1024) -> torch.Tensor:
    """`(N,)` scalar scores; the model reads the last non-padding token (HF's sequence classifiers)."""
    device = next(model.parameters()).device
    out = []
    for i in range(0, len(texts), batch_size):
        enc = tokenizer(texts[i:i + batch_size], return_tensors="pt", padding=True, truncation=True,
                        max_length=max_len, add_special_tokens=False).to(device)
        out.append(model(**enc).logits[:, 0].float().cpu())
    return torch.cat(out)


class RewardModelReward:
    """The reward contract over a reward model: reward = the model's score of `prompt(sample)` and the
    hypothesis. The text path's reward model reads the sample's prompt; a judge (rewards/judge.py)
    reads the utterance's context list instead, under the term name `kind`."""

    def __init__(self, path: str | Path, device: str = "cpu", prompt: Callable[[Sample], str] | None = None,
                 kind: str = "reward_model"):
        self.name, self.kind = f"{kind}:{Path(path).name}", kind
        self.prompt = prompt or (lambda s: s.prompt)
        self.model, self.tokenizer = load_reward_model(path, device)

    def __call__(self, samples: list[Sample]) -> RewardOutput:
        texts = [render_pair(self.tokenizer, self.prompt(s), s.hypothesis) for s in samples]
        scores = score_texts(self.model, self.tokenizer, texts).tolist()
        return check_output(self.name, RewardOutput(scores, terms={self.kind: scores}), len(samples))
