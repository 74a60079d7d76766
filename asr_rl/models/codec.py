"""Turning response token ids into text and transcripts, without the model's weights.

The Ray controller decodes and parses every sample to score it; it needs the tokenizer and the
model family's output format, not a copy of the network.
"""
from __future__ import annotations

from pathlib import Path

import torch

from asr_rl.data.languages import LANGUAGE_NAMES


class ResponseCodec:
    def __init__(self, tokenizer, spec=None, force_language: bool = False):
        self.tokenizer = tokenizer
        self.spec = spec  # None: plain text responses (the text RLHF path)
        self.force_language = force_language
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    @classmethod
    def from_pretrained(cls, path: str | Path, force_language: bool = False) -> "ResponseCodec":
        from asr_rl.models.facts import ModelFacts
        from asr_rl.models.families import is_audio_llm
        from asr_rl.models.tokenizer import load_tokenizer

        model = ModelFacts(path)
        if is_audio_llm(model.model_type):
            return cls(model.tokenizer, model.spec, force_language)
        return cls(load_tokenizer(path))

    def decode_ids(self, ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
        """Rows of ids (with a 0/1 mask) -> text, EOS and padding dropped, other special tokens kept."""
        texts = []
        for row, m in zip(ids.tolist(), mask.tolist()):
            toks = [t for t, keep in zip(row, m) if keep and t not in (self.eos_id, self.pad_id)]
            texts.append(self.tokenizer.decode(toks, skip_special_tokens=self.spec is None))
        return texts

    def target_rows(self, texts: list[str], languages: list[str | None]) -> list[list[int]]:
        """Reference transcripts as the token ids the model should write (the family's assistant
        turn + EOS): the teacher-forced targets, and the off-policy group members of RL."""
        if self.spec is None:
            raise ValueError("a text policy has no transcript targets (the reference is for audio manifests)")
        targets = [self.spec.target_text(t, lang, self.force_language) for t, lang in zip(texts, languages)]
        return [self.tokenizer(t, add_special_tokens=False)["input_ids"] + [self.eos_id] for t in targets]

    def parse(self, text: str, language: str | None) -> tuple[str | None, str, bool]:
        """Response text -> (language name or None, transcript, well_formed)."""
        if self.spec is None:
            return None, text.strip(), True
        if self.force_language:
            return LANGUAGE_NAMES.get(language or "", None), text.strip(), True
        return self.spec.parse_output(text)
