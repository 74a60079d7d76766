"""What differs between Hugging Face audio-LLMs, behind one small interface.

An audio-LLM here is: audio features -> audio encoder (frozen in RL) -> projector/adapter ->
embeddings spliced into the LLM's input at audio placeholder tokens -> causal LLM. `AudioLLMSpec`
names those pieces for one model family; `AudioPolicy` (audio_policy.py) does everything else
generically. Qwen3-ASR is implemented; a Qwen2-Audio-style model needs one more subclass that
returns its tower, projector, prompt format and placeholder expansion.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from asr_rl.data.languages import language_name
from asr_rl.models.tokenizer import ASR_TEXT, language_prefix


@dataclass
class AudioPrompts:
    """Model inputs for B utterances.

    Attributes:
        input_ids: `(B, P)` left-padded prompt token ids, audio placeholders expanded.
        attention_mask: `(B, P)` 1 for real prompt tokens.
        input_features: `(B, n_mels, F)` log-mel features (padded to the longest).
        input_features_mask: `(B, F)` 1 for real feature frames.
        languages: the language code given for each utterance (None: unknown).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    input_features: torch.Tensor
    input_features_mask: torch.Tensor
    languages: list[str | None]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device | str) -> "AudioPrompts":
        return AudioPrompts(self.input_ids.to(device), self.attention_mask.to(device),
                            self.input_features.to(device), self.input_features_mask.to(device), self.languages)

    def select(self, idx: list[int]) -> "AudioPrompts":
        """The prompts of utterances `idx` (prompt padding is kept; it is masked)."""
        index = torch.as_tensor(idx, dtype=torch.long)
        return AudioPrompts(self.input_ids[index], self.attention_mask[index], self.input_features[index],
                            self.input_features_mask[index], [self.languages[i] for i in idx])


class AudioLLMSpec:
    """Model-family specifics. Subclasses set `model_types` and implement the methods."""

    model_types: tuple[str, ...] = ()

    def audio_tower(self, model: nn.Module) -> nn.Module:
        raise NotImplementedError

    def projector(self, model: nn.Module) -> nn.Module:
        raise NotImplementedError

    def language_model(self, model: nn.Module) -> nn.Module:
        """The causal LM body (no head), called with `inputs_embeds`."""
        raise NotImplementedError

    def encode_audio(self, model: nn.Module, prompts: AudioPrompts) -> torch.Tensor:
        """Audio encoder output for all utterances, packed `(sum_i L_i, d_audio)` in batch order."""
        raise NotImplementedError

    def prepare(self, processor, waveforms: list[np.ndarray], languages: list[str | None],
                force_language: bool, sample_rate: int) -> AudioPrompts:
        raise NotImplementedError

    def target_text(self, text: str, language: str | None, force_language: bool) -> str:
        """The assistant turn the model should write for reference `text` (without the EOS)."""
        raise NotImplementedError

    def parse_output(self, text: str) -> tuple[str | None, str, bool]:
        """Decoded response -> (predicted language name or None, transcript, well_formed)."""
        raise NotImplementedError

    def frozen_by_default(self) -> tuple[str, ...]:
        """Parameter-name patterns frozen in RL (the audio encoder)."""
        raise NotImplementedError


class Qwen3ASRSpec(AudioLLMSpec):
    """transformers' `Qwen3ASRForConditionalGeneration` and `Qwen3ASRProcessor`.

    Prompt: `<|im_start|>user\\n<|audio_start|><|audio_pad|>*N<|audio_end|><|im_end|>\\n
    <|im_start|>assistant\\n` followed, when the language is forced, by `language <Name><asr_text>`.
    The model answers `[language <Name><asr_text>]<transcript><|im_end|>`.
    """

    model_types = ("qwen3_asr",)

    def audio_tower(self, model):
        return model.model.audio_tower

    def projector(self, model):
        return model.model.multi_modal_projector

    def language_model(self, model):
        return model.model.language_model

    def encode_audio(self, model, prompts):
        out = self.audio_tower(model)(input_features=prompts.input_features,
                                      input_features_mask=prompts.input_features_mask)
        return out.last_hidden_state

    def prepare(self, processor, waveforms, languages, force_language, sample_rate):
        langs = [language_name(code) if (force_language and code) else None for code in languages]
        batch = processor.apply_transcription_request(list(waveforms), language=langs,
                                                      processor_kwargs={"sampling_rate": sample_rate})
        return AudioPrompts(batch["input_ids"], batch["attention_mask"], batch["input_features"],
                            batch["input_features_mask"], list(languages))

    def target_text(self, text, language, force_language):
        if force_language:
            return text
        return f"{language_prefix(language_name(language) if language else 'None')}{ASR_TEXT}{text}"

    def parse_output(self, text):
        if ASR_TEXT not in text:
            return None, text.strip(), False
        prefix, transcript = text.split(ASR_TEXT, 1)
        prefix = prefix.strip()
        language = prefix[len("language "):].strip() if prefix.lower().startswith("language ") else None
        if language and language.lower() == "none":
            language = None
        return language, transcript.strip(), True

    def frozen_by_default(self):
        return ("model.audio_tower.*",)


SPECS: dict[str, AudioLLMSpec] = {t: spec for spec in (Qwen3ASRSpec(),) for t in spec.model_types}


def spec_for(model_type: str) -> AudioLLMSpec:
    try:
        return SPECS[model_type]
    except KeyError:
        raise ValueError(f"model type {model_type!r} is not a supported audio-LLM; supported: "
                         f"{', '.join(sorted(SPECS))}") from None
