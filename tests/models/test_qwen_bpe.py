"""Qwen's released BPE, built offline from dashscope's qwen.tiktoken: the published encodings, and
each Qwen family's special tokens at their released ids."""
from __future__ import annotations

import pytest

from asr_rl.models.families import FAMILIES
from asr_rl.models.qwen_bpe import build_qwen_tokenizer


@pytest.fixture(scope="module")
def q3():
    return build_qwen_tokenizer(FAMILIES.get("qwen3_asr").tokenizer_spec(real_ids=True))


@pytest.mark.parametrize("text, ids", [
    ("Hello, world", [9707, 11, 1879]),   # the published Qwen2 encodings (issue 29)
    ("你好", [108386]),
    (" 7:30", [220, 22, 25, 18, 15]),     # one token a digit
    ("把空调调到26度", [99360, 102317, 47872, 26939, 17, 21, 26381]),
])
def test_released_encodings(q3, text, ids):
    assert q3.encode(text, add_special_tokens=False) == ids and q3.decode(ids) == text


@pytest.mark.parametrize("arch", ["qwen3_asr", "qwen2_audio", "qwen2_5_omni"])
def test_every_special_token_sits_at_its_released_id_and_is_one_token(arch):
    spec = FAMILIES.get(arch).tokenizer_spec(real_ids=True)
    tok = build_qwen_tokenizer(spec)
    for token, i in spec.ids.items():
        assert tok.convert_tokens_to_ids(token) == i and tok.encode(f"a{token}b", add_special_tokens=False)[1] == i
    assert (tok.convert_tokens_to_ids("<|endoftext|>"), tok.convert_tokens_to_ids("<|im_end|>")) == (151643, 151645)
    assert len(tok) == max(spec.ids.values()) + 1


def test_a_response_cut_inside_a_multi_byte_character_decodes_without_crashing(q3):
    ids = q3.encode("把空调调到26度", add_special_tokens=False)
    # a token that holds only part of a character's UTF-8 bytes exists: find a split that is not whole
    partial = [i for i in range(151643) if "\ufffd" in q3.decode([i])][:1]
    assert partial and q3.decode(ids[:3] + partial).startswith("把空调")


def test_model_init_with_qwen_s_bpe_writes_prompts_and_targets_in_the_released_ids(tiny_corpus, tmp_path):
    import numpy as np
    import torch

    from asr_rl.models.audio_policy import AudioPolicy
    from asr_rl.models.builders import init_model, read_info

    out = init_model("qwen3_asr", "tiny-real", [tiny_corpus / "train.jsonl"], tmp_path / "q3", tokenizer="qwen")
    assert read_info(out)["tokenizer"] == "qwen"
    policy = AudioPolicy.from_pretrained(out)
    wav = (0.3 * np.sin(np.arange(16000) / 16000 * 2 * np.pi * 300)).astype(np.float32)
    prompts = policy.prepare([wav], ["zh"])
    ids = prompts.input_ids[0][prompts.attention_mask[0].bool()].tolist()
    # <|im_start|>system\n<|im_end|>\n<|im_start|>user\n<|audio_start|> ... <|audio_end|><|im_end|>\n
    # <|im_start|>assistant\n: the released Qwen3-ASR prompt, its empty system turn included
    assert ids[:9] == [151644, 8948, 198, 151645, 198, 151644, 872, 198, 151669]
    assert ids[-6:] == [151670, 151645, 198, 151644, 77091, 198]
    target = policy.target_ids(["把空调调到26度"], ["zh"])
    row = target.ids[0][target.mask[0].bool()].tolist()
    assert row[-8:] == [99360, 102317, 47872, 26939, 17, 21, 26381, 151645] and 151704 in row
    # never sampled: the pad/<|endoftext|>, <|im_start|> and the audio tokens, the ids the character
    # tokenizer of tiny-real (the same released ids) forbids
    char = AudioPolicy.from_pretrained(init_model("qwen3_asr", "tiny-real", [tiny_corpus / "train.jsonl"],
                                                  tmp_path / "c", tokenizer="char"))
    assert policy.forbidden_ids == char.forbidden_ids == [151643, 151644, 151669, 151670, 151676]
    # a sampled response is decoded and parsed whatever its tokens (here a random model's)
    with torch.no_grad():
        out = policy.generate(prompts, n=2, max_new_tokens=6)
    assert len(out.texts) == 2 and all(isinstance(policy.parse(t, "zh")[1], str) for t in out.texts)
    with pytest.raises(ValueError, match="--tokenizer qwen: glm_asr takes 'char'"):
        init_model("glm_asr", "tiny", [tiny_corpus / "train.jsonl"], tmp_path / "g", tokenizer="qwen")


def test_a_response_ending_inside_a_character_is_parsed_and_scored_not_dropped(q3):
    import math

    from asr_rl.rewards.base import Sample
    from asr_rl.rewards.terms import cer_term, keyword_term

    prefix = q3.encode("language Chinese", add_special_tokens=False) + [151704]
    body = q3.encode("把空调调到26度", add_special_tokens=False)
    partial = next(i for i in range(151643) if "\ufffd" in q3.decode([i]))
    text = q3.decode(prefix + body[:2] + [partial], skip_special_tokens=False)
    language, transcript, ok = FAMILIES.get("qwen3_asr").parse_output(text)
    assert (language, ok) == ("Chinese", True) and transcript.startswith("把空调") and "\ufffd" in transcript
    sample = Sample(transcript, "把空调调到26度", "zh", keywords=("空调",))
    [c], [k] = cer_term([sample]), keyword_term([sample])
    assert math.isfinite(c) and 0 < c < 1 and k == 1.0  # the broken byte is one more error, not a crash
