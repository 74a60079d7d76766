"""Which folders a run starts from: an audio run refuses a text LM by what it is, first."""
from __future__ import annotations

import pytest

from asr_rl.cli import main


@pytest.mark.parametrize("algo, hint", [
    ("grpo", "; a text LM trains on prompts: prompt_data=PATH without train_manifest"),
    ("sft", ""),
])
def test_an_audio_run_from_a_text_lm_says_so_before_the_characters_its_tokenizer_lacks(
        tiny_text_model, tone_manifest, tmp_path, capsys, algo, hint):
    # tone_manifest holds Chinese, which the text LM's tokenizer lacks: that complaint must not come first
    out = tmp_path / "run"
    assert main(["train", algo, f"pretrain={tiny_text_model}", f"train_manifest={tone_manifest}",
                 f"output_dir={out}"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (f"asr-rl: error: `pretrain={tiny_text_model}`: this folder is a text LM (qwen2), not an "
                      "audio-LLM; audio training needs one of glm_asr, qwen2_audio, qwen2_5_omni, qwen3_asr, voxtral "
                      f"(e.g. `asr-rl model init --arch qwen2_audio`){hint}")
    assert not out.exists()  # refused before the run folder was touched
