"""`rollout.reference_in_group`: the reference transcript as an off-policy group member (LUFFY,
arXiv:2504.14945), from the experience's layout to a real GRPO step on the tiny model."""
from __future__ import annotations

import math

import pytest
import torch

import asr_rl.rewards.pipeline as pipeline
from asr_rl.config import load_config
from asr_rl.trainer.configs.rl import RLConfig
from asr_rl.trainer.recipes.rl import load_rl_config, run_audio_rl
from asr_rl.trainer.driver.loop import RLTrainer
from asr_rl.trainer.rollout.experience import Group, add_references, build_experience, merge_reward_outputs
from asr_rl.trainer.run.metrics import read_metrics

from tests.trainer.driver.test_grpo_e2e import _overrides, _params


def test_reference_member_rows_mask_and_advantages_by_hand():
    # one group of n = 2 samples + the reference: rewards [0.2, 0.6] + [1.0]. GRPO over all three:
    # mean 0.6, unbiased std sqrt((0.16 + 0 + 0.16) / 2) = 0.4 -> advantages -1, 0, +1 (eps 1e-6)
    g = Group("u", None, [[5, 6], [7]], ["ab", "c"], rollout_logps=[[-0.1, -0.2], [-0.3]])
    add_references([g], [[8, 9, 2]], decode=lambda ids: "ref")
    assert g.responses == [[5, 6], [7], [8, 9, 2]] and g.texts == ["ab", "c", "ref"]
    assert g.off_policy == [False, False, True] and g.rollout_logps[2] == [0.0, 0.0, 0.0]
    g.rewards = [0.2, 0.6, 1.0]
    exp = build_experience([g], 3, pad_id=0)
    assert exp.off_policy.tolist() == [False, False, True] and exp.response_mask[2].tolist() == [1, 1, 1]
    assert exp.select([1, 2]).off_policy.tolist() == [False, True]
    assert exp.subset_groups([0]).off_policy.tolist() == [False, False, True]
    cfg = load_config(RLConfig, None, ["n_samples_per_prompt=2", "rollout_batch_size=1", "init_kl_coef=0.1",
                                       "use_kl_loss=false", "kl_estimator=k1", "rollout.reference_in_group=true",
                                       "micro_train_batch_size=3"])
    # with a KL penalty in the reward: k1 = old - ref = 1 on every token, coef 0.1, but the reference
    # row (not sampled by the policy) gets none. Token rewards -0.1 each, the shaped sequence reward
    # at the last token, summed to go (gamma 1):
    #   row 0: [-0.1, -a - 0.1] -> [-a - 0.2, -a - 0.1]; row 1: [-0.1]; row 2: [a, a, a]
    exp.old_logp, exp.ref_logp = torch.zeros(3, 3), torch.full((3, 3), -1.0)
    RLTrainer(cfg, None, None, None, None, None).compute_advantages(exp)
    a = 0.4 / (0.4 + 1e-6)
    expected = torch.tensor([[-a - 0.2, -a - 0.1, 0.0], [-0.1, 0.0, 0.0], [a, a, a]])
    torch.testing.assert_close(exp.advantages, expected, atol=1e-5, rtol=0)
    # the logged rewards are the policy's samples only
    assert merge_reward_outputs([g]).rewards == [0.2, 0.6]


@pytest.mark.slow
def test_reference_joins_its_group_with_the_top_reward_and_the_step_trains(tiny_model, tiny_corpus, tmp_path,
                                                                         monkeypatch):
    calls = []
    real = pipeline.make_reward

    def recording(cfg, *args):
        reward = real(cfg, *args)

        def score(samples):
            out = reward(samples)
            calls.append((samples, out.rewards))
            return out

        score.name = "recorded"
        return score

    monkeypatch.setattr(pipeline, "make_reward", recording)
    final = run_audio_rl(load_rl_config("grpo", None, _overrides(
        tiny_model, tiny_corpus, tmp_path / "r", "max_steps=1", "save_steps=0", "rollout.reference_in_group=true",
        "micro_train_batch_size=5", "data.sampler=signal")))
    samples, rewards = calls[0]
    assert len(samples) == 2 * (4 + 1)  # 2 groups of n = 4 samples + the reference
    for b in range(2):
        group, ref = rewards[5 * b:5 * b + 5], samples[5 * b + 4]
        assert ref.hypothesis == ref.reference  # the target encoding decodes and parses back to the text
        assert group[4] == max(group) == 1.0 and min(group[:4]) < 1.0  # the random model errs
    row = read_metrics(tmp_path / "r")[0]
    assert row["reward/mean"] == pytest.approx(sum(rewards[:4] + rewards[5:9]) / 8)  # the samples only
    utterances = len((tiny_corpus / "train.jsonl").read_text().splitlines())
    assert 0.0 < row["policy/off_policy_prob"] < 1.0
    assert row["sampler/seen_share"] == pytest.approx(2 / utterances)  # the signal sampler got its feedback
    before, after = _params(tiny_model), _params(final)
    assert any(not torch.equal(before[n], after[n]) for n in before if "language_model.layers" in n)
    assert math.isfinite(row["actor/loss"])


@pytest.mark.slow
@pytest.mark.parametrize("extra", [
    ["max_epochs=2", "algo.rollout_correction=icepop", "algo.entropy_token_top_ratio=0.2"],
    ["policy_loss=gspo", "use_kl_loss=false", "init_kl_coef=0.05"],
])
def test_reference_member_with_old_logprobs_correction_entropy_tokens_and_gspo(tiny_model, tiny_corpus, tmp_path,
                                                                              extra):
    run_audio_rl(load_rl_config("grpo", None, _overrides(
        tiny_model, tiny_corpus, tmp_path / "r", "max_steps=1", "save_steps=0", "rollout.reference_in_group=true",
        "micro_train_batch_size=5", *extra)))
    (row,) = read_metrics(tmp_path / "r")
    assert row["actor/grad_norm"] > 0 and row["rollout/groups_kept"] == 2
    # the engine's log-probs exist for the samples only: the mismatch is measured on them, ~0 here
    assert abs(row["rollout_corr/kl"]) < 1e-4
    assert ("policy/entropy_tokens_kept" in row) == ("algo.entropy_token_top_ratio=0.2" in extra)
    if "algo.entropy_token_top_ratio=0.2" in extra:
        assert 0.2 <= row["policy/entropy_tokens_kept"] < 0.5  # ceil(0.2 n) of each micro-batch's n tokens


@pytest.mark.slow
def test_groups_whose_samples_all_equal_the_reference_still_tie_and_are_filtered(tiny_model, tiny_corpus, tmp_path,
                                                                                monkeypatch):
    from tests.trainer.driver.test_loop import _Reward, _run_with_reward

    sizes = []
    reward = _Reward(lambda call, n: sizes.append(n) or [1.0] * n)  # every sample as good as the reference
    with pytest.raises(RuntimeError, match="dynamic filtering kept 0 of 8 groups in 4 rounds"):
        _run_with_reward(monkeypatch, reward, *_overrides(tiny_model, tiny_corpus, tmp_path / "r", "max_steps=1",
                                                          "rollout.reference_in_group=true", "micro_train_batch_size=5",
                                                          "rollout.max_oversample=1"))  # rounds of one batch
    assert sizes == [10] * 4  # each round scored 2 groups of 4 samples + the reference
