"""Reading a Hugging Face model folder strictly: its config, and weights that must fit the class
exactly (no parameter left random, no key left unused). A leaf: the families, the policies and
`model info` all read folders through it."""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from torch import nn


def read_model_config(path: str | Path):
    """The HF config of a model folder; a FileNotFoundError naming the folder, or a one-line
    ValueError naming its config.json when transformers cannot read it (damaged JSON, a field of
    the wrong type, an unknown model type)."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    path = Path(path)
    file = path / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"model folder {path} does not exist or has no config.json")
    try:
        json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{file} is not valid JSON ({e}): it is truncated or damaged; copy it again from "
                         "the checkpoint") from None
    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError, TypeError, KeyError, StrictDataclassError) as e:
        raise config_error(path, e) from None


def config_error(path: str | Path, error: Exception) -> ValueError:
    """One line naming the folder's config.json, for a config transformers cannot read or build a
    model from (its own messages span many lines)."""
    text = re.sub(r"\s+", " ", str(error)).strip()
    text = text if len(text) <= 300 else text[:300] + "..."
    if isinstance(error, KeyError) or not text:  # a bare key says nothing without its type
        text = f"{type(error).__name__} {text}".strip()
    return ValueError(f"{Path(path) / 'config.json'} is not a valid model config: {text}")


def load_strict(model_cls, path: str | Path, dtype: torch.dtype = torch.float32, unused: tuple[str, ...] = (),
                **kwargs) -> nn.Module:
    """`model_cls.from_pretrained(path, **kwargs)`, refusing weights that leave parameters missing
    (randomly initialised) or keys unused: a folder in another layout must not train or score as
    random weights. `unused`: key prefixes the checkpoint may hold beyond the model (the parts of
    a larger model that ASR does not run)."""
    try:
        model, info = model_cls.from_pretrained(path, dtype=dtype, output_loading_info=True, **kwargs)
    except (KeyError, TypeError) as e:  # a config that parses but builds no model (e.g. an unknown rope type)
        raise config_error(path, e) from None
    info["unexpected_keys"] = [k for k in info.get("unexpected_keys") or [] if not str(k).startswith(unused)]
    problems = {kind: sorted(map(str, info.get(kind) or [])) for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    problems = {k: v for k, v in problems.items() if v}
    if problems:
        detail = "; ".join(f"{len(v)} {k.replace('_', ' ')} (e.g. {', '.join(v[:3])})" for k, v in problems.items())
        raise ValueError(f"{path}: the weights do not fit {model_cls.__name__}: {detail}. Loading would leave "
                         "parameters randomly initialised; convert the checkpoint to this layout first")
    return model


__all__ = ["read_model_config", "config_error", "load_strict"]
