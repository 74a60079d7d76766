"""The loop's guards: dynamic filtering, NaN rewards/losses, and configuration errors."""
from __future__ import annotations

import math

import pytest
import torch

from asr_rl.config import ConfigError
from asr_rl.rewards.base import RewardError, RewardOutput
import asr_rl.rewards.pipeline as pipeline
from asr_rl.trainer.update.ppo import TrainingDiverged, _epochs
from asr_rl.trainer.run.checkpoint import list_checkpoints
from asr_rl.algos.losses import LossOutput
from asr_rl.trainer.run.metrics import read_metrics
from asr_rl.trainer.recipes.rl import load_rl_config, run_audio_rl
from asr_rl.trainer.rollout.experience import Group, build_experience

from tests.trainer.driver.test_grpo_e2e import _overrides


class _Reward:
    """A reward whose values are given per call (a real reward callable, not a mock of the loop)."""

    name = "scripted"

    def __init__(self, script):
        self.script, self.calls = script, 0

    def __call__(self, samples):
        values = self.script(self.calls, len(samples))
        self.calls += 1
        return RewardOutput(rewards=values, terms={"scripted": values})


def _run_with_reward(monkeypatch, reward, *args):
    monkeypatch.setattr(pipeline, "make_reward", lambda cfg, *_: reward)  # the run builds its reward here
    return run_audio_rl(load_rl_config("grpo", None, list(args)))


def test_dynamic_filtering_drops_tied_groups_and_refills(tiny_model, tiny_corpus, tmp_path, monkeypatch):
    # call 0: every group ties (all zeros) -> all filtered; later calls: distinct rewards
    reward = _Reward(lambda call, n: [0.0] * n if call == 0 else [float(i % 4) for i in range(n)])
    _run_with_reward(monkeypatch, reward, *_overrides(tiny_model, tiny_corpus, tmp_path / "r", "max_steps=1"))
    (row,) = read_metrics(tmp_path / "r")
    assert row["rollout/groups_filtered"] == 2 and row["rollout/groups_kept"] == 2 and row["rollout/rounds"] == 2


def test_rounds_sized_by_the_predicted_keep_rate_refill_less(tiny_model, tiny_corpus, tmp_path, monkeypatch):
    """Half the utterances always tie (by id): drawing one batch a round and refilling
    (max_oversample=1) takes more rounds than rounds sized by the keep rate (refill.py), which
    still trains on rollout_batch_size groups a step."""
    import zlib

    def script(call, samples):
        return [1.0 if zlib.crc32(s.prompt.encode()) % 2 else float(i % 4) for i, s in enumerate(samples)]

    class ById(_Reward):
        def __call__(self, samples):
            values = script(self.calls, samples)
            self.calls += 1
            return RewardOutput(rewards=values, terms={"scripted": values})

    rounds = {}
    for factor in (1, 3):
        out = tmp_path / f"x{factor}"
        _run_with_reward(monkeypatch, ById(None), *_overrides(tiny_model, tiny_corpus, out, "max_steps=4", "save_steps=0",
                                                               f"rollout.max_oversample={factor}"))
        rows = read_metrics(out)
        assert all(r["rollout/groups_kept"] == 2 for r in rows)
        rounds[factor] = sum(r["rollout/rounds"] for r in rows)
    assert rounds[3] < rounds[1], rounds


def test_filtering_that_never_finds_signal_is_a_clear_error(tiny_model, tiny_corpus, tmp_path, monkeypatch):
    # rounds of 2, 5, 6, 6 prompts (refill.py: the keep rate 1 -> 0.7 -> 0.49 -> 0.343 sizes rounds 2-4:
    # 5 prompts at 0.7 give 3.5 - sqrt(1.05) >= 2; at 0.49 the cap of 3 x 2 is reached first)
    reward = _Reward(lambda call, n: [1.0] * n)
    with pytest.raises(RuntimeError, match="dynamic filtering kept 0 of 19 groups in 4 rounds"):
        _run_with_reward(monkeypatch, reward, *_overrides(tiny_model, tiny_corpus, tmp_path / "r", "max_steps=1"))


def test_nan_reward_stops_the_run_and_keeps_the_last_checkpoint(tiny_model, tiny_corpus, tmp_path, monkeypatch):
    reward = _Reward(lambda call, n: [float(i % 3) for i in range(n)] if call < 1 else [math.nan] * n)
    with pytest.raises(RewardError, match="reward 'scripted' returned nan for sample 0"):
        _run_with_reward(monkeypatch, reward, *_overrides(tiny_model, tiny_corpus, tmp_path / "r"))
    (ckpt,) = list_checkpoints(tmp_path / "r")
    assert ckpt.name == "step_000001" and (ckpt / "model.safetensors").is_file()


