"""`algo.sft_coef`: cross-entropy on the reference transcripts added to the policy loss (MWER + CE)."""
from __future__ import annotations

import pytest
import torch

from asr_rl.config import ConfigError
from asr_rl.data.audio import load_audio
from asr_rl.data.manifest import read_manifest
from asr_rl.trainer.update.ppo import actor_loss, reference_ce
from asr_rl.models.loading import load_policy
from asr_rl.trainer.configs.rl import AlgoConfig, ModelConfig
from asr_rl.trainer.recipes.rl import load_rl_config
from asr_rl.trainer.rollout.experience import Group, build_experience


@pytest.fixture
def policy_and_batch(tiny_model, tiny_corpus):
    torch.manual_seed(0)
    policy = load_policy(tiny_model, ModelConfig(), "cpu")
    utts = read_manifest(tiny_corpus / "train.jsonl")[:2]
    rows = policy.encode_prompts([load_audio(u.audio) for u in utts], [u.language for u in utts])
    # two sampled responses per utterance; equal rewards, so the group advantages are all zero
    groups = [Group(u, row, [[11, 12, policy.eos_id], [13]], ["", ""], rewards=[0.5, 0.5])
              for u, row in zip(utts, rows)]
    exp = build_experience(groups, 2, pad_id=policy.pad_id)
    exp.advantages = torch.zeros(exp.response_ids.shape)
    return policy, exp


def _reference_nll(policy, mb) -> torch.Tensor:
    """The same quantity by another road: mean -log p of every reference token (log-softmax + gather)."""
    embeds, mask = policy.embed_rows(mb.prompt_rows)
    targets = policy.target_ids([u.text for u in mb.items], [u.language for u in mb.items])
    logp = policy.logprobs(embeds, mask, targets)
    return -logp.sum() / targets.mask.sum()


def test_reference_ce_is_the_mean_nll_of_each_utterance_reference_once(policy_and_batch):
    policy, exp = policy_and_batch
    mb = exp.select([0, 1, 2, 3])
    assert [u.id for u in mb.items] == [g.item.id for g in exp.groups]  # one reference per utterance
    with torch.no_grad():
        assert float(reference_ce(policy, mb)) == pytest.approx(float(_reference_nll(policy, mb)), rel=1e-5)
        # a micro-batch holding samples of the second utterance only scores that utterance's reference
        second = exp.select([2, 3])
        assert [u.id for u in second.items] == [exp.groups[1].item.id]
        assert float(reference_ce(policy, second)) == pytest.approx(float(_reference_nll(policy, second)), rel=1e-5)


def test_sft_coef_adds_the_weighted_ce_and_pulls_the_policy_toward_the_references(policy_and_batch):
    policy, exp = policy_and_batch
    mb = exp.select([0, 1, 2, 3])
    algo = AlgoConfig(use_kl_loss=False, sft_coef=0.5)
    out = actor_loss(policy, mb, algo, temperature=1.0, kl_coef=0.0)
    # zero advantages: the policy-gradient term is 0; the weighted CE comes as the per-micro-batch term
    # (a mean over reference tokens, which the update does not weigh by response tokens)
    assert float(out.loss.detach()) == 0.0
    assert float(out.aux.detach()) == pytest.approx(0.5 * out.metrics["actor/sft_ce"], rel=1e-5)
    plain = actor_loss(policy, mb, AlgoConfig(use_kl_loss=False), 1.0, 0.0)
    assert "actor/sft_ce" not in plain.metrics and plain.aux is None

    params = [p for _, p in policy.trainable_parameters()]
    opt = torch.optim.Adam(params, lr=1e-3)
    before = out.metrics["actor/sft_ce"]
    for _ in range(3):
        opt.zero_grad()
        step = actor_loss(policy, mb, algo, temperature=1.0, kl_coef=0.0)
        (step.loss + step.aux).backward()
        opt.step()
    with torch.no_grad():
        after = float(reference_ce(policy, mb))
    assert after < before - 0.1, (before, after)


def test_sft_coef_needs_reference_transcripts(tmp_path):
    with pytest.raises(ConfigError, match=r"algo.sft_coef trains on reference transcripts.*prompt_data="):
        load_rl_config("grpo", None, [f"prompt_data={tmp_path / 'p.jsonl'}", "algo.sft_coef=0.5"])
    with pytest.raises(ConfigError, match=r"`algo.sft_coef` must be >= 0, got -1.0"):
        load_rl_config("grpo", None, ["algo.sft_coef=-1"])
