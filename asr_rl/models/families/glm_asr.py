"""GLM-ASR: transformers' `GlmAsrForConditionalGeneration` and `GlmAsrProcessor` (zai-org/GLM-ASR-Nano-2512).

The audio tower is a Whisper-style encoder with rotary positions; the projector merges 4 encoder
frames (their `4 x d` concatenation is the tower's `intermediate_size`) through a 2-layer MLP into a
Llama LLM. Prompt, through the folder's own chat template (the processor's `apply_transcription_request`)::

    [gMASK]<sop><|user|>\\n<|begin_of_audio|><|pad|>*N<|end_of_audio|>Please transcribe this audio into text
    <|assistant|>\\n

and the answer is the plain transcript, ended by `<|user|>` (one of the model's three EOS ids, as in
GLM-4 chat). N = ((L - 1) // 2 + 1 - 4) // 4 + 1 for L mel frames (conv stride 2, merge 4).

The encoder attends over the whole 30 s window the processor pads to (no padding mask), so its
states depend on the padding: `encode_audio` runs the model's own window, and the frozen encoder's
states are cached once per utterance. Audio longer than one window (30 s) is refused.

Ids: transformers' config gives the vocabulary (59,264), the audio placeholder `<|pad|>` (59,260)
and the EOS ids (59,246 `<|endoftext|>`, 59,253 `<|user|>`, 59,255 `<|observation|>`); the other
special tokens sit where GLM-4's tokenizer order puts them relative to those (the released
tokenizer is not reachable offline), and a real folder brings its own tokenizer and template.
"""
from __future__ import annotations

import torch

from asr_rl.models.families.base import AudioLLMSpec, AudioPrompts, register_family, with_context
from asr_rl.models.tokenizer import TokenizerSpec

ENDOFTEXT, USER, ASSISTANT, SYSTEM = "<|endoftext|>", "<|user|>", "<|assistant|>", "<|system|>"
GMASK, SOP, AUDIO, AUDIO_BOS, AUDIO_EOS = "[gMASK]", "<sop>", "<|pad|>", "<|begin_of_audio|>", "<|end_of_audio|>"
RELEASED_IDS = {ENDOFTEXT: 59246, GMASK: 59248, SOP: 59250, SYSTEM: 59252, USER: 59253, ASSISTANT: 59254,
                "<|observation|>": 59255, AUDIO: 59260, AUDIO_BOS: 59261, AUDIO_EOS: 59262}
VOCAB_SIZE = 59264
INSTRUCTION = "Please transcribe this audio into text"  # GlmAsrProcessor's default_transcription_prompt
MERGE = 4  # encoder frames per projected frame

CHAT_TEMPLATE = (
    "[gMASK]<sop>"
    "{%- for m in messages -%}"
    "{{- '<|' + m['role'] + '|>\\n' -}}"
    "{%- if m['content'] is string -%}{{- m['content'] -}}"
    "{%- else -%}{%- for c in m['content'] -%}"
    "{%- if c['type'] == 'audio' -%}{{- '<|begin_of_audio|><|pad|><|end_of_audio|>' -}}"
    "{%- elif c['type'] == 'text' -%}{{- c['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)


def placeholder_count(mel_frames: torch.Tensor) -> torch.Tensor:
    """Projected audio frames (= placeholders) for L mel frames: conv stride 2, then merge 4."""
    return ((mel_frames - 1) // 2 + 1 - MERGE) // MERGE + 1


@register_family
class GlmAsrSpec(AudioLLMSpec):
    name = "glm_asr"
    model_types = ("glmasr",)
    random_tower = "rotary positions, 128 mels"
    sizes = {
        # the released vocabulary and ids with a tiny encoder and LLM, for tests
        "tiny": dict(audio=dict(hidden_size=64, intermediate_size=MERGE * 64, num_hidden_layers=2,
                                num_attention_heads=2),
                     text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                               num_key_value_heads=1, head_dim=32)),
        "small": dict(audio=dict(hidden_size=256, intermediate_size=MERGE * 256, num_hidden_layers=3,
                                 num_attention_heads=4),
                      text=dict(hidden_size=256, intermediate_size=768, num_hidden_layers=3, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=64)),
    }

    def model_class(self):
        from transformers import GlmAsrForConditionalGeneration

        return GlmAsrForConditionalGeneration

    def encoder_width(self, config) -> int:
        return config.audio_config.intermediate_size  # the projector reads 4 merged frames

    def tokenizer_spec(self, real_ids: bool = True):  # always the released ids: the vocabulary is small
        return TokenizerSpec(ids=RELEASED_IDS, special=tuple(RELEASED_IDS), added=(INSTRUCTION,),
                             extra_special={"audio_token": AUDIO}, chat_template=CHAT_TEMPLATE, pad=ENDOFTEXT,
                             eos=USER)

    def max_audio_seconds(self, processor):
        return processor.feature_extractor.chunk_length  # one window: the encoder has no padding mask

    def prepare(self, processor, waveforms, languages, force_language, sample_rate, contexts):
        # the processor's own prompt argument; without a context it is its default instruction
        prompts = [with_context(INSTRUCTION, ctx) if ctx else None for ctx in contexts]
        batch = processor.apply_transcription_request(list(waveforms), prompt=prompts,
                                                      processor_kwargs={"sampling_rate": sample_rate})
        return AudioPrompts(batch["input_ids"], batch["attention_mask"], batch["input_features"],
                            batch["input_features_mask"], list(languages))

    def encode_audio(self, model, prompts):
        tower = self.audio_tower(model)
        h = tower(prompts.features.to(tower.conv1.weight.dtype)).last_hidden_state
        h = h.reshape(h.shape[0], -1, model.config.audio_config.intermediate_size)  # merge 4 frames
        counts = placeholder_count(prompts.feature_mask.sum(-1)).tolist()
        return torch.cat([h[i, :n] for i, n in enumerate(counts)])

    def model_inputs(self, prompts):
        return dict(input_ids=prompts.input_ids, attention_mask=prompts.attention_mask,
                    input_features=prompts.features, input_features_mask=prompts.feature_mask)

    # target_text / parse_output: the base's, GLM-ASR writes the transcript alone

    def new_model(self, size, tokenizer, encoder, seed):
        from transformers import GlmAsrConfig, GlmAsrProcessor, WhisperFeatureExtractor

        spec = self.check_size(size)
        eos = [tokenizer.convert_tokens_to_ids(t) for t in (ENDOFTEXT, USER, "<|observation|>")]
        text = dict(model_type="llama", vocab_size=VOCAB_SIZE, max_position_embeddings=4096, tie_word_embeddings=True,
                    pad_token_id=tokenizer.pad_token_id, eos_token_id=eos, bos_token_id=None, **spec["text"])
        config = GlmAsrConfig(audio_config=dict(num_mel_bins=128, max_position_embeddings=1500, **spec["audio"]),
                              text_config=text, audio_token_id=tokenizer.convert_tokens_to_ids(AUDIO),
                              tie_word_embeddings=True)
        torch.manual_seed(seed)
        model = self.model_class()(config)
        model.tie_weights()
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = eos
        processor = GlmAsrProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=128), tokenizer=tokenizer,
                                    chat_template=tokenizer.chat_template, audio_token=AUDIO)
        return model, processor
