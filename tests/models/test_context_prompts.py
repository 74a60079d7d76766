"""A context list in each family's prompt (contextual biasing): where each family puts it, token for
token against its processor; no list renders today's prompt exactly; the encoder cache keeps one
prompt per (audio, list)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from asr_rl.data.batching import AudioBatch
from asr_rl.models.audio_policy import AudioPolicy

CONTEXT = ("grace", "living room")
WAV = (0.3 * np.sin(np.arange(16000) / 16000 * 2 * np.pi * 300)).astype(np.float32)


@pytest.fixture(scope="module")
def built(tiny_corpus, tmp_path_factory):
    """arch -> a tiny policy of that family (Qwen3-ASR on the released ids, tiny-real)."""
    from asr_rl.models.builders import init_model

    root = tmp_path_factory.mktemp("ctx")
    sizes = {"qwen2_audio": "tiny", "qwen2_5_omni": "tiny", "glm_asr": "tiny", "qwen3_asr": "tiny-real",
             "voxtral": "tiny"}
    return {arch: AudioPolicy.from_pretrained(init_model(arch, size, [tiny_corpus / "train.jsonl"], root / arch))
            for arch, size in sizes.items()}


def _text(policy, prompts) -> str:
    return policy.tokenizer.decode(prompts.input_ids[0][prompts.attention_mask[0].bool()])


@pytest.mark.parametrize("arch", ["qwen2_audio", "qwen2_5_omni", "glm_asr", "qwen3_asr"])
def test_no_context_is_today_s_prompt_and_a_context_is_where_the_family_puts_it(built, arch):
    policy = built[arch]
    today = policy.spec.prepare(policy.processor, [WAV], ["en"], False, 16000, [()])
    assert torch.equal(policy.prepare([WAV], ["en"]).input_ids, today.input_ids)
    with_ctx = policy.prepare([WAV], ["en"], contexts=[CONTEXT])
    plain, biased = _text(policy, today), _text(policy, with_ctx)
    if arch == "qwen3_asr":  # the processor's `prompt`: a system message before the user turn
        # the released prompt has the system turn even empty: the list becomes its text
        assert plain.startswith("<|im_start|>system\n<|im_end|>\n<|im_start|>user\n")
        assert biased == plain.replace("system\n<|im_end|>", "system\ngrace, living room<|im_end|>", 1)
        ref = policy.processor.apply_transcription_request([WAV], prompt="grace, living room",
                                                           processor_kwargs={"sampling_rate": 16000})
        assert torch.equal(with_ctx.input_ids.cpu(), ref["input_ids"])
        assert int(ref["input_ids"][0, 0]) == 151644  # <|im_start|> at its released id
    else:  # before the family's instruction text, the rest of the prompt unchanged
        instruction = {"qwen2_audio": "Detect the language and recognize the speech:",
                       "qwen2_5_omni": "Transcribe the audio into text.",
                       "glm_asr": "Please transcribe this audio into text"}[arch]
        assert instruction in plain
        assert biased == plain.replace(instruction, f"Context: grace, living room. {instruction}")
    # the audio is the same: as many placeholders, the same features
    audio = policy.audio_positions
    assert int(audio(with_ctx.input_ids).sum()) == int(audio(today.input_ids).sum())
    assert torch.equal(with_ctx.features, today.features)


def test_glm_asr_s_context_goes_through_its_processor_s_prompt_argument(built):
    policy = built["glm_asr"]
    ref = policy.processor.apply_transcription_request(
        [WAV], prompt="Context: grace, living room. Please transcribe this audio into text",
        processor_kwargs={"sampling_rate": 16000})
    assert torch.equal(policy.prepare([WAV], ["en"], contexts=[CONTEXT]).input_ids.cpu(), ref["input_ids"])


def test_voxtral_takes_a_context_list_through_its_chat_request(built):
    """Voxtral's transcription request has no field for a list: an utterance with one takes the
    chat request (audio, then "Context: ... Transcribe the audio."), token for token the
    processor's; in the same batch an utterance without one keeps today's prompt exactly."""
    from asr_rl.models.families.voxtral import _wav_base64

    policy = built["voxtral"]
    today = policy.spec.prepare(policy.processor, [WAV], ["en"], False, 16000, [()])
    mixed = policy.prepare([WAV, WAV], ["en", "en"], contexts=[(), CONTEXT])
    rows = [mixed.input_ids[i][mixed.attention_mask[i].bool()] for i in range(2)]
    assert torch.equal(rows[0], today.input_ids[0])
    user = [{"type": "audio", "base64": _wav_base64(WAV, 16000)},
            {"type": "text", "text": "Context: grace, living room. Transcribe the audio."}]
    ref = policy.processor.apply_chat_template([{"role": "user", "content": user}], tokenize=True, return_dict=True,
                                               return_tensors="pt")
    assert torch.equal(rows[1], ref["input_ids"][0])
    assert "Context: grace, living room. Transcribe the audio.[/INST]" in policy.tokenizer.decode(rows[1].tolist())
    audio = policy.audio_positions(mixed.input_ids).sum(-1)
    assert audio[0] == audio[1] == policy.audio_positions(today.input_ids).sum()
    assert torch.equal(mixed.features[0], mixed.features[1]) and torch.equal(mixed.features[:1], today.features)


def test_the_encoder_cache_keeps_one_prompt_per_audio_and_context(built, tiny_corpus):
    from asr_rl.data.batching import load_batch
    from asr_rl.data.manifest import read_manifest

    policy = built["qwen2_audio"]
    policy.freeze()
    policy.encoder_cache.clear()
    utt = read_manifest(tiny_corpus / "train.jsonl")[0]
    wav = load_batch([utt]).waveforms[0]
    plain, biased = utt, dataclasses.replace(utt, context=CONTEXT)
    batch = AudioBatch([plain, biased, plain], [wav, wav, wav])
    assert batch.cache_keys[0] == batch.cache_keys[2] != batch.cache_keys[1]
    rows = policy.encode_batch(batch)
    assert len(policy.encoder_cache) == 2 and rows[0] is rows[2]
    assert torch.equal(rows[0].audio, rows[1].audio) and len(rows[1].ids) > len(rows[0].ids)
    # the cached rows are the ones prepare makes now
    fresh = policy.prepare([wav], [utt.language], contexts=[CONTEXT])
    assert torch.equal(rows[1].ids, fresh.input_ids[0][fresh.attention_mask[0].bool()])