def _local_strategy(w):
    from asr_rl.trainer.configs.optim import OptimConfig
    from asr_rl.trainer.update.strategy import LocalStrategy

    optim = OptimConfig(learning_rate=0.1, adam_betas=(0.9, 0.999), max_norm=1e9, lr_warmup_ratio=0.0,
                        lr_scheduler="constant_with_warmup")
    return LocalStrategy.from_config([w], optim, total_steps=10)


def test_nan_loss_raises_before_the_optimizer_steps():
    w = torch.nn.Parameter(torch.tensor(1.0))
    groups = [Group(None, None, [[1, 2], [3]], ["a", "b"], rewards=[0.0, 1.0])]
    exp = build_experience(groups, 2, pad_id=0)
    with pytest.raises(TrainingDiverged, match="actor loss is nan"):
        _epochs(exp, 1, 2, 2, 0, _local_strategy(w), lambda mb: LossOutput(w * math.nan, {}), prefix="actor")
    assert float(w.detach()) == 1.0 and w.grad is None  # stopped before backward and step


@pytest.mark.parametrize("mode, expected_grad", [
    # responses [4], [1, 1, 1] and [2, 2] (token values c), per-token loss w * c; micro-batches of 2
    # sequences, so the minibatch of 3 splits unevenly into {[4], [1, 1, 1]} and {[2, 2]}:
    #   token-mean over the minibatch: (4 + 1 + 1 + 1 + 2 + 2) / 6 tokens = 11/6
    #   (the mean of the micro-batches' own token means would be (7/4 + 4/2) / 2 = 1.875)
    #   seq-mean-token-mean: (4/1 + 3/3 + 4/2) / 3 sequences = 7/3
    #   (the mean of the micro-batches' own seq means would be ((4 + 1) / 2 + 2) / 2 = 2.25)
    #   seq-mean-token-sum: (4 + 3 + 4) / 3 = 11/3
    ("token-mean", 11 / 6), ("seq-mean-token-mean", 7 / 3), ("seq-mean-token-sum", 11 / 3)])
def test_minibatch_loss_is_aggregated_over_all_its_micro_batches(mode, expected_grad):
    from asr_rl.algos.losses import aggregate_loss

    def loss_fn(mb, w):
        return LossOutput(aggregate_loss(w * mb.response_ids.float(), mb.response_mask, mode), {})

    assert _step_gradient(loss_fn, mode) == [pytest.approx(expected_grad)]


def _step_gradient(loss_fn, loss_agg_mode: str) -> list[float]:
    """The gradient of w each optimiser step applies, for `loss_fn(micro_batch, w)` over responses
    [4], [1, 1, 1], [2, 2] in micro-batches of 2 (one minibatch of 3)."""
    w = torch.nn.Parameter(torch.tensor(1.0))
    exp = build_experience([Group(None, None, [[4], [1, 1, 1], [2, 2]], ["a", "b", "c"], rewards=[0.0, 1.0, 2.0])],
                           3, pad_id=0)
    grads = []
    strategy = _local_strategy(w)
    step = strategy.step
    strategy.step = lambda: (grads.append(float(w.grad)), step())[1]  # read the gradient the step applies
    _epochs(exp, 1, 2, 3, 0, strategy, lambda mb: loss_fn(mb, w), prefix="actor", loss_agg_mode=loss_agg_mode)
    return grads


def test_each_loss_part_is_weighed_by_the_count_of_its_own_mode():
    # the same responses as above, micro-batches {[4], [1, 1, 1]} and {[2, 2]}; one part a seq mean
    # (7/3 over the minibatch), the other a token mean (11/6): d/dw = 7/3 + 11/6 = 25/6
    from asr_rl.algos.losses import aggregate_loss

    def loss_fn(mb, w):
        x, m = w * mb.response_ids.float(), mb.response_mask
        parts = {mode: aggregate_loss(x, m, mode) for mode in ("seq-mean-token-mean", "token-mean")}
        return LossOutput(sum(parts.values()), {}, parts=parts)

    assert _step_gradient(loss_fn, "seq-mean-token-sum") == [pytest.approx(25 / 6)]


