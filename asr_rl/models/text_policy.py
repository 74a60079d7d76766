"""The text policy: any Hugging Face causal LM with its tokenizer, for the general text RLHF path.

Prompts are rendered with the tokenizer's chat template (or taken as plain text), and everything
else (sampling, scoring, saving) is the shared `CausalPolicy`, so the RL loop runs text and audio
the same way.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from asr_rl.models.codec import ResponseCodec
from asr_rl.models.policy_base import CausalPolicy, PromptRow
from asr_rl.models.weights import load_strict, read_model_config


class TextPolicy(CausalPolicy):
    def __init__(self, model: nn.Module, tokenizer, apply_chat_template: bool = True, max_prompt_len: int = 1024):
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        forbidden = {tokenizer.pad_token_id} if tokenizer.pad_token_id != tokenizer.eos_token_id else set()
        super().__init__(model, tokenizer, ResponseCodec(tokenizer), forbidden)
        self.apply_chat_template = apply_chat_template and bool(getattr(tokenizer, "chat_template", None))
        self.max_prompt_len = max_prompt_len
        self.force_language = False

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                        **kwargs) -> "TextPolicy":
        from transformers import AutoModelForCausalLM

        from asr_rl.models.tokenizer import load_tokenizer

        config = read_model_config(path)
        if not any(a.endswith("ForCausalLM") for a in (config.architectures or [])):
            raise ValueError(f"{path} holds a {config.architectures} model, not a causal LM")
        model = load_strict(AutoModelForCausalLM, path, dtype).to(device)
        return cls(model, load_tokenizer(path), **kwargs)

    def body(self) -> nn.Module:
        return self.model.base_model

    def save_extra(self, path: str | Path) -> None:
        self.tokenizer.save_pretrained(path)

    def render(self, messages) -> str:
        if self.apply_chat_template:
            return self.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
        return "\n".join(str(m["content"]) for m in messages)

    def encode_batch(self, batch) -> list[PromptRow]:
        """Prompt rows for a `PromptBatch` (truncated from the left to `max_prompt_len` tokens)."""
        rows = []
        for item in batch.items:
            ids = self.tokenizer(self.render(item.messages), add_special_tokens=False)["input_ids"]
            rows.append(PromptRow(torch.as_tensor(ids[-self.max_prompt_len:], dtype=torch.long, device=self.device)))
        return rows

    def target_ids(self, texts: list[str], languages=None):
        """Given responses as token ids (+ EOS), right-padded (`languages` is for the audio API)."""
        return self.pad_responses([self.tokenizer(t, add_special_tokens=False)["input_ids"] + [self.eos_id]
                                   for t in texts])

    def embed_rows(self, rows: list[PromptRow]) -> tuple[torch.Tensor, torch.Tensor]:
        ids, mask = self.left_pad(rows)
        return self.model.get_input_embeddings()(ids), mask


def load_text_policy(path, model_cfg, device: str = "cpu", data_cfg=None) -> TextPolicy:
    """The text policy with the config's prompt rendering, freezing and LoRA applied (as
    `load_policy` for audio)."""
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[model_cfg.dtype]
    if not path:
        raise ValueError("`pretrain` is not set: give the starting model folder")
    policy = TextPolicy.from_pretrained(path, device=device, dtype=dtype)
    policy.shared_prefix, policy.prefix_attention = model_cfg.shared_prefix, model_cfg.prefix_attention
    if data_cfg is not None:
        policy.apply_chat_template = data_cfg.apply_chat_template and policy.apply_chat_template
        policy.max_prompt_len = data_cfg.max_prompt_len
    if model_cfg.freeze_patterns:
        policy.freeze(tuple(model_cfg.freeze_patterns))
    if model_cfg.lora_rank > 0:
        from asr_rl.models.lora import add_lora

        add_lora(policy, model_cfg.lora_rank, model_cfg.lora_alpha, model_cfg.lora_target_modules)
    return policy
