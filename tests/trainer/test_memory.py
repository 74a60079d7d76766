"""The memory estimate: exact for the model's own tensors, by formula for the rest."""
import torch

from asr_rl.models.audio_policy import AudioPolicy
from asr_rl.models.lora import add_lora
from asr_rl.trainer.memory import estimate_rl_memory


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
