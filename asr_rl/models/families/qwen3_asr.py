"""Qwen3-ASR: transformers' `Qwen3ASRForConditionalGeneration` and `Qwen3ASRProcessor`.

Prompt: `<|im_start|>system\\n<context><|im_end|>\\n<|im_start|>user\\n<|audio_start|><|audio_pad|>*N
<|audio_end|><|im_end|>\\n<|im_start|>assistant\\n` followed, when the language is forced, by
`language <Name><asr_text>`. The system turn is there even empty, as the released chat template
renders it: the context list (contextual biasing) is its text.
The model answers `[language <Name><asr_text>]<transcript><|im_end|>`. The builders make a randomly
initialised model (the audio tower trains from scratch, with CTC; trainer/ctc.py).
"""
from __future__ import annotations

from asr_rl.data.languages import LANGUAGE_NAMES, language_name
from asr_rl.models.families.base import AudioLLMSpec, AudioPrompts, register_family
from asr_rl.models.tokenizer import IM_END, IM_START, PAD, TokenizerSpec

AUDIO_START, AUDIO_END, AUDIO_PAD, ASR_TEXT = "<|audio_start|>", "<|audio_end|>", "<|audio_pad|>", "<asr_text>"
# Their ids in the released Qwen3-ASR tokenizer (Qwen/Qwen3-ASR-0.6B-hf, -1.7B-hf; vocabulary 151,936)
RELEASED_IDS = {PAD: 151643, IM_START: 151644, IM_END: 151645, AUDIO_START: 151669, AUDIO_END: 151670,
                AUDIO_PAD: 151676, ASR_TEXT: 151704}

