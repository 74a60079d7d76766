from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from asr_rl.models.audio_policy import AudioPolicy
from asr_rl.models.builders import init_model

# Runs in a fresh interpreter that never imports asr_rl: the folder must be plain transformers.
_PLAIN_LOAD = r"""
import sys, json, numpy as np, torch
from transformers import AutoProcessor, Qwen3ASRForConditionalGeneration
path, out = sys.argv[1], sys.argv[2]
assert "asr_rl" not in sys.modules
proc = AutoProcessor.from_pretrained(path)
model = Qwen3ASRForConditionalGeneration.from_pretrained(path).eval()
wav = np.sin(np.arange(16000) / 16000 * 2 * np.pi * 300).astype(np.float32) * 0.3
inp = proc.apply_transcription_request([wav], language=["English"])
inp.pop("num_audio_tokens", None)
with torch.no_grad():
    logits = model(**inp).logits
torch.save({"logits": logits, "ids": inp["input_ids"]}, out)
"""


def test_init_save_reload_in_plain_transformers_gives_identical_logits(tiny_model, tmp_path):
    script = tmp_path / "load.py"
    script.write_text(_PLAIN_LOAD)
    res = subprocess.run([sys.executable, str(script), str(tiny_model), str(tmp_path / "o.pt")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    plain = torch.load(tmp_path / "o.pt")
    policy = AudioPolicy.from_pretrained(tiny_model, force_language=True)
    wav = np.sin(np.arange(16000) / 16000 * 2 * np.pi * 300).astype(np.float32) * 0.3
    prompts = policy.prepare([wav], ["en"])
    assert torch.equal(prompts.input_ids, plain["ids"])
    with torch.no_grad():
        ours = policy.model(**policy.spec.model_inputs(prompts)).logits
    assert torch.equal(ours, plain["logits"])


def test_tokenizer_covers_corpus_and_language_tag_is_one_token(tiny_model, tiny_corpus):
    policy = AudioPolicy.from_pretrained(tiny_model)
    tok = policy.tokenizer
    for line in (tiny_corpus / "train.jsonl").read_text(encoding="utf-8").splitlines():
        text = json.loads(line)["text"]
        assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    assert tok.tokenize("language Chinese<asr_text>") == ["language Chinese", "<asr_text>"]


@pytest.mark.parametrize("arch, why", [("glm_asr", " (rotary positions, 128 mels)"),
                                       ("qwen2_5_omni", " (windowed attention, 128 mels)"), ("voxtral", " (128 mels)"),
                                       ("qwen3_asr", "")])
def test_a_random_tower_family_refuses_a_pretrained_encoder_before_building(arch, why):
    from asr_rl.models.families import FAMILIES

    # the base's `build` refuses: no tokenizer is needed, nothing is built
    with pytest.raises(ValueError) as e:
        FAMILIES.get(arch).build("tiny", None, encoder="whisper-tiny.en")
    assert str(e.value) == (f"{arch} builds with a randomly initialised audio tower{why}; a pretrained encoder "
                            "(--encoder) is for qwen2_audio (Whisper's encoder)")


def test_families_that_write_the_transcript_alone_take_the_base_target_and_parse():
    from asr_rl.models.families import FAMILIES

    for arch in ("glm_asr", "qwen2_5_omni", "voxtral"):
        spec = FAMILIES.get(arch)
        assert spec.target_text("hello world", "en", True) == "hello world"
        assert spec.parse_output(" hello world\n") == (None, "hello world", True)
    # a family that writes a language tag first still parses it
    assert FAMILIES.get("qwen3_asr").parse_output("language English<asr_text>hi") == ("English", "hi", True)


def test_init_refuses_bad_arguments(tiny_corpus, tmp_path):
    with pytest.raises(ValueError, match="unknown size 'huge' for qwen3_asr; choose one of tiny, small"):
        init_model("qwen3_asr", "huge", [tiny_corpus / "train.jsonl"], tmp_path / "a")
    with pytest.raises(ValueError, match="unknown arch 'whisper'; supported: ") as err:
        init_model("whisper", "tiny", [tiny_corpus / "train.jsonl"], tmp_path / "b")
    named = str(err.value).split("supported: ")[1].split(", ")
    assert sorted(named) == sorted(["qwen3_asr", "qwen2_audio", "glm_asr", "qwen2_5_omni", "voxtral", "qwen2", "qwen3"])
    with pytest.raises(FileNotFoundError, match="nope.jsonl does not exist"):
        init_model("qwen3_asr", "tiny", [tmp_path / "nope.jsonl"], tmp_path / "c")
    with pytest.raises(ValueError, match="a pretrained encoder .--encoder. is for qwen2_audio"):
        init_model("qwen3_asr", "tiny", [tiny_corpus / "train.jsonl"], tmp_path / "d", encoder="whisper-tiny.en")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(FileExistsError, match="not empty"):
        init_model("qwen3_asr", "tiny", [tiny_corpus / "train.jsonl"], tmp_path / "full")


def test_a_text_lm_s_character_vocabulary_survives_saving_and_every_loader(tmp_path):
    """transformers 5 loads a qwen2 folder's tokenizer as `Qwen2Tokenizer`, whose byte-level
    pre-tokenizer dropped the spaces, newlines and Mandarin of a character vocabulary; every loader
    of a text model (policy, reward model, judge) now reads the vocabulary as built."""
    import json

    from asr_rl.models.builders import init_model
    from asr_rl.models.text_policy import TextPolicy
    from asr_rl.models.tokenizer import load_tokenizer
    from asr_rl.rewards.reward_model import load_reward_model
    from asr_rl.trainer.recipes.rm import load_rm_from_lm

    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "打开灯 call anna\nnow"}) + "\n")
    lm = init_model("qwen2", "tiny", [tmp_path / "p.jsonl"], tmp_path / "lm")
    text = "打开灯 call anna\nnow"
    rm, rm_tokenizer = load_rm_from_lm(str(lm))
    rm.save_pretrained(tmp_path / "rm")
    rm_tokenizer.save_pretrained(tmp_path / "rm")
    for tokenizer in (load_tokenizer(lm), TextPolicy.from_pretrained(lm).tokenizer, rm_tokenizer,
                      load_reward_model(tmp_path / "rm")[1]):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert len(ids) == len(text) and tokenizer.decode(ids) == text  # one id a character, nothing dropped
