"""`asr-rl model info DIR`: what a model folder is, as the toolkit will train it.

For an audio-LLM: its family (the `AudioLLMSpec` serving its `model_type`), the parameters of the
audio encoder, the projector and the LLM, what is frozen by default in SFT and in RL, the starting
rates its folder gets (released checkpoint or `model init`'s), and the prompt one utterance gets,
rendered through the family's processor. The model is built on the meta device: no weights are read,
so this is instant for a 7B folder too. A text LM gets its type and size.
"""
from __future__ import annotations

import fnmatch
import json
from pathlib import Path

import torch

_PROMPT_SECONDS = 2.0  # the utterance whose prompt is shown


def model_info(path: str | Path) -> dict:
    from asr_rl.models.builders import encoder_is_pretrained, read_info
    from asr_rl.models.families import SPECS
    from asr_rl.models.weights import read_model_config
    from asr_rl.models.builders import RELEASED_CHECKPOINT, is_released_checkpoint

    config = read_model_config(path)
    spec = SPECS.get(config.model_type)
    released = is_released_checkpoint(str(path))
    info = {"path": str(path), "model_type": config.model_type, "built_by": read_info(path) or "elsewhere (released)",
            "presets": dict(RELEASED_CHECKPOINT) if released else "the dataclass defaults"}
    if spec is None:  # a text LM (the text RLHF path)
        from transformers import AutoModelForCausalLM

        from asr_rl.models.families import model_kind

        if model_kind(config.model_type) is None:
            raise ValueError(f"{Path(path) / 'config.json'}: model type {config.model_type!r} is neither an audio-LLM "
                             f"({', '.join(sorted(SPECS))}) nor a causal LM")
        model = _on_meta(lambda: AutoModelForCausalLM.from_config(config), path)
        return {**info, "family": "causal LM (text RLHF)", "parameters": _count(model)}
    spec.check_folder(path, json.loads((Path(path) / "config.json").read_text(encoding="utf-8")))
    config = spec.model_config(config)
    model = _on_meta(lambda: spec.model_class()(config), path)
    frozen = spec.frozen_by_default()
    n_frozen = sum(p.numel() for n, p in model.named_parameters() if any(fnmatch.fnmatch(n, f) for f in frozen))
    return {**info, "family": spec.name, "class": spec.model_class().__name__,
            "parameters": {"total": _count(model), "audio encoder": _count(spec.audio_tower(model)),
                           "projector": _count(spec.projector(model)), "language model": _count(spec.language_model(model)),
                           "LM head": _count(model.get_output_embeddings())},
            "frozen by default": {"patterns": list(frozen), "parameters": n_frozen,
                                  "SFT": "frozen" if encoder_is_pretrained(path) else "trains (random init; CTC on)",
                                  "RL": "frozen"},
            "prompt": spec.prompt_preview(spec.load_processor(path), config, _PROMPT_SECONDS)}


def format_info(info: dict, indent: int = 0) -> str:
    lines = []
    for key, value in info.items():
        if isinstance(value, dict):
            lines.append(" " * indent + f"{key}:")
            lines.append(format_info(value, indent + 2))
        elif key == "prompt":
            lines.append(" " * indent + f"{key} (one {_PROMPT_SECONDS:g} s utterance):")
            lines += [" " * (indent + 2) + line for line in str(value).split("\n")]
        else:
            shown = f"{value / 1e6:,.2f}M" if isinstance(value, int) and key != "seed" else value
            lines.append(" " * indent + f"{key}: {shown}")
    return "\n".join(lines)


def _on_meta(build, path):
    """`build()` on the meta device; a config that builds no model is a one-line error naming it."""
    from asr_rl.models.weights import config_error

    try:
        with torch.device("meta"):
            return build()
    except (ValueError, KeyError, TypeError) as e:
        raise config_error(path, e) from None


def _count(module) -> int:
    return sum(p.numel() for p in module.parameters()) if module is not None else 0
