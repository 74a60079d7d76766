"""The shipped configs load with the current dataclasses (no stale or misspelt keys)."""
from __future__ import annotations

from pathlib import Path

from asr_rl.config import load_config
from asr_rl.trainer.configs.rl import RLConfig, SFTConfig

CONFIGS = Path(__file__).resolve().parents[1] / "recipes" / "configs"


def test_sft_demo_config_loads():
    # the pretrained encoder decides: frozen, no CTC (early stopping needs the dev set, given by run_sft.sh)
    cfg = load_config(SFTConfig, CONFIGS / "sft_demo.yaml", ["eval_manifest=dev.jsonl"])
    assert cfg.ctc_weight is None and cfg.model.freeze_encoder is None and cfg.augment.variants >= 1
    # the demo's SFT runs to its plateau: WSD, a decay when patience runs out, then a flat window at the floor
    assert cfg.optim.lr_scheduler == "warmup_stable_decay" and cfg.early_stopping_decay_steps > 0
    assert cfg.early_stopping_plateau_patience * cfg.eval_steps >= 1000 and cfg.eval.eval_max_samples >= 500


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


def test_grpo_test_time_config_loads():
    cfg = load_config(RLConfig, CONFIGS / "grpo_test_time.yaml")
    # no transcript anywhere: the reward needs none, no reference joins the groups, no labelled curve
    assert set(cfg.reward.terms) == {"consensus", "silence"} and not cfg.rollout.reference_in_group
    assert cfg.rollout.n_samples_per_prompt >= 2 and cfg.eval_steps == 0
