"""A released checkpoint (not built by `asr-rl model init`) gets the published fine-tuning rates;
our own folders keep the dataclass defaults; a config file or an override always wins."""
import shutil

from asr_rl.trainer.configs.rl import SFTConfig
from asr_rl.trainer.recipes.presets import load_with_checkpoint_presets
from asr_rl.trainer.recipes.rl import load_rl_config


def test_released_checkpoints_get_fine_tuning_rates_and_settings_win(tiny_model, tmp_path):
    released = tmp_path / "Qwen3-ASR-hf"
    shutil.copytree(tiny_model, released)
    (released / "asr_rl.json").unlink()  # as a folder from the hub has none
    sft = load_with_checkpoint_presets(SFTConfig, "sft", None, [f"pretrain={released}"])
    assert sft.optim.learning_rate == 1e-5 and sft.optim.weight_decay == 0.01  # SFT's other defaults stay
    assert load_with_checkpoint_presets(SFTConfig, "sft", None, [f"pretrain={tiny_model}"]).optim.learning_rate == 2e-3
    assert load_with_checkpoint_presets(SFTConfig, "sft", None, [f"pretrain={released}",
                                                                 "optim.learning_rate=3e-5"]).optim.learning_rate == 3e-5
    rl = load_rl_config("ppo", None, [f"pretrain={released}"])
    assert (rl.optim.actor_learning_rate, rl.optim.critic_learning_rate) == (1e-6, 9e-6)
    assert rl.algo.advantage_estimator == "gae"  # the algorithm preset still applies
    (tmp_path / "c.yaml").write_text("optim:\n  actor_learning_rate: 5.0e-6\n")
    assert load_rl_config("grpo", tmp_path / "c.yaml", [f"pretrain={released}"]).optim.actor_learning_rate == 5e-6
    assert load_rl_config("grpo", None, [f"pretrain={tiny_model}"]).optim.actor_learning_rate == 2e-4
