"""The shipped configs load with the current dataclasses (no stale or misspelt keys)."""
from __future__ import annotations

from pathlib import Path

from asr_rl.config import load_config
from asr_rl.trainer.config import RLConfig, SFTConfig

CONFIGS = Path(__file__).resolve().parents[1] / "recipes" / "configs"


def test_sft_demo_config_loads():
    cfg = load_config(SFTConfig, CONFIGS / "sft_demo.yaml")  # the pretrained encoder decides: frozen, no CTC
    assert cfg.ctc_weight is None and cfg.model.freeze_encoder is None and cfg.augment.variants >= 1
    # early stopping and the WSD schedule are there to tune, and off: the demo runs its cosine to max_steps
    assert cfg.early_stopping_patience == 0 and cfg.optim.lr_scheduler == "cosine_with_min_lr"


def test_sft_scratch_config_loads():
    cfg = load_config(SFTConfig, CONFIGS / "sft_scratch.yaml")
    assert cfg.ctc_weight > 0 and cfg.model.freeze_encoder is False and cfg.data.bucket_batches > 0


def test_grpo_demo_config_loads():
    cfg = load_config(RLConfig, CONFIGS / "grpo_demo.yaml")
    assert cfg.algo.advantage_estimator == "group_norm" and cfg.algo.sft_coef == 0 and cfg.model.freeze_encoder is not False


def test_grpo_scratch_config_loads():
    cfg = load_config(RLConfig, CONFIGS / "grpo_scratch.yaml")
    assert cfg.algo.sft_coef == 1.0 and cfg.augment.noise_prob > 0


def test_ppo_text_config_loads():
    cfg = load_config(RLConfig, CONFIGS / "ppo_text.yaml")
    assert cfg.algo.advantage_estimator == "gae" and not cfg.algo.use_kl_loss
