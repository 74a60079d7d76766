"""The contract of a model family: everything that differs between Hugging Face audio-LLMs.

An audio-LLM here is: audio features -> audio encoder (frozen from SFT on when pretrained) ->
projector/adapter -> embeddings spliced into the LLM's input at audio placeholder tokens -> causal
LLM. One `AudioLLMSpec` subclass per family names those pieces and owns its prompt format, its
processor call, its output format and its builders; `AudioPolicy` (models/audio_policy.py) and the
trainers do everything else generically and never branch on the model type. A new family is one
file in this package with a registered spec, and its test.
"""
from __future__ import annotations

import copy

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from asr_rl.models.tokenizer import TokenizerSpec, build_char_tokenizer
from asr_rl.registry import Registry


@dataclass
class AudioPrompts:
    """Model inputs for B utterances, in the family's own feature layout.

    Attributes:
        input_ids: `(B, P)` left-padded prompt token ids, audio placeholders expanded.
        attention_mask: `(B, P)` 1 for real prompt tokens.
        features: `(B, n_mels, F)` log-mel features (padded).
        feature_mask: `(B, F)` 1 for real feature frames.
        languages: the language code given for each utterance (None: unknown).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    features: torch.Tensor
    feature_mask: torch.Tensor
    languages: list[str | None]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> "AudioPrompts":
        """On `device`, features cast to `dtype` (the model's, e.g. bf16) when given."""
        return AudioPrompts(self.input_ids.to(device), self.attention_mask.to(device),
                            self.features.to(device, dtype or self.features.dtype), self.feature_mask.to(device),
                            self.languages)

    def select(self, idx: list[int]) -> "AudioPrompts":
        """The prompts of utterances `idx` (prompt padding is kept; it is masked)."""
        index = torch.as_tensor(idx, dtype=torch.long)
        return AudioPrompts(self.input_ids[index], self.attention_mask[index], self.features[index],
                            self.feature_mask[index], [self.languages[i] for i in idx])


def with_context(instruction: str, context: tuple[str, ...] | list[str]) -> str:
    """A family's instruction text with a context list (contextual biasing: hotwords the audio may
    hold) put before it; no context leaves the instruction exactly as it is. For families whose
    prompt has no field of its own for context (Qwen3-ASR's system message is one)."""
    return f"Context: {', '.join(context)}. {instruction}" if context else instruction


class AudioTooLong(ValueError):
    """An utterance longer than its family's encoder takes whole (`AudioLLMSpec.max_audio_seconds`)."""


class AudioLLMSpec:
    """One model family. Subclasses set the class attributes and implement the methods.

    Attributes:
        name: the `--arch` name of `asr-rl model init`.
        model_types: the `config.model_type` values this spec serves.
        sizes: builder settings per size name (`tiny`, `small`).
        default_encoder: the pretrained encoder `model init` starts from (None: random init).
        takes_pretrained_encoder: `build` can start the audio tower from a pretrained (Whisper)
            encoder; otherwise the tower is always randomly initialised.
        random_tower: what sets a random-only tower apart (e.g. "rotary positions, 128 mels"), for
            the message refusing a pretrained encoder.
        batch_invariant_audio: the processor pads every clip to one fixed window (Whisper's 30 s),
            so a clip's features and encoder states do not depend on its batch-mates; otherwise
            (features padded to the longest clip: the edge frames and the frame count change with
            it) each clip is encoded on its own (`AudioPolicy.encode_prompts`).
    """

    name: str = ""
    model_types: tuple[str, ...] = ()
    sizes: dict[str, dict] = {}
    default_encoder: str | None = None
    takes_pretrained_encoder: bool = False
    released_bpe: str | None = None  # the released BPE `model init --tokenizer` can build offline ("qwen")
    random_tower: str = ""
    batch_invariant_audio: bool = False

    # --- the Hugging Face classes and the pieces of the network --------------------------
    # The defaults are the layout transformers' audio-LLMs share (`model.model.audio_tower`,
    # `.multi_modal_projector`, `.language_model`, `config.audio_token_id`); a family overrides
    # what it names otherwise.
    def model_class(self) -> type:
        raise NotImplementedError

    def model_config(self, config):
        """The config `model_class()` takes, from a folder's (a checkpoint holding a larger model
        than the audio-LLM gives the audio-LLM's part)."""
        return config

    def load_model(self, path, dtype: torch.dtype) -> nn.Module:
        """The model of a checkpoint folder, every weight accounted for (`load_strict`)."""
        from asr_rl.models.weights import load_strict

        return load_strict(self.model_class(), path, dtype)

    def check_folder(self, path, raw_config: dict) -> None:
        """Refuse a checkpoint layout this family's transformers class cannot load (before the
        weights load), saying how to convert it; `raw_config` is the folder's config.json."""

    def audio_tower(self, model: nn.Module) -> nn.Module:
        return model.model.audio_tower

    def projector(self, model: nn.Module) -> nn.Module:
        return model.model.multi_modal_projector

    def language_model(self, model: nn.Module) -> nn.Module:
        """The causal LM body (no head), called with `inputs_embeds`."""
        return model.model.language_model

    def audio_token_id(self, config) -> int:
        """The placeholder id the projected audio replaces."""
        return config.audio_token_id

    def audio_positions(self, config, input_ids):
        """`(B, P)` bool: the prompt positions the projected audio frames fill, in order."""
        return input_ids == self.audio_token_id(config)

    def encoder_width(self, config) -> int:
        """Width of the audio-encoder states (what the projector and a CTC head read)."""
        return config.audio_config.d_model

    def llm_config(self, config):
        """The config of the LLM as a standalone causal LM (vLLM serves it from prompt embeddings);
        its `model_type` must have a `*ForCausalLM` class with the LLM's parameter names."""
        return copy.deepcopy(config.get_text_config())

    def frozen_by_default(self) -> tuple[str, ...]:
        """Parameter-name patterns of the audio encoder (frozen in RL, and in SFT when pretrained)."""
        return ("model.audio_tower.*",)

    # --- inputs and outputs ----------------------------------------------------------------
    def tokenizer_spec(self, real_ids: bool = False) -> TokenizerSpec:
        """Special tokens, tags and chat template of the family's tokenizer (for `model init`);
        `real_ids`: the special tokens at the ids of the family's released tokenizer."""
        raise NotImplementedError

    def default_tokenizer(self, size: str) -> str:
        """The tokenizer `model init` gives `size` unless told: the released BPE for the sizes on the
        released ids (tiny-real: the real format at test speed), characters otherwise (an LM head
        over 151,936 ids would cost ~15x a `small` LLM's body per token on CPU)."""
        return self.released_bpe if self.released_bpe and self.check_size(size).get("real_ids") else "char"

    def make_tokenizer(self, texts: list[str], size: str, kind: str | None = None):
        """`model init`'s tokenizer: character-level over `texts` in the family's format
        (`tokenizer_spec`), or `kind` = the family's released BPE (`released_bpe`, built offline:
        models/qwen_bpe.py), its special tokens at their released ids; None: `default_tokenizer`.
        A family whose processor needs its own tokenizer format overrides it."""
        kind = kind or self.default_tokenizer(size)
        if kind == "char":
            return build_char_tokenizer(texts, self.tokenizer_spec(real_ids=self.check_size(size).get("real_ids", False)))
        if kind != self.released_bpe:
            raise ValueError(f"--tokenizer {kind}: {self.name} takes " + " or ".join(
                repr(k) for k in ("char", self.released_bpe) if k))
        from asr_rl.models.qwen_bpe import build_qwen_tokenizer

        self.check_size(size)
        return build_qwen_tokenizer(self.tokenizer_spec(real_ids=True))

    def load_processor(self, path):
        """The processor of a checkpoint folder (default: transformers' `AutoProcessor`)."""
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(path)

    def max_audio_seconds(self, processor) -> float | None:
        """The longest utterance the encoder takes whole, in seconds: a family with a fixed window
        (Whisper's 30 s) sets it; None: any length (the family chunks long audio)."""
        return None

    def check_durations(self, processor, waveforms: list[np.ndarray], names: list[str], sample_rate: int) -> None:
        """Refuse (`AudioTooLong`) audio longer than `max_audio_seconds`, naming the utterance: cut to
        the window, its transcript would cover the window only and be scored against the whole reference."""
        limit = self.max_audio_seconds(processor)
        for name, w in zip(names, waveforms):
            if limit is not None and len(w) > limit * sample_rate:
                raise AudioTooLong(f"utterance {name} lasts {len(w) / sample_rate:.1f} s; {self.name} takes at most "
                                   f"{limit:g} s per utterance (its encoder's window): split it or leave it out")

    def prepare(self, processor, waveforms: list[np.ndarray], languages: list[str | None],
                force_language: bool, sample_rate: int, contexts: list[tuple[str, ...]]) -> AudioPrompts:
        """Features and prompt ids for B waveforms, through the family's processor; `contexts[i]`
        is utterance i's context list (words or phrases to bias toward), rendered the way the family
        does (`()`: exactly the prompt without one)."""
        raise NotImplementedError

    def encode_audio(self, model: nn.Module, prompts: AudioPrompts) -> torch.Tensor:
        """Audio-encoder output for all utterances, packed `(sum_i L_i, d_audio)` in batch order,
        where L_i is the number of placeholders of prompt i."""
        raise NotImplementedError

    def model_inputs(self, prompts: AudioPrompts) -> dict:
        """Keyword arguments of the model's own `forward` for `prompts` (plain-transformers parity)."""
        raise NotImplementedError

    def target_text(self, text: str, language: str | None, force_language: bool) -> str:
        """The assistant turn the model should write for reference `text` (without the EOS); by
        default the transcript alone (a family that writes a language tag first overrides it)."""
        return text

    def parse_output(self, text: str) -> tuple[str | None, str, bool]:
        """Decoded response -> (predicted language name or code, or None; transcript; well_formed);
        by default the whole response is the transcript, with no language."""
        return None, text.strip(), True

    def prompt_preview(self, processor, config, seconds: float = 2.0, sample_rate: int = 16000) -> str:
        """The prompt one utterance of `seconds` gets (`asr-rl model info`), the audio placeholders
        shown once with their count."""
        prompts = self.prepare(processor, [np.zeros(int(seconds * sample_rate), np.float32)], [None], False,
                               sample_rate, [()])
        ids = prompts.input_ids[0][prompts.attention_mask[0].bool()]
        audio = self.audio_positions(config, ids[None])[0]
        if not audio.any():
            return processor.tokenizer.decode(ids)
        first = int(audio.nonzero()[0])
        placeholder = processor.tokenizer.convert_ids_to_tokens(int(ids[first]))
        return (processor.tokenizer.decode(ids[:first]) + f"{placeholder} x {int(audio.sum())}"
                + processor.tokenizer.decode(ids[first:][~audio[first:]]))

    # --- builders ----------------------------------------------------------------------------
    def build(self, size: str, tokenizer, encoder: str | None = None, seed: int = 0):
        """`(model, processor)`: a new model of `size` for `tokenizer`, its audio encoder loaded
        from `encoder` (a packaged name or a Hugging Face folder) or randomly initialised (None).
        A family whose tower no pretrained encoder fits (`takes_pretrained_encoder` False) refuses one."""
        if encoder is not None and not self.takes_pretrained_encoder:
            why = f" ({self.random_tower})" if self.random_tower else ""
            raise ValueError(f"{self.name} builds with a randomly initialised audio tower{why}; a pretrained encoder "
                             "(--encoder) is for qwen2_audio (Whisper's encoder)")
        return self.new_model(size, tokenizer, encoder, seed)

    def new_model(self, size: str, tokenizer, encoder: str | None, seed: int):
        """What `build` returns, once `encoder` is known to fit (None unless `takes_pretrained_encoder`)."""
        raise NotImplementedError

    def check_size(self, size: str) -> dict:
        if size not in self.sizes:
            raise ValueError(f"unknown size {size!r} for {self.name}; choose one of {', '.join(self.sizes)}")
        return self.sizes[size]


FAMILIES: Registry[AudioLLMSpec] = Registry("model family")


def register_family(cls: type[AudioLLMSpec]) -> type[AudioLLMSpec]:
    """Class decorator: one instance of the spec subclass `cls` serves `--arch cls.name` (and the
    folders whose `config.model_type` is in `cls.model_types`)."""
    FAMILIES.register(cls.name)(cls())
    return cls

