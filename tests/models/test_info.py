"""`asr-rl model info`: family, parameter split, default freezing and the prompt, without reading weights."""
from __future__ import annotations

import json
import subprocess
import sys

from asr_rl.models.audio_policy import AudioPolicy
from asr_rl.models.info import model_info


def test_qwen2_audio_info_counts_each_part_and_shows_the_real_prompt(whisper_model):
    info = model_info(whisper_model)
    policy = AudioPolicy.from_pretrained(whisper_model)
    tower = sum(p.numel() for p in policy.spec.audio_tower(policy.model).parameters())
    assert info["family"] == "qwen2_audio" and info["class"] == "Qwen2AudioForConditionalGeneration"
    assert info["parameters"]["audio encoder"] == tower
    assert info["parameters"]["total"] == sum(p.numel() for p in policy.model.parameters())
    # the Whisper tiny.en tower is pretrained: frozen in SFT and RL, and the patterns cover exactly it
    assert info["frozen by default"]["parameters"] == tower
    assert info["frozen by default"]["SFT"] == "frozen"
    # 2 s = 200 mel frames -> 50 placeholders, shown once with their count
    assert info["prompt"] == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nAudio 1: "
                              "<|audio_bos|><|AUDIO|> x 50<|audio_eos|>\nDetect the language and recognize the speech:"
                              "<|im_end|>\n<|im_start|>assistant\n")
    assert info["built_by"]["encoder"] == "whisper-tiny.en"


def test_a_random_encoder_trains_in_sft_and_the_cli_prints_json(tiny_model):
    out = subprocess.run([sys.executable, "-m", "asr_rl.cli", "model", "info", str(tiny_model), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    info = json.loads(out.stdout)
    assert info["family"] == "qwen3_asr"
    assert info["frozen by default"]["SFT"].startswith("trains")
    assert "<|audio_start|><|audio_pad|> x " in info["prompt"]
    assert info["presets"] == "the dataclass defaults"  # model init's folder, not a released checkpoint


def test_a_folder_without_config_is_named(tmp_path):
    out = subprocess.run([sys.executable, "-m", "asr_rl.cli", "model", "info", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and f"{tmp_path}" in out.stderr and "config.json" in out.stderr


def test_a_config_of_another_model_type_that_builds_no_model_is_one_line_naming_the_file(tmp_path, capsys):
    from asr_rl.cli import main

    folder = tmp_path / "m"
    folder.mkdir()
    config = folder / "config.json"
    config.write_text(json.dumps({"model_type": "qwen2", "rope_scaling": {"type": "bogus"}}))
    assert main(["model", "info", str(folder)]) == 2
    assert capsys.readouterr().err.splitlines()[0] == (f"asr-rl: error: {config} is not a valid model config: "
                                                       "KeyError 'bogus'")
    config.write_text(json.dumps({"model_type": "vit"}))  # valid, but neither an audio-LLM nor a causal LM
    assert main(["model", "info", str(folder)]) == 2
    assert capsys.readouterr().err.splitlines()[0].startswith(
        f"asr-rl: error: {config}: model type 'vit' is neither an audio-LLM (glmasr, ")
