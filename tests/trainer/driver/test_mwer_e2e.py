"""N-best groups and MWER end to end on the tiny model: `rollout.mode=beam` through the HF engine,
the `mwer` estimator and loss, the local loop."""
from __future__ import annotations

import pytest
import torch

import asr_rl.rewards.pipeline as pipeline
import asr_rl.trainer.driver.loop as loop
from asr_rl.trainer.recipes.rl import load_rl_config, run_audio_rl
from asr_rl.trainer.run.metrics import read_metrics
from tests.trainer.rollout.test_engines import _Reward
from tests.trainer.driver.test_grpo_e2e import _overrides, _params

pytestmark = pytest.mark.slow

MWER = ["rollout.mode=beam", "policy_loss=mwer", "advantage_estimator=mwer", "loss_agg_mode=seq-mean-token-mean"]


def make_ending_model(tiny_model, tiny_corpus, out):
    """The tiny model with its EOS logit raised, saved to `out`: the random model's beams never end
    (every one loops to max_new_tokens), a trained model's mostly do. The EOS row of the head moves
    along the mean hidden state by 1.5x the mean gap between the top logit and EOS's, which on this
    model ends most beams within 8 tokens, at several lengths, and leaves some cut."""
    from asr_rl.data.batching import lazy_batch
    from asr_rl.data.manifest import read_manifest
    from asr_rl.models.audio_policy import AudioPolicy

    policy = AudioPolicy.from_pretrained(tiny_model).eval()
    rows = policy.encode_batch(lazy_batch(read_manifest(tiny_corpus / "train.jsonl"), policy.sample_rate))
    embeds, mask = policy.embed_rows(rows)
    with torch.no_grad():
        greedy = policy.generate_from_embeds(embeds, mask, 1, do_sample=False, max_new_tokens=8)
        hidden = policy.response_hidden(embeds, mask, greedy)
        head = policy.model.lm_head.weight
        logits = hidden @ head.T
        gap = (logits.max(-1).values - logits[..., policy.eos_id]).mean()
        m = hidden.mean((0, 1))
        head[policy.eos_id] += 1.5 * gap * m / (m @ m)
    policy.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def ending_model(tiny_model, tiny_corpus, tmp_path_factory):
    return make_ending_model(tiny_model, tiny_corpus, tmp_path_factory.mktemp("ending") / "model")


def test_beam_n_best_groups_train_with_mwer(ending_model, tiny_corpus, tmp_path, monkeypatch):
    experiences = []
    real_build = loop.build_experience
    monkeypatch.setattr(loop, "build_experience", lambda *a: experiences.append(real_build(*a)) or experiences[-1])
    monkeypatch.setattr(pipeline, "make_reward", lambda cfg, *_: _Reward())  # distinct rewards in every group
    final = run_audio_rl(load_rl_config("grpo", None, _overrides(
        ending_model, tiny_corpus, tmp_path / "r", "max_steps=2", "save_steps=0", "max_new_tokens=8", *MWER)))
    before, after = _params(ending_model), _params(final)
    assert any(not torch.equal(before[n], after[n]) for n in before if "language_model.layers" in n)
    rows = read_metrics(tmp_path / "r")
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("mwer/risk", "mwer/mean_risk", "mwer/top_prob", "mwer/unterminated", "mwer/groups_without_signal"):
        assert key in rows[0], key
    assert "policy/clip_frac" not in rows[0]  # no ratio, no clip
    # the N-best of an utterance: n = 4 distinct hypotheses, with the engine's log-probs from a
    # scoring pass: the trainer's own numbers (the mismatch is float noise)
    exp = experiences[0]
    assert all(len({tuple(r) for r in g.responses}) == 4 for g in exp.groups)
    assert abs(rows[0]["rollout_corr/kl"]) < 1e-4 and rows[0]["rollout_corr/max_abs_log_ratio"] < 1e-3
    # the loss saw the hypotheses that ended: the share it left out is the share without EOS
    eos = exp.response_ids.gather(1, exp.response_mask.sum(1, keepdim=True) - 1).squeeze(1)
    unterminated = float((eos != _eos_id(final)).float().mean())
    assert rows[0]["mwer/unterminated"] == pytest.approx(unterminated)
    assert rows[0]["mwer/groups_without_signal"] < 1.0  # some group had two ended hypotheses


def _eos_id(model_dir) -> int:
    from asr_rl.models.audio_policy import AudioPolicy

    return AudioPolicy.from_pretrained(model_dir).eos_id


def test_the_hf_engine_returns_the_deterministic_n_best_with_the_policys_log_probs(tiny_model, tiny_corpus):
    from asr_rl.data.batching import lazy_batch
    from asr_rl.data.manifest import read_manifest
    from asr_rl.models.audio_policy import AudioPolicy
    from asr_rl.trainer.configs.rl import RolloutConfig
    from asr_rl.trainer.rollout.engines import HFRolloutEngine

    policy = AudioPolicy.from_pretrained(tiny_model).eval()
    utts = read_manifest(tiny_corpus / "train.jsonl")[:2]
    rows = policy.encode_batch(lazy_batch(utts, policy.sample_rate))
    engine, rollout = HFRolloutEngine(policy), RolloutConfig(mode="beam", n_samples_per_prompt=4, max_new_tokens=8)
    first = engine.generate(rows, 4, rollout, seeds=list(range(8)))
    again = engine.generate(rows, 4, rollout, seeds=list(range(100, 108)))
    assert [s.ids for s in first] == [s.ids for s in again]  # beam search: the seeds play no part
    for s in first:
        assert len({tuple(x) for x in s.ids}) == 4 and all(1 <= len(x) <= 8 for x in s.ids)
        assert [len(lp) for lp in s.logps] == [len(x) for x in s.ids]
    # the log-probs are the policy's: rescoring a hypothesis on its own gives the same numbers
    embeds, mask = policy.embed_rows(rows[:1])
    hyp = policy.pad_responses([first[0].ids[2]])
    with torch.no_grad():
        alone = policy.logprobs(embeds, mask, hyp)[0]
    assert torch.allclose(alone, torch.tensor(first[0].logps[2]), atol=1e-5)
    # the beam's best-scored hypothesis comes first: HF ranks by sum log p / length (length_penalty 1)
    scores = [sum(lp) / len(lp) for lp in first[0].logps]
    assert scores[0] == pytest.approx(max(scores), abs=1e-5)
