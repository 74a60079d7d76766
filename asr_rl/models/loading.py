"""Loading the models a run trains: the audio or text policy with the run's freezing and LoRA,
and the PPO critic."""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from asr_rl.config import ConfigError
from asr_rl.models.audio_policy import AudioPolicy
from asr_rl.models.builders import encoder_is_pretrained
from asr_rl.models.critic import ValueModel
from asr_rl.models.facts import ModelFacts
from asr_rl.models.families import FAMILIES
from asr_rl.models.lora import add_lora
from asr_rl.models.text_policy import load_text_policy

log = logging.getLogger("asr_rl.train")


def require_audio_llm(model: ModelFacts | str | Path | None, key: str = "pretrain", hint: str = "") -> None:
    """Refuse a `key` folder that is not an audio-LLM before anything reads its tokenizer (a text
    LM's would first be blamed for the manifest's characters it lacks); `hint`: what such a folder
    is for instead. A missing folder is left to `check_paths`, which names the key."""
    model = ModelFacts.of(model)
    if not model.exists or model.kind == "audio-LLM":
        return
    kind = "a text LM" if model.kind == "causal LM" else "a model"
    raise ConfigError(f"`{key}={model.path}`: this folder is {kind} ({model.model_type}), not an audio-LLM; audio "
                      f"training needs one of {', '.join(FAMILIES)} (e.g. `asr-rl model init --arch qwen2_audio`){hint}")


def load_policy(path: str | Path | None, model_cfg, device: str = "cpu", sample_rate: int = 16000,
                freeze_encoder: bool | None = None):
    """The audio policy from `path` with the config's freezing and (optional) LoRA applied. The
    encoder is frozen when `freeze_encoder` (or else `model_cfg.freeze_encoder`) says so, and by
    default when the checkpoint's encoder is pretrained."""
    if not path:
        raise ValueError("`pretrain` is not set: give the starting model folder, e.g. pretrain=exp/sft/final")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[model_cfg.dtype]
    policy = AudioPolicy.from_pretrained(path, device=device, dtype=dtype, force_language=model_cfg.force_language,
                                         sample_rate=sample_rate)
    policy.shared_prefix, policy.prefix_attention = model_cfg.shared_prefix, model_cfg.prefix_attention
    patterns = tuple(model_cfg.freeze_patterns)
    freeze = next(f for f in (freeze_encoder, model_cfg.freeze_encoder, encoder_is_pretrained(path)) if f is not None)
    if freeze:
        patterns += policy.spec.frozen_by_default()
    if patterns:
        frozen = policy.freeze(patterns)
        log.info("froze %d parameter tensors (%s)", len(frozen), ", ".join(patterns))
    if policy.encoder_frozen:
        policy.use_encoder_cache(model_cfg.encoder_cache, model_cfg.encoder_cache_max_gib)
    if model_cfg.lora_rank > 0:
        add_lora(policy, model_cfg.lora_rank, model_cfg.lora_alpha, model_cfg.lora_target_modules)
    n_train = sum(p.numel() for _, p in policy.trainable_parameters())
    n_all = sum(p.numel() for p in policy.model.parameters())
    log.info("policy %s: %.2fM parameters, %.2fM trainable", path, n_all / 1e6, n_train / 1e6)
    return policy


def load_rl_policy(cfg, path: str | Path | None, device: str, text: bool):
    """The RL policy (audio, or text for the text RLHF path) from `path`, with the run's model settings."""
    if text:
        return load_text_policy(path, cfg.model, device, cfg.data)
    return load_policy(path, cfg.model, device, cfg.data.sample_rate, freeze_encoder=True)  # RL: always frozen


def build_critic(cfg, device: str, text: bool, policy=None):
    """The PPO critic from `critic_pretrain`, else from a copy of `policy` (or of `pretrain` when
    there is none: a critic in a process of its own)."""
    if cfg.critic_pretrain or policy is None:
        return ValueModel(load_rl_policy(cfg, cfg.critic_pretrain or cfg.pretrain, device, text))
    return ValueModel.from_policy(policy)


__all__ = ["require_audio_llm", "load_policy", "load_rl_policy", "build_critic"]
