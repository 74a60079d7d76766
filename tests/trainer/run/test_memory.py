"""The memory estimate: exact for the model's own tensors, by formula for the rest."""
import torch

from asr_rl.models.audio_policy import AudioPolicy
from asr_rl.models.lora import add_lora
from asr_rl.trainer.run.memory import estimate_rl_memory


def _estimate(policy, **kw):
    args = dict(reference=True, share_frozen=True, sequences=8, prompt_len=40, response_len=16, micro_batch=4,
                runtime_bytes=0)
    return estimate_rl_memory(policy, **{**args, **kw}).parts


def _bytes(params):
    return sum(p.numel() * p.element_size() for p in params)


def test_model_tensors_are_counted_exactly_and_the_reference_owns_what_trains(tiny_model):
    policy = AudioPolicy.from_pretrained(tiny_model)
    policy.freeze()  # RL: the tower is frozen
    trainable = [p for _, p in policy.trainable_parameters()]
    parts = _estimate(policy)
    assert parts["weights"] == _bytes(policy.model.parameters())
    assert parts["gradients"] == _bytes(trainable) and parts["optimizer state"] == 2 * _bytes(trainable)
    ref = policy.reference_copy()
    shared = {p.data_ptr() for p in policy.model.parameters()}
    assert parts["reference"] == _bytes(p for p in ref.model.parameters() if p.data_ptr() not in shared)
    tower = _bytes(policy.spec.audio_tower(policy.model).parameters())
    assert _estimate(policy, share_frozen=False)["reference"] == parts["weights"] - tower
    assert _estimate(policy, reference=False)["reference"] == 0
    # by hand for the tiny text config: 2 layers x 1 KV head x head_dim 32 x 4 bytes x 2 (K, V),
    # 8 sequences x 56 positions; LM-head outputs: 4 float32 copies of 4 x 16 x vocab
    cfg = policy.model.config.get_text_config()
    assert parts["rollout KV cache"] == 2 * 2 * 1 * 32 * 4 * 8 * 56
    assert parts["LM-head outputs"] == 16 * 4 * 16 * cfg.vocab_size
    # LoRA: gradients and optimizer state only for the adapters and the projector
    add_lora(policy, rank=4, alpha=8, target_modules=("q_proj", "v_proj"))
    lora = _estimate(policy)
    assert lora["gradients"] == _bytes(p for _, p in policy.trainable_parameters()) < parts["gradients"]


def test_bf16_halves_what_is_in_the_parameter_dtype(tiny_model):
    fp32 = AudioPolicy.from_pretrained(tiny_model)
    bf16 = AudioPolicy.from_pretrained(tiny_model, dtype=torch.bfloat16)
    for p in (fp32, bf16):
        p.freeze()
    a, b = _estimate(fp32), _estimate(bf16)
    for key in ("weights", "gradients", "optimizer state", "rollout KV cache", "activations"):
        assert b[key] * 2 == a[key], key


