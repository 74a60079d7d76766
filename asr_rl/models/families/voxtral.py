"""Voxtral: transformers' `VoxtralForConditionalGeneration` and `VoxtralProcessor`
(mistralai/Voxtral-Mini-3B-2507, mistralai/Voxtral-Small-24B-2507).

The audio tower is Whisper's encoder over fixed 30 s chunks (3000 mel frames -> 1500 states, no
padding mask); the projector reads 4 consecutive states concatenated (`4 x d` is the tower's
`intermediate_size`) into a Llama LLM, so each 30 s chunk fills 375 placeholders. Prompt
(mistral_common's transcription request, through `processor.apply_transcription_request`)::

    <s>[INST][BEGIN_AUDIO][AUDIO]*N[/INST]lang:en[TRANSCRIBE]

`lang:xx` only when a language is given (forced); the answer is the plain transcript, ended by
`</s>`. N = 375 per started 30 s: mistral_common pads the audio to a multiple of 30 s. A context
list (contextual biasing) has no field in that request: an utterance with one takes Voxtral's chat
mode, `[INST][BEGIN_AUDIO][AUDIO]*N Context: a, b. Transcribe the audio.[/INST]` (`chat_prompt`).

Ids: the tokenizer is mistral_common's Tekken BPE (`tekken.json`, read by transformers'
`MistralCommonBackend`): 1,000 control tokens, then the BPE vocabulary (131,072 in all). Control
ranks as mistral_common lays out an audio tokenizer: <unk> 0, <s> 1, </s> 2, [INST] 3, [/INST] 4,
<pad> 11, [AUDIO] 24 (the id `VoxtralProcessor` hard-codes), [BEGIN_AUDIO] 25, [TRANSCRIBE] 34.
No hub here: `model init` assembles Voxtral's tekken.json from the Tekken vocabulary mistral_common
ships (`data/tekken_240911.json`) with that control list and Voxtral's audio section.
"""
from __future__ import annotations

import functools
import json
import re
import tempfile
from pathlib import Path

import torch

from asr_rl.data.languages import LANGUAGE_NAMES
from asr_rl.models.families.base import AudioLLMSpec, AudioPrompts, register_family, with_context
from asr_rl.models.tokenizer import TokenizerSpec

VOCAB_SIZE = 131072
BOS, EOS, PAD, AUDIO, BEGIN_AUDIO, TRANSCRIBE = 1, 2, 11, 24, 25, 34
INST, END_INST = "[INST]", "[/INST]"
CHUNK_FRAMES = 3000  # mel frames per 30 s chunk: the encoder takes exactly this many
CHAT_INSTRUCTION = "Transcribe the audio."  # chat mode's instruction, when a context list needs the text field
MODEL_ID = "mistralai/Voxtral-Mini-3B-2507"  # only recorded in the request mistral_common builds
# Voxtral's audio section of tekken.json: 16 kHz, 12.5 audio tokens/s after the 4-state merge
# (8 mel frames of 160 samples each), 128 mels, audio padded to whole 30 s chunks.
AUDIO_SECTION = {"sampling_rate": 16000, "frame_rate": 12.5, "chunk_length_s": 30.0,
                 "audio_encoding_config": {"num_mel_bins": 128, "hop_length": 160, "window_size": 400}}


def control_tokens() -> list[dict]:
    """The first 37 control tokens of a v7 audio Tekken tokenizer (Tekkenizer fills the rest of the
    1,000 with `<SPECIAL_i>`), laid out as mistral_common's own tests build one
    (`get_special_tokens(v7, add_audio=True)`): the v7 list (ranks 0-19), then the audio and
    transcription markers; 32-33 ([ARGS], [CALL_ID] from v11 on) stay fillers."""
    from mistral_common.tokens.tokenizers.base import SpecialTokens as S
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    named = {t["rank"]: str(t["token_str"]) for t in Tekkenizer.DEPRECATED_SPECIAL_TOKENS}  # ranks 0-19
    named.update({AUDIO: S.audio.value, BEGIN_AUDIO: S.begin_audio.value, TRANSCRIBE: S.transcribe.value,
                  35: S.text_to_audio.value, 36: S.audio_to_text.value})
    return [{"rank": r, "token_str": named.get(r, f"<SPECIAL_{r}>"), "is_control": True} for r in range(37)]


@functools.cache
def _scratch() -> Path:
    """A folder of this process's, removed at exit."""
    folder = tempfile.TemporaryDirectory(prefix="asr_rl_voxtral_")
    _scratch.folder = folder  # kept alive with the cache
    return Path(folder.name)


def _tekken_copy(text: str) -> Path:
    """`text` as a tekken.json of the process's own: the Tekken tokenizer saves a checkpoint by
    copying the file it was read from, which must outlive the folder it came from (a checkpoint a
    run resumed from is rotated away by later saves)."""
    path = Path(tempfile.mkdtemp(dir=_scratch())) / "tekken.json"
    path.write_text(text, encoding="utf-8")
    return path


