"""Model families, one `AudioLLMSpec` each, looked up by `config.model_type` or `--arch` name.

Adding a family: write `families/<name>.py` with a spec subclass and list it in `_FAMILIES`
below; nothing else in the toolkit names a model type.
"""
from __future__ import annotations

from asr_rl.models.families.base import AudioLLMSpec, AudioPrompts, AudioTooLong
from asr_rl.models.families.glm_asr import GlmAsrSpec
from asr_rl.models.families.qwen2_5_omni import Qwen2_5OmniSpec
from asr_rl.models.families.qwen2_audio import Qwen2AudioSpec
from asr_rl.models.families.qwen3_asr import Qwen3ASRSpec
from asr_rl.models.families.voxtral import VoxtralSpec

_FAMILIES: tuple[AudioLLMSpec, ...] = (Qwen3ASRSpec(), Qwen2AudioSpec(), GlmAsrSpec(), Qwen2_5OmniSpec(), VoxtralSpec())
SPECS: dict[str, AudioLLMSpec] = {t: spec for spec in _FAMILIES for t in spec.model_types}
FAMILIES: dict[str, AudioLLMSpec] = {spec.name: spec for spec in _FAMILIES}


def spec_for(model_type: str) -> AudioLLMSpec:
    """The spec serving `config.model_type`, or a ValueError listing the supported ones."""
    try:
        return SPECS[model_type]
    except KeyError:
        raise ValueError(f"model type {model_type!r} is not a supported audio-LLM; supported: "
                         f"{', '.join(sorted(SPECS))}") from None


def is_audio_llm(model_type: str) -> bool:
    return model_type in SPECS


def model_kind(model_type: str) -> str | None:
    """What a folder of `model_type` is to the toolkit: "audio-LLM" (a family here), "causal LM"
    (the text RLHF path), or None (neither)."""
    if is_audio_llm(model_type):
        return "audio-LLM"
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return "causal LM" if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES else None


__all__ = ["AudioLLMSpec", "AudioPrompts", "AudioTooLong", "FAMILIES", "SPECS", "spec_for", "is_audio_llm",
           "model_kind"]