def test_zero_partitions_optimizer_then_gradients_then_weights(tiny_model):
    """ZeRO stage s over 2 ranks halves, cumulatively, the optimizer state (1), gradients (2) and
    every weight (3); the reference, activations and caches stay whole."""
    policy = AudioPolicy.from_pretrained(tiny_model)
    policy.freeze()
    full = _estimate(policy, optimizer_bytes_per_param=8)
    for stage, halved in [(0, ()), (1, ("optimizer state",)), (2, ("optimizer state", "gradients")),
                          (3, ("optimizer state", "gradients", "weights"))]:
        parts = _estimate(policy, optimizer_bytes_per_param=8, zero_stage=stage, world_size=2)
        for key, value in parts.items():
            assert value == (full[key] // 2 if key in halved else full[key]), (stage, key)


def test_a_rank_gets_its_share_of_the_rollout_and_deepspeeds_optimizer_bytes(tiny_model):
    from asr_rl.trainer.run.memory import rank_estimate
    from asr_rl.trainer.recipes.rl import load_rl_config

    cfg = load_rl_config("grpo", None, ["rollout_batch_size=3", "n_samples_per_prompt=4", "max_new_tokens=16",
                                        "distributed.zero_stage=2", "micro_train_batch_size=4"])
    for dtype, opt_bytes in [(torch.float32, 8), (torch.bfloat16, 12)]:  # moments (+ fp32 master in bf16)
        policy = AudioPolicy.from_pretrained(tiny_model, dtype=dtype)
        policy.freeze()
        n_trainable = sum(p.numel() for _, p in policy.trainable_parameters())
        one = rank_estimate(cfg, policy, reference=False, prompt_len=40).parts
        two = rank_estimate(cfg, policy, reference=False, prompt_len=40, world_size=2, deepspeed=True).parts
        assert two["optimizer state"] == opt_bytes * n_trainable // 2
        assert one["optimizer state"] == 2 * dtype.itemsize * n_trainable  # torch AdamW, in the param dtype
        # 12 sequences over 2 ranks: 6 each
        assert two["rollout KV cache"] * 2 == one["rollout KV cache"]


def test_a_shared_prompt_counts_each_prompt_once_and_its_gathered_keys_and_values(tiny_model):
    policy = AudioPolicy.from_pretrained(tiny_model)
    policy.freeze()
    cfg = policy.model.config.get_text_config()
    per_layer_token = 34 * cfg.hidden_size * cfg.num_hidden_layers * 4 / 2  # float32
    # micro-batch 8 of groups of 4: 3 prompts (8 / 4 + 1 for a group split across micro-batches)
    shared = _estimate(policy, micro_batch=8, group_size=4, shared_prefix=True)
    repeated = _estimate(policy, micro_batch=8, group_size=4, shared_prefix=False)
    assert repeated["activations"] == int(8 * (40 + 16) * per_layer_token)
    assert shared["activations"] == int((3 * 40 + 8 * 16) * per_layer_token)
    assert shared["shared prompt KV"] == 2 * 2 * 1 * 32 * 4 * 8 * 40 and repeated["shared prompt KV"] == 0
    assert shared["rollout KV cache"] == repeated["rollout KV cache"]
    # one sequence per prompt: nothing is shared
    assert _estimate(policy, micro_batch=8, group_size=1, shared_prefix=True) == repeated


def test_the_memory_estimate_s_prompt_is_the_longest_audio_with_the_longest_context(whisper_model, tiny_corpus):
    import dataclasses

    from asr_rl.data.manifest import read_manifest
    from asr_rl.trainer.run.plan import longest_prompt
    from asr_rl.trainer.run.memory import prompt_length

    utts = read_manifest(tiny_corpus / "train.jsonl")
    longest = max(utts, key=lambda u: u.duration)
    short = min(utts, key=lambda u: u.duration)
    listed = [dataclasses.replace(short, context=("grace", "living room")), *utts]
    probe = longest_prompt(listed)
    assert probe.audio == longest.audio and probe.context == ("grace", "living room")
    policy = AudioPolicy.from_pretrained(whisper_model)
    # ", ".join of the list and "Context: " and ". " before the instruction: one token a character here
    assert prompt_length(policy, probe, 16000) == prompt_length(policy, longest, 16000) + len(
        "Context: grace, living room. ")


def test_the_encoder_cache_s_ram_is_a_part_bounded_by_its_setting(whisper_model, tiny_corpus):
    from asr_rl.data.manifest import read_manifest
    from asr_rl.models.cache_plan import plan_encoder_cache
    from asr_rl.trainer.recipes.rl import load_rl_config
    from asr_rl.trainer.run.memory import rank_estimate

    utts = read_manifest(tiny_corpus / "train.jsonl")
    small = load_rl_config("grpo", None, ["model.encoder_cache_max_gib=0.0001"])  # ~105 kB: under the corpus
    plan = plan_encoder_cache(whisper_model, small.model, utts, small.augment, 16000)
    assert plan.disk_bytes > plan.max_bytes == plan.ram_bytes == int(0.0001 * 2**30)
    roomy = plan_encoder_cache(whisper_model, load_rl_config("grpo", None, []).model, utts, small.augment, 16000)
    assert roomy.ram_bytes == roomy.disk_bytes == plan.disk_bytes
    policy = AudioPolicy.from_pretrained(whisper_model)
    policy.freeze()
    with_cache = rank_estimate(small, policy, reference=False, prompt_len=40, cache_bytes=plan.ram_bytes).parts
    without = rank_estimate(small, policy, reference=False, prompt_len=40).parts
    assert with_cache["encoder cache"] == plan.ram_bytes and without["encoder cache"] == 0
    assert {k: v for k, v in with_cache.items() if k != "encoder cache"} == {
        k: v for k, v in without.items() if k != "encoder cache"}
