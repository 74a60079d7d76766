"""The text RLHF path end to end on a tiny Qwen2: reward-model training, PPO with critic and reward
model, GRPO with a reward function."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from asr_rl.config import load_config
from asr_rl.trainer.run.checkpoint import list_checkpoints, load_state
from asr_rl.trainer.run.metrics import read_metrics
from asr_rl.trainer.recipes.rl import train_rl
from asr_rl.trainer.configs.preference import RMConfig
from asr_rl.trainer.recipes.rm import train_rm

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reward_model(tiny_text_model, text_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("rm")
    train_rm(load_config(RMConfig, None, [f"pretrain={tiny_text_model}", f"prompt_data={text_data['prefs']}",
                                          f"output_dir={out}", "max_steps=40", "train_batch_size=8",
                                          "optim.learning_rate=0.003", "logging.tensorboard=false",
                                          "logging.progress_bar=false"]))
    return out


def test_reward_model_training_lowers_pairwise_loss(reward_model):
    rows = read_metrics(reward_model)
    first = sum(r["rm/loss"] for r in rows[:5]) / 5
    last = sum(r["rm/loss"] for r in rows[-5:]) / 5
    # chance level is log 2 = 0.693; the preferred words are learnable
    assert first > 0.6 and last < 0.5 * first
    assert sum(r["rm/accuracy"] for r in rows[-5:]) / 5 > 0.8
    assert (reward_model / "final" / "config.json").is_file()


def _text(model, data, out, *extra):
    return [f"pretrain={model}", f"prompt_data={data['prompts']}", f"output_dir={out}", "rollout_batch_size=4",
            "micro_train_batch_size=4", "max_new_tokens=8", "max_steps=3", "save_steps=1", "temperature=1.2",
            "actor_learning_rate=0.01", "logging.tensorboard=false", "logging.progress_bar=false", *extra]


def _params(path):
    return dict(AutoModelForCausalLM.from_pretrained(path).named_parameters())


def test_ppo_with_gae_critic_and_reward_model(tiny_text_model, text_data, reward_model, tmp_path):
    final = train_rl("ppo", None, _text(tiny_text_model, text_data, tmp_path / "ppo",
                                        f"reward_pretrain={reward_model / 'final'}", "init_kl_coef=0.05"))
    rows = read_metrics(tmp_path / "ppo")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all("kl/mean" in r and "critic/loss" in r and "reward/reward_model" in r for r in rows)
    before, after = _params(tiny_text_model), _params(final)
    assert any(not torch.equal(before[n], after[n]) for n in before)
    heads = [load_state(c)["workers"]["critic"]["weights"]["value_head.weight"]
             for c in list_checkpoints(tmp_path / "ppo")]
    assert not torch.equal(heads[0], heads[-1])


@pytest.mark.parametrize("estimator", ["group_norm", "rloo", "reinforce_baseline"])
def test_group_estimators_with_a_reward_function(tiny_text_model, text_data, tmp_path, estimator):
    reward = tmp_path / "r.py"
    reward.write_text("def reward_func(queries, prompts, labels, hypotheses=None, **kw):\n"
                      "    return [float(l in h) - 0.1 * len(h) for h, l in zip(hypotheses, labels)]\n")
    train_rl("grpo", None, _text(tiny_text_model, text_data, tmp_path / "g", f"reward.file={reward}",
                                 "n_samples_per_prompt=4", "micro_train_batch_size=8", "save_steps=0",
                                 f"advantage_estimator={estimator}", "rollout.dynamic_filtering=false"))
    rows = read_metrics(tmp_path / "g")
    assert len(rows) == 3 and all("reward/file" in r and "kl/loss" in r for r in rows)


def test_text_prompt_set_errors(tiny_text_model, tmp_path):
    from asr_rl.data.manifest import ManifestError

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"label": "x"}\n{"messages": []}\n')
    with pytest.raises(ManifestError, match=r"(?s)prompt set .*bad.jsonl:2: missing `prompt`.*bad.jsonl:3: `messages` must be"):
        train_rl("grpo", None, [f"pretrain={tiny_text_model}", f"prompt_data={bad}", f"output_dir={tmp_path / 'o'}"])
