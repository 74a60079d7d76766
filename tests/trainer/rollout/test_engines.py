"""Rollout engines: one registry entry is a whole engine (the config and the loop see it), the
entries declare what the backends need, and an unknown name fails at load naming the valid ones."""
from __future__ import annotations

import pytest
import torch

import asr_rl.rewards.pipeline as pipeline
import asr_rl.trainer.driver.loop as loop
from asr_rl.config import ConfigError, load_config
from asr_rl.rewards.base import RewardOutput
from asr_rl.trainer.configs.rl import RLConfig
from asr_rl.trainer.rollout.engines import (ROLLOUT_ENGINES, HFRolloutEngine, RolloutEngine, engine_spec, llm_weights,
                                            register_engine, samples_in_engine_actors, trainable_weights)
from asr_rl.trainer.rollout.experience import Sampled


class ToyEngine:
    """Deterministic responses: for seed s, one token repeated 1 + s % 3 times, then EOS, each with
    log-prob -0.5. Records every weight sync with a trainable tensor as it was at that moment."""

    def __init__(self, policy):
        self.policy = policy
        self.token = policy.tokenizer("hello", add_special_tokens=False)["input_ids"][0]
        self.generated, self.synced, self.closed = [], [], False
        self.initial = self._probe()

    def _probe(self) -> torch.Tensor:
        return self.policy.trainable_parameters()[-1][1].detach().clone()

    def generate(self, prompt_rows, n, rollout, seeds):
        ids = [[self.token] * (1 + s % 3) + [self.policy.eos_id] for s in seeds]
        self.generated += ids
        return [Sampled(ids[i * n:(i + 1) * n], [[-0.5] * len(x) for x in ids[i * n:(i + 1) * n]])
                for i in range(len(prompt_rows))]

    def sync_weights(self) -> None:
        self.synced.append(self._probe())

    def load_weights(self, named_tensors) -> int:
        return 0

    def close(self) -> None:
        self.closed = True


class _Reward:
    """Distinct rewards within each group (so the step updates); keeps what it scored."""

    name = "scripted"

    def __init__(self):
        self.responses = []

    def __call__(self, samples):
        self.responses += [s.response for s in samples]
        values = [float(i % 4) for i in range(len(samples))]
        return RewardOutput(rewards=values, terms={"scripted": values})


@pytest.fixture
def registry(monkeypatch):
    """Registrations made in a test stay in it."""
    monkeypatch.setattr(ROLLOUT_ENGINES, "_entries", dict(ROLLOUT_ENGINES._entries))
    return ROLLOUT_ENGINES


@pytest.mark.slow
def test_a_registered_engine_samples_the_local_grpo_step_and_gets_the_update(tiny_model, tiny_corpus, tmp_path,
                                                                           registry, monkeypatch):
    from asr_rl.trainer.recipes.rl import load_rl_config, run_audio_rl
    from tests.trainer.driver.test_grpo_e2e import _overrides

    built: list[ToyEngine] = []

    @register_engine("toy")
    def build_toy(policy, cfg):
        built.append(ToyEngine(policy))
        return built[-1]

    experiences = []
    real_build = loop.build_experience
    monkeypatch.setattr(loop, "build_experience", lambda *a: experiences.append(real_build(*a)) or experiences[-1])
    reward = _Reward()
    monkeypatch.setattr(pipeline, "make_reward", lambda cfg, *_: reward)
    run_audio_rl(load_rl_config("grpo", None, _overrides(tiny_model, tiny_corpus, tmp_path / "r", "rollout.engine=toy",
                                                         "max_steps=1", "save_steps=0")))
    (engine,) = built
    assert isinstance(engine, RolloutEngine)
    # the step trained on the toy's responses and log-probs: 2 prompts x 4 samples, lengths 2..4
    (exp,) = experiences
    assert len(engine.generated) == 8 and {len(x) for x in engine.generated} == {2, 3, 4}
    assert [ids[m.bool()].tolist() for ids, m in zip(exp.response_ids, exp.response_mask)] == engine.generated
    assert torch.equal(exp.rollout_logp[exp.response_mask.bool()], torch.full((int(exp.response_mask.sum()),), -0.5))
    decode = engine.policy.decode_ids
    assert reward.responses == [decode(torch.as_tensor([x]), torch.ones(1, len(x), dtype=torch.long))[0]
                                for x in engine.generated]
    # one sync, after the update: the engine saw weights other than those it was built with
    assert len(engine.synced) == 1 and not torch.equal(engine.synced[0], engine.initial)
    assert engine.closed  # the workers shut it down


def test_an_unknown_engine_fails_at_config_load_naming_the_valid_ones(registry):
    with pytest.raises(ConfigError, match=r"unknown rollout.engine 'vlm'; valid: hf, vllm$"):
        load_config(RLConfig, None, ["rollout.engine=vlm"])
    register_engine("toy")(lambda policy, cfg: None)
    with pytest.raises(ConfigError, match=r"valid: hf, toy, vllm"):
        load_config(RLConfig, None, ["rollout.engine=vlm"])
    assert load_config(RLConfig, None, ["rollout.engine=toy"]).rollout.engine == "toy"
    with pytest.raises(ValueError, match="already registered"):
        register_engine("toy")(lambda policy, cfg: None)


def test_the_entries_declare_what_the_backends_need():
    hf, vllm = (engine_spec(load_config(RLConfig, None, [f"rollout.engine={e}"])) for e in ("hf", "vllm"))
    # the HF engine samples in the trainer ranks, from prompt rows, and takes every trainable tensor
    assert (hf.own_actors, hf.feed_embeds, hf.weights) == (False, False, trainable_weights)
    # vLLM serves only the causal LLM: actors of its own, fed embeddings, sent the merged LLM weights
    assert (vllm.own_actors, vllm.feed_embeds, vllm.weights) == (True, True, llm_weights)
    # the N-best of rollout.mode=beam: HF's beam search; vLLM's takes no prompt embeddings
    assert (hf.beam_search, vllm.beam_search) == (True, False)
    assert not samples_in_engine_actors(load_config(RLConfig, None, []))
    assert samples_in_engine_actors(load_config(RLConfig, None, ["rollout.engine=vllm"]))
    assert samples_in_engine_actors(load_config(RLConfig, None, [
        "backend=ray", "rollout.async_enable=true", "rollout.async_queue_size=0"]))


def test_the_hf_engine_applies_received_weights_to_its_policy(tiny_model):
    from asr_rl.models.audio_policy import AudioPolicy

    policy = AudioPolicy.from_pretrained(tiny_model)
    policy.freeze()
    engine = HFRolloutEngine(policy)
    assert isinstance(engine, RolloutEngine)
    sent = [(n, torch.full_like(t, 0.25)) for n, t in trainable_weights(policy)]
    assert engine.load_weights(sent) == len(sent) > 0
    assert all(torch.all(t == 0.25) for _, t in trainable_weights(policy))
    with pytest.raises(ValueError, match=r"no parameters \['nope'\]"):
        engine.load_weights([("nope", torch.zeros(1))])


def test_a_rank_without_an_engine_says_engine_actors_sample():
    from asr_rl.trainer.update.worker import PolicyWorker

    cfg = load_config(RLConfig, None, ["rollout.engine=vllm"])
    with pytest.raises(RuntimeError, match=r"policy rank 0 has no rollout engine.*rollout.engine=vllm"):
        PolicyWorker(cfg, None, None, None, None).sample([], 1, [])
