"""Model families, one `AudioLLMSpec` each, looked up by `config.model_type` or `--arch` name.

Adding a family: write `families/<name>.py` with a spec subclass decorated `@register_family`
(base.py). Every module of this package is imported here, so no list names it, and nothing else in
the toolkit names a model type.
"""
from __future__ import annotations

import importlib
import pkgutil

from asr_rl.models.families.base import FAMILIES, AudioLLMSpec, AudioPrompts, AudioTooLong, register_family

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):  # each registers its family
    importlib.import_module(f"{__name__}.{_module}")

SPECS: dict[str, AudioLLMSpec] = {t: FAMILIES.get(name) for name in FAMILIES for t in FAMILIES.get(name).model_types}


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


__all__ = ["AudioLLMSpec", "AudioPrompts", "AudioTooLong", "FAMILIES", "SPECS", "register_family", "spec_for",
           "is_audio_llm", "model_kind"]