@functools.cache
def tekken_file() -> Path:
    """Voxtral's tekken.json, assembled once per process (`model init` builds the tokenizer from it)."""
    import mistral_common

    data = json.loads((Path(mistral_common.__file__).parent / "data" / "tekken_240911.json").read_text("utf-8"))
    data.pop("image", None)  # Pixtral's; Voxtral has no image encoder
    data["config"]["version"] = "v7"  # the first version with audio (InstructTokenizerV7 transcribes)
    data["special_tokens"] = control_tokens()
    data["audio"] = AUDIO_SECTION
    return _tekken_copy(json.dumps(data, ensure_ascii=False))


@register_family
class VoxtralSpec(AudioLLMSpec):
    name = "voxtral"
    model_types = ("voxtral",)
    random_tower = "128 mels"
    batch_invariant_audio = True  # features padded to the 30 s window
    sizes = {
        # the released vocabulary and ids with a tiny encoder and LLM; the encoder keeps its
        # 1500 positions (one 30 s chunk) and intermediate = 4 x hidden (the merge)
        "tiny": dict(audio=dict(hidden_size=64, intermediate_size=4 * 64, num_hidden_layers=2, num_attention_heads=2),
                     text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                               num_key_value_heads=1, head_dim=32)),
        "small": dict(audio=dict(hidden_size=256, intermediate_size=4 * 256, num_hidden_layers=3,
                                 num_attention_heads=4),
                      text=dict(hidden_size=256, intermediate_size=768, num_hidden_layers=3, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=64)),
    }

    def model_class(self):
        from transformers import VoxtralForConditionalGeneration

        return VoxtralForConditionalGeneration

    def encoder_width(self, config) -> int:
        return config.audio_config.intermediate_size  # the projector reads 4 merged states

    def tokenizer_spec(self, real_ids: bool = True):
        # The Tekken file holds the vocabulary (`make_tokenizer`); this names only the tokens never
        # to sample: [AUDIO] would break the placeholder count, the others belong to prompts.
        names = ("[AUDIO]", "[BEGIN_AUDIO]", "[TRANSCRIBE]", INST, END_INST, "<s>")
        return TokenizerSpec(special=(), extra_special={n: n for n in names}, chat_template=None)

    def make_tokenizer(self, texts, size, kind="char"):
        """Voxtral's own Tekken BPE (byte-level: every text is writable, so `texts` are not needed);
        it is what `kind` char gives too (no character tokenizer fits mistral_common)."""
        from transformers import MistralCommonBackend

        if kind not in ("char", "tekken"):
            raise ValueError(f"--tokenizer {kind}: voxtral uses its own Tekken BPE")
        self.check_size(size)
        return MistralCommonBackend(tokenizer_path=str(tekken_file()))

    def load_processor(self, path):
        """transformers' VoxtralProcessor on the folder's feature extractor and a copy of its tekken.json."""
        from transformers import MistralCommonBackend, VoxtralProcessor, WhisperFeatureExtractor

        tekken = Path(path) / "tekken.json"
        if not tekken.is_file():
            raise FileNotFoundError(f"{path}: no tekken.json (Voxtral's tokenizer)")
        tokenizer = MistralCommonBackend(tokenizer_path=str(_tekken_copy(tekken.read_text(encoding="utf-8"))))
        return VoxtralProcessor(feature_extractor=WhisperFeatureExtractor.from_pretrained(path), tokenizer=tokenizer)

    def prepare(self, processor, waveforms, languages, force_language, sample_rate, contexts):
        """Through the processor's own transcription request; an utterance with a context list
        through its chat request instead (`chat_prompt`: the transcription request has no field for
        one). Each waveform goes to mistral_common as 16-bit WAV: lossless for audio read from
        16-bit files."""
        given = [lang if force_language else None for lang in languages]
        for i, lang in enumerate(given):
            if lang is not None and not re.fullmatch(r"[a-z]{2}", lang):
                raise ValueError(f"utterance {i}: voxtral takes ISO 639-1 language codes (two letters), not {lang!r}")
        if not any(contexts):
            batch = processor.apply_transcription_request(list(waveforms), model_id=MODEL_ID, language=given,
                                                          sampling_rate=sample_rate, format="wav")
            ids, attention, chunk_features = batch["input_ids"], batch["attention_mask"], batch["input_features"]
        else:  # one request an utterance, left-padded together
            rows = [self.chat_prompt(processor, w, ctx, lang, sample_rate) if ctx else
                    processor.apply_transcription_request([w], model_id=MODEL_ID, language=[lang],
                                                          sampling_rate=sample_rate, format="wav")
                    for w, ctx, lang in zip(waveforms, contexts, given)]
            ids, attention = _left_padded([r["input_ids"][0] for r in rows], processor.tokenizer.pad_token_id)
            chunk_features = torch.cat([r["input_features"] for r in rows])
        fe = processor.feature_extractor
        # mistral_common pads each waveform to whole 30 s chunks, in batch order
        chunks = [max(1, -(-len(w) // fe.n_samples)) for w in waveforms]
        return AudioPrompts(ids, attention, *_side_by_side(chunk_features, chunks, [len(w) for w in waveforms],
                                                           fe.hop_length), list(languages))

    def chat_prompt(self, processor, waveform, context, language, sample_rate) -> dict:
        """Voxtral's chat mode, the one whose user turn holds text beside the audio: the audio, then
        the instruction with the context list before it (`with_context`)::

            <s>[INST][BEGIN_AUDIO][AUDIO]*N Context: a, b. Transcribe the audio.[/INST]
        """
        name = LANGUAGE_NAMES.get(language) if language else None
        instruction = f"Transcribe the {name} audio." if name else CHAT_INSTRUCTION
        audio = {"type": "audio", "base64": _wav_base64(waveform, sample_rate)}
        conversation = [{"role": "user", "content": [audio, {"type": "text", "text": with_context(instruction, context)}]}]
        return processor.apply_chat_template(conversation, tokenize=True, return_dict=True, return_tensors="pt")

    def encode_audio(self, model, prompts):
        tower = self.audio_tower(model)
        h = tower(_chunks(prompts).to(tower.conv1.weight.dtype)).last_hidden_state
        # merge 4 consecutive states, as the model's own forward does (1500 per chunk divides evenly)
        return h.reshape(-1, model.config.audio_config.intermediate_size)

    def model_inputs(self, prompts):
        return dict(input_ids=prompts.input_ids, attention_mask=prompts.attention_mask, input_features=_chunks(prompts))

    # target_text / parse_output: the base's, Voxtral writes the transcript alone (a forced
    # language is in the prompt)

    def new_model(self, size, tokenizer, encoder, seed):
        from transformers import VoxtralConfig, VoxtralProcessor, WhisperFeatureExtractor

        spec = self.check_size(size)
        # untied head: VoxtralForConditionalGeneration declares no tied weights
        text = dict(model_type="llama", vocab_size=VOCAB_SIZE, max_position_embeddings=32768, tie_word_embeddings=False,
                    bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, **spec["text"])
        config = VoxtralConfig(audio_config=dict(num_mel_bins=128, max_source_positions=1500, **spec["audio"]),
                               text_config=text, audio_token_id=AUDIO, tie_word_embeddings=False)
        torch.manual_seed(seed)
        model = self.model_class()(config)
        model.generation_config.bos_token_id = BOS
        model.generation_config.pad_token_id = PAD
        model.generation_config.eos_token_id = EOS
        processor = VoxtralProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=128), tokenizer=tokenizer)
        return model, processor


def _chunks(prompts: AudioPrompts) -> torch.Tensor:
    """`(sum_i k_i, mels, 3000)`: every utterance's 30 s chunks in batch order (the processor's
    `input_features` layout), k_i = the chunks its real frames started."""
    counts = (-(-prompts.feature_mask.sum(-1) // CHUNK_FRAMES)).tolist()
    mels = prompts.features.shape[1]
    return torch.cat([prompts.features[i, :, : k * CHUNK_FRAMES].reshape(mels, k, CHUNK_FRAMES).transpose(0, 1)
                      for i, k in enumerate(counts)])


def _side_by_side(chunks: torch.Tensor, counts: list[int], samples: list[int], hop: int):
    """`(sum_i k_i, mels, F)` chunks -> `(B, mels, K * F)` features with each utterance's chunks
    side by side (zeros after them), and the `(B, K * F)` mask of its real audio frames."""
    per_chunk = chunks.shape[-1]
    rows = torch.split(chunks, counts)
    features = chunks.new_zeros(len(rows), chunks.shape[1], max(counts) * per_chunk)
    mask = torch.zeros(len(rows), features.shape[-1], dtype=torch.long)
    for i, (r, n) in enumerate(zip(rows, samples)):
        features[i, :, : r.shape[0] * per_chunk] = r.transpose(0, 1).reshape(r.shape[1], -1)
        mask[i, : min(r.shape[0] * per_chunk, -(-n // hop))] = 1
    return features, mask


def _left_padded(rows: list[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D id rows -> `(B, L)` ids left-padded with `pad_id` and their attention mask."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):], mask[i, width - len(r):] = r, 1
    return ids, mask


def _wav_base64(waveform, sample_rate: int) -> str:
    """A waveform as base64 16-bit WAV, what the transcription request builds from an array."""
    import base64
    import io

    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, waveform, sample_rate, format="WAV", subtype="PCM_16")
    return base64.b64encode(buf.getvalue()).decode("ascii")
