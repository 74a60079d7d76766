"""Qwen2.5-Omni's thinker: transformers' `Qwen2_5OmniThinkerForConditionalGeneration` (Qwen/Qwen2.5-Omni-3B, -7B).

The thinker is the text-writing half of Qwen2.5-Omni (the talker and the vocoder speak, and ASR
does not need them). Its audio tower is Whisper-style with windowed attention (`n_window * 2` mel
frames per window) and ends in the projector (`audio_tower.proj`, d_model -> LLM width), so the
projector freezes with the tower, as ms-swift's default `freeze_aligner` does; the LLM trains.
Prompt (the released chat template; the instruction is Qwen's ASR cookbook's)::

    <|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n<|im_start|>user\\n
    <|audio_bos|><|AUDIO|>*N<|audio_eos|>Transcribe the audio into text.<|im_end|>\\n<|im_start|>assistant\\n

and the answer is the plain transcript, ended by `<|im_end|>`; a forced language names it in the
instruction ("Transcribe the English audio into text."). N = ((L - 1) // 2 + 1 - 2) // 2 + 1 for L
mel frames, as the processor counts. Text-only and audio-only positions are sequential in the
thinker's 3-D rotary positions, so the generic splice path applies.

Qwen2_5OmniProcessor insists on its image and video processors, and the video one needs
torchvision; ASR needs the feature extractor, the tokenizer and the chat template only, so
`OmniAudioProcessor` loads those, and writes the folder's other processor files back unchanged.
Every special token sits at its released id (151,643-151,656 in the 152,064 vocabulary).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from asr_rl.data.languages import LANGUAGE_NAMES
from asr_rl.models.families.base import AudioLLMSpec, AudioPrompts, register_family, with_context
from asr_rl.models.families.qwen2_audio import whisper_features
from asr_rl.models.tokenizer import IM_END, IM_START, PAD, TokenizerSpec

AUDIO, AUDIO_BOS, AUDIO_EOS = "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"
IMAGE, VIDEO, VISION_BOS, VISION_EOS = "<|IMAGE|>", "<|VIDEO|>", "<|vision_bos|>", "<|vision_eos|>"
RELEASED_IDS = {PAD: 151643, IM_START: 151644, IM_END: 151645, AUDIO: 151646, AUDIO_BOS: 151647,
                AUDIO_EOS: 151648, VISION_BOS: 151652, VISION_EOS: 151653, IMAGE: 151655, VIDEO: 151656}
VOCAB_SIZE = 152064  # Qwen2.5-Omni-7B's (the 3B's is 151,936)
SYSTEM_PROMPT = "You are a helpful assistant."
CHAT_TEMPLATE = (  # the released chat template (transformers' Qwen2.5-Omni processor tests hold the same)
    "{% set audio_count = namespace(value=0) %}{% set image_count = namespace(value=0) %}"
    "{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_bos|><|IMAGE|><|vision_eos|>"
    "{% elif content['type'] == 'audio' or 'audio' in content or 'audio_url' in content %}"
    "{% set audio_count.value = audio_count.value + 1 %}{% if add_audio_id %}Audio {{ audio_count.value }}: "
    "{% endif %}<|audio_bos|><|AUDIO|><|audio_eos|>{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video {{ video_count.value }}: "
    "{% endif %}<|vision_bos|><|VIDEO|><|vision_eos|>{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Qwen2-VL's video/image settings as the released preprocessor config has them: written so that
# transformers' full processor loads our folders where torchvision is installed.
_VISION = dict(patch_size=14, temporal_patch_size=2, merge_size=2, min_pixels=3136, max_pixels=12845056,
               image_mean=[0.48145466, 0.4578275, 0.40821073], image_std=[0.26862954, 0.26130258, 0.27577711])
_QWEN2_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "hidden_act", "max_position_embeddings", "rms_norm_eps", "attention_dropout")
_PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json",
                    "chat_template.json", "chat_template.jinja")


def instruction(language: str | None) -> str:
    name = LANGUAGE_NAMES.get(language or "")
    return f"Transcribe the {name} audio into text." if name else "Transcribe the audio into text."


def placeholder_count(mel_frames: torch.Tensor) -> torch.Tensor:
    """Audio placeholders for L mel frames: conv stride 2, then pool 2 (the processor's count)."""
    return ((mel_frames - 1) // 2 + 1 - 2) // 2 + 1


class OmniAudioProcessor:
    """The audio half of `Qwen2_5OmniProcessor`: feature extractor, tokenizer, chat template, and
    the folder's processor files (image/video settings included), saved back as they were."""

    def __init__(self, feature_extractor, tokenizer, chat_template: str, files: dict[str, str]):
        self.feature_extractor, self.tokenizer, self.chat_template = feature_extractor, tokenizer, chat_template
        self.files = files

    @classmethod
    def from_pretrained(cls, path) -> "OmniAudioProcessor":
        from transformers import AutoTokenizer, WhisperFeatureExtractor

        path = Path(path)
        files = {name: (path / name).read_text(encoding="utf-8")
                 for name in _PROCESSOR_FILES if (path / name).is_file()}
        template = (files.get("chat_template.jinja")
                    or json.loads(files.get("chat_template.json", "{}")).get("chat_template"))
        tokenizer = AutoTokenizer.from_pretrained(path)
        if not template:
            raise ValueError(f"{path}: no chat template (chat_template.jinja or chat_template.json)")
        return cls(WhisperFeatureExtractor.from_pretrained(path), tokenizer, template, files)

    def save_pretrained(self, path) -> None:
        self.tokenizer.save_pretrained(path)
        for name, text in self.files.items():
            (Path(path) / name).write_text(text, encoding="utf-8")


@register_family
class Qwen2_5OmniSpec(AudioLLMSpec):
    name = "qwen2_5_omni"
    released_bpe = "qwen"
    model_types = ("qwen2_5_omni_thinker", "qwen2_5_omni")  # a thinker folder, or the whole model
    random_tower = "windowed attention, 128 mels"
    sizes = {
        # the released vocabulary and ids with a tiny audio tower and LLM (and a 1-block vision
        # tower ASR never runs), for tests; mrope_section sums to head_dim / 2
        "tiny": dict(audio=dict(d_model=64, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=128),
                     text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                               num_key_value_heads=1, rope_parameters=dict(rope_type="default", rope_theta=1e6,
                                                                            mrope_section=[4, 6, 6]))),
        # tiny on Qwen's released BPE (models/qwen_bpe.py); tiny writes characters at the same ids
        "tiny-real": dict(audio=dict(d_model=64, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=128),
                          text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                    num_key_value_heads=1, rope_parameters=dict(rope_type="default", rope_theta=1e6,
                                                                                 mrope_section=[4, 6, 6])),
                          real_ids=True),
        "small": dict(audio=dict(d_model=256, encoder_layers=3, encoder_attention_heads=4, encoder_ffn_dim=1024),
                      text=dict(hidden_size=256, intermediate_size=768, num_hidden_layers=3, num_attention_heads=4,
                                num_key_value_heads=2, rope_parameters=dict(rope_type="default", rope_theta=1e6,
                                                                             mrope_section=[8, 12, 12]))),
    }

    def model_class(self):
        from transformers import Qwen2_5OmniThinkerForConditionalGeneration

        return Qwen2_5OmniThinkerForConditionalGeneration

    def model_config(self, config):
        return config.thinker_config if config.model_type == "qwen2_5_omni" else config

    def load_model(self, path, dtype):
        """A thinker folder, or the thinker out of a whole released Qwen2.5-Omni (its talker and
        vocoder weights are left on disk); checkpoints we save hold the thinker alone."""
        from asr_rl.models.weights import load_strict, read_model_config

        config = read_model_config(path)
        if config.model_type != "qwen2_5_omni":
            return super().load_model(path, dtype)
        return load_strict(self.model_class(), path, dtype, unused=("talker.", "token2wav."),
                           config=config.thinker_config, key_mapping={r"^thinker\.": ""})

    def audio_tower(self, model):
        return model.audio_tower

    def projector(self, model):
        return nn.Identity()  # audio_tower.proj, inside the tower (see the module docstring)

    def language_model(self, model):
        return model.model

    def llm_config(self, config):
        """The thinker's LLM as Qwen2 (what vLLM serves): the same layers and names, and on text and
        audio-only prompts its 3-D rotary positions are Qwen2's 1-D ones."""
        from transformers import Qwen2Config

        text = config.get_text_config()
        rope = {k: v for k, v in (text.rope_parameters or {}).items() if k != "mrope_section"}
        return Qwen2Config(**{k: getattr(text, k) for k in _QWEN2_FIELDS}, rope_parameters=rope)

    def encoder_width(self, config):
        return config.audio_config.output_dim

    def frozen_by_default(self):
        return ("audio_tower.*", "visual.*")

    def tokenizer_spec(self, real_ids: bool = True):  # always the released ids
        return TokenizerSpec(ids=RELEASED_IDS, special=tuple(RELEASED_IDS),
                             added=(SYSTEM_PROMPT, instruction(None), *map(instruction, LANGUAGE_NAMES),
                                    "system\n", "user\n", "assistant\n"),
                             extra_special={"audio_token": AUDIO, "audio_bos_token": AUDIO_BOS,
                                            "audio_eos_token": AUDIO_EOS, "image_token": IMAGE, "video_token": VIDEO,
                                            "vision_bos_token": VISION_BOS, "vision_eos_token": VISION_EOS},
                             chat_template=CHAT_TEMPLATE)

    def load_processor(self, path):
        return OmniAudioProcessor.from_pretrained(path)

    def max_audio_seconds(self, processor):
        return processor.feature_extractor.chunk_length  # whisper_features cuts longer audio, as the processor does

    def prepare(self, processor, waveforms, languages, force_language, sample_rate, contexts):
        feats = whisper_features(processor.feature_extractor, waveforms, sample_rate)
        counts = placeholder_count(feats["attention_mask"].sum(-1)).tolist()
        texts = []
        for lang, n, ctx in zip(languages, counts, contexts):
            user = [{"type": "audio", "audio_url": "utterance"},
                    {"type": "text", "text": with_context(instruction(lang if force_language else None), ctx)}]
            text = processor.tokenizer.apply_chat_template([{"role": "user", "content": user}],
                                                          chat_template=processor.chat_template, tokenize=False,
                                                          add_generation_prompt=True)
            texts.append(text.replace(AUDIO, AUDIO * n))
        tok = processor.tokenizer(texts, padding=True, padding_side="left", return_tensors="pt")
        return AudioPrompts(tok["input_ids"], tok["attention_mask"], feats["input_features"],
                            feats["attention_mask"], list(languages))

    def encode_audio(self, model, prompts):
        return model.get_audio_features(prompts.features, prompts.feature_mask).last_hidden_state

    def model_inputs(self, prompts):
        return dict(input_ids=prompts.input_ids, attention_mask=prompts.attention_mask,
                    input_features=prompts.features, feature_attention_mask=prompts.feature_mask)

    # target_text / parse_output: the base's, the thinker writes the transcript alone

    def new_model(self, size, tokenizer, encoder, seed):
        from transformers import Qwen2_5OmniThinkerConfig, WhisperFeatureExtractor

        spec = self.check_size(size)
        width = spec["text"]["hidden_size"]
        text = dict(vocab_size=VOCAB_SIZE, max_position_embeddings=4096, tie_word_embeddings=True,
                    pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, **spec["text"])
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=width,
                      fullatt_block_indexes=[0])
        config = Qwen2_5OmniThinkerConfig(audio_config=dict(num_mel_bins=128, output_dim=width, **spec["audio"]),
                                          vision_config=vision, text_config=text, tie_word_embeddings=True,
                                          vision_start_token_id=RELEASED_IDS[VISION_BOS],
                                          vision_end_token_id=RELEASED_IDS[VISION_EOS])
        torch.manual_seed(seed)
        model = self.model_class()(config)
        model.tie_weights()
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        fe = WhisperFeatureExtractor(feature_size=128)
        files = {"processor_config.json": json.dumps({
            "processor_class": "Qwen2_5OmniProcessor", "feature_extractor": fe.to_dict(),
            "image_processor": {"image_processor_type": "Qwen2VLImageProcessor", **_VISION},
            "video_processor": {"video_processor_type": "Qwen2VLVideoProcessor", **_VISION}}, indent=2),
            "chat_template.jinja": CHAT_TEMPLATE}
        return model, OmniAudioProcessor(fe, tokenizer, CHAT_TEMPLATE, files)