@pytest.mark.parametrize("overrides, message", [
    (["n_samples_per_prompt=1"], "needs n_samples_per_prompt >= 2"),
    (["rollout_batch_size=3", "n_samples_per_prompt=4", "micro_train_batch_size=5"], "not a multiple of micro"),
    (["rollout_batch_size=3", "n_samples_per_prompt=4", "train_batch_size=5"], "not a multiple of train_batch_size 5"),
    (["advantage_estimator=gae"], "gae needs a critic"),
    (["model.freeze_encoder=false"], "RL keeps the audio encoder frozen"),
])
def test_configuration_errors(overrides, message):
    with pytest.raises((ConfigError, ValueError), match=message):
        load_rl_config("grpo", None, overrides)


def test_pretrain_not_an_audio_llm_and_empty_manifest(tiny_model, tiny_corpus, tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="holds no utterances"):
        run_audio_rl(load_rl_config("grpo", None, _overrides(tiny_model, tiny_corpus, tmp_path / "a")[:1] + [
            f"train_manifest={tmp_path / 'empty.jsonl'}", f"output_dir={tmp_path / 'a'}"]))
    with pytest.raises(ValueError, match=f"`pretrain={tmp_path}`: {tmp_path} is not a model folder with config.json"):
        run_audio_rl(load_rl_config("grpo", None, [f"pretrain={tmp_path}", f"train_manifest={tiny_corpus / 'train.jsonl'}",
                                                   f"output_dir={tmp_path / 'b'}"]))
    assert not (tmp_path / "b").exists()  # refused before the run folder was made


def test_length_penalties_hit_long_and_cut_responses_before_the_estimator():
    from types import SimpleNamespace

    from asr_rl.trainer.driver.loop import RLTrainer

    cfg = load_rl_config("grpo", None, ["rollout.max_new_tokens=4", "algo.overlong_buffer_len=2",
                                        "algo.stop_properly_penalty_coef=0.5"])
    # EOS is 9; max_new_tokens 4, buffer 2: overlong from 2 tokens, -(L - 2) / 2. Rewards 2 each:
    #   [1, 9]        2 tokens, ended                    2
    #   [1, 2, 9]     3 tokens, ended: -0.5              1.5
    #   [1, 2, 3, 4]  4 tokens, cut (no EOS): -1, * 0.5  0.5
    #   [1, 2, 3, 9]  4 tokens, ended at the limit: -1   1
    exp = build_experience([Group(None, None, [[1, 9], [1, 2, 9], [1, 2, 3, 4], [1, 2, 3, 9]], ["a"] * 4,
                                  rewards=[2.0] * 4)], 4, pad_id=0)
    trainer = SimpleNamespace(cfg=cfg, backend=SimpleNamespace(eos_id=9))
    assert RLTrainer.shape_rewards(trainer, exp).tolist() == [2.0, 1.5, 0.5, 1.0]
    # a reference member (off-policy) keeps its reward
    exp.off_policy = torch.tensor([False, False, True, False])
    assert RLTrainer.shape_rewards(trainer, exp).tolist() == [2.0, 1.5, 2.0, 1.0]


def test_dynamic_filtering_range_drops_groups_whose_mean_reward_is_outside():
    from types import SimpleNamespace

    from asr_rl.trainer.driver.loop import RLTrainer

    def keeps(band, rewards, off=None):
        cfg = load_rl_config("grpo", None, [] if band is None else [f"rollout.dynamic_filtering_range={band}"])
        group = Group(None, None, [[1]] * len(rewards), ["a"] * len(rewards), rewards=rewards, off_policy=off)
        return RLTrainer.keep_group(SimpleNamespace(cfg=cfg), group)

    assert keeps(None, [0.0, 1.0, 1.0, 1.0]) and not keeps(None, [1.0, 1.0])  # ties only
    assert keeps("[0,1]", [0.0, 1.0, 1.0, 1.0]) and not keeps("[0,0.7]", [0.0, 1.0, 1.0, 1.0])  # mean 0.75
    # the mean is over the sampled members: a reference scoring 1 does not lift [0, 0.5] to 0.5
    assert not keeps("[0.4,1]", [0.0, 0.5, 1.0], off=[False, False, True])
    with pytest.raises((ConfigError, ValueError), match=r"dynamic_filtering_range must be \[low, high\]"):
        load_rl_config("grpo", None, ["rollout.dynamic_filtering_range=[1,0]"])