# The Qwen3-ASR conversation format: the audio sits in the user turn, the assistant turn holds
# `language <Name><asr_text><transcript>` (the prefill may force the language).
CHAT_TEMPLATE = (
    # the released template's empty system turn when the conversation has no system message
    "{%- if messages and messages[0]['role'] != 'system' -%}{{- '<|im_start|>system\\n<|im_end|>\\n' -}}{%- endif -%}"
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' -}}"
    "{%- if m['content'] is string -%}{{- m['content'] -}}"
    "{%- else -%}{%- for c in m['content'] -%}"
    "{%- if c['type'] == 'audio' -%}{{- '<|audio_start|><|audio_pad|><|audio_end|>' -}}"
    "{%- elif c['type'] == 'text' -%}{{- c['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- if not (loop.last and continue_final_message) -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def language_prefix(name: str | None) -> str:
    """The assistant-turn prefix Qwen3-ASR writes before the transcript."""
    return f"language {name}"


def context_prompt(context: tuple[str, ...]) -> str | None:
    """The system-message text of a context list (None: no system message; the template then
    renders the released empty system turn)."""
    return ", ".join(context) if context else None


@register_family
class Qwen3ASRSpec(AudioLLMSpec):
    name = "qwen3_asr"
    released_bpe = "qwen"
    model_types = ("qwen3_asr",)
    sizes = {
        # tiny: ~0.2M parameters, for tests (seconds)
        "tiny": dict(audio=dict(d_model=64, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=128,
                                downsample_hidden_size=16),
                     text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                               num_key_value_heads=1, head_dim=32)),
        # small: ~5M parameters, what learned from scratch on 2 cores in our calibration (BENCHMARKS.md)
        "small": dict(audio=dict(d_model=256, encoder_layers=3, encoder_attention_heads=4, encoder_ffn_dim=1024,
                                 downsample_hidden_size=64),
                      text=dict(hidden_size=256, intermediate_size=768, num_hidden_layers=3, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=64)),
        # tiny, with the released vocabulary size and special-token ids: the real format token for
        # token (prompts, targets, parsing) at test speed
        "tiny-real": dict(audio=dict(d_model=64, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=128,
                                     downsample_hidden_size=16),
                          text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                    num_key_value_heads=1, head_dim=32, vocab_size=151936), real_ids=True),
        # the real Qwen3-ASR-0.6B / -1.7B dimensions, vocabulary size and special-token ids, random
        # weights: for memory and speed measurements (scripts/bench_memory.py)
        "0.6b": dict(audio=dict(d_model=896, encoder_layers=18, encoder_attention_heads=14, encoder_ffn_dim=3584,
                                downsample_hidden_size=480),
                     text=dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                               num_key_value_heads=8, head_dim=128, vocab_size=151936), real_ids=True),
        "1.7b": dict(audio=dict(d_model=1024, encoder_layers=24, encoder_attention_heads=16, encoder_ffn_dim=4096,
                                downsample_hidden_size=480),
                     text=dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                               num_key_value_heads=8, head_dim=128, vocab_size=151936), real_ids=True),
    }

    def model_class(self):
        from transformers import Qwen3ASRForConditionalGeneration

        return Qwen3ASRForConditionalGeneration

    def check_folder(self, path, raw_config: dict) -> None:
        # The original release (Qwen/Qwen3-ASR-0.6B, -1.7B) is the `qwen_asr` package's layout:
        # transformers reads its config but none of its `thinker.*` weights (708 missing keys).
        if "thinker_config" in raw_config:
            raise ValueError(
                f"{path} is the original Qwen3-ASR release format (`thinker_config`, `thinker.*` weights), which "
                "transformers' Qwen3ASRForConditionalGeneration does not load. Use the converted `-hf` repository "
                "(Qwen/Qwen3-ASR-0.6B-hf, Qwen/Qwen3-ASR-1.7B-hf), or convert the folder with transformers' "
                "src/transformers/models/qwen3_asr/convert_qwen3_asr_to_hf.py (from the transformers source tree)")

    def tokenizer_spec(self, real_ids: bool = False):
        return TokenizerSpec(
            ids=RELEASED_IDS if real_ids else {},
            special=(PAD, IM_START, IM_END, AUDIO_START, AUDIO_END, AUDIO_PAD),
            added=(ASR_TEXT, *(language_prefix(n) for n in [*LANGUAGE_NAMES.values(), "None"])),
            extra_special={"audio_token": AUDIO_PAD, "audio_bos_token": AUDIO_START, "audio_eos_token": AUDIO_END},
            chat_template=CHAT_TEMPLATE)

    def prepare(self, processor, waveforms, languages, force_language, sample_rate, contexts):
        langs = [language_name(code) if (force_language and code) else None for code in languages]
        # a context list is the processor's `prompt`: the system message Qwen3-ASR was trained to
        # read context and hotwords from; none leaves the prompt without a system message
        prompts = [context_prompt(ctx) for ctx in contexts]
        batch = processor.apply_transcription_request(list(waveforms), language=langs, prompt=prompts,
                                                      processor_kwargs={"sampling_rate": sample_rate})
        return AudioPrompts(batch["input_ids"], batch["attention_mask"], batch["input_features"],
                            batch["input_features_mask"], list(languages))

    def encode_audio(self, model, prompts):
        out = self.audio_tower(model)(input_features=prompts.features, input_features_mask=prompts.feature_mask)
        return out.last_hidden_state

    def model_inputs(self, prompts):
        return dict(input_ids=prompts.input_ids, attention_mask=prompts.attention_mask,
                    input_features=prompts.features, input_features_mask=prompts.feature_mask)

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

    def new_model(self, size, tokenizer, encoder, seed):
        import torch
        from transformers import Qwen3ASRConfig, Qwen3ASRFeatureExtractor, Qwen3ASRProcessor

        spec = self.check_size(size)
        audio = dict(num_mel_bins=128, output_dim=spec["text"]["hidden_size"], **spec["audio"])
        text = {"vocab_size": len(tokenizer), "max_position_embeddings": 4096, "tie_word_embeddings": True,
                "rope_theta": 10000.0, **spec["text"]}
        audio_pad = tokenizer.convert_tokens_to_ids(AUDIO_PAD)
        config = Qwen3ASRConfig(audio_config=audio, text_config=text, audio_token_id=audio_pad,
                                timestamp_token_id=audio_pad, pad_token_id=tokenizer.pad_token_id,
                                eos_token_id=[tokenizer.eos_token_id])
        torch.manual_seed(seed)
        model = self.model_class()(config)
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = [tokenizer.eos_token_id]
        processor = Qwen3ASRProcessor(feature_extractor=Qwen3ASRFeatureExtractor(), tokenizer=tokenizer,
                                      chat_template=tokenizer.chat_template)
        return model, processor
