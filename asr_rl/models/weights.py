"""Reading a Hugging Face model folder strictly: its config, and weights that must fit the class
exactly (no parameter left random, no key left unused). A leaf: the families, the policies and
`model info` all read folders through it."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


def read_model_config(path: str | Path):
    """The HF config of a model folder, or a FileNotFoundError naming the folder."""
    from transformers import AutoConfig

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model folder {path} does not exist or has no config.json")
    return AutoConfig.from_pretrained(path)


def load_strict(model_cls, path: str | Path, dtype: torch.dtype = torch.float32, unused: tuple[str, ...] = (),
                **kwargs) -> nn.Module:
    """`model_cls.from_pretrained(path, **kwargs)`, refusing weights that leave parameters missing
    (randomly initialised) or keys unused: a folder in another layout must not train or score as
    random weights. `unused`: key prefixes the checkpoint may hold beyond the model (the parts of
    a larger model that ASR does not run)."""
    model, info = model_cls.from_pretrained(path, dtype=dtype, output_loading_info=True, **kwargs)
    info["unexpected_keys"] = [k for k in info.get("unexpected_keys") or [] if not str(k).startswith(unused)]
    problems = {kind: sorted(map(str, info.get(kind) or [])) for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    problems = {k: v for k, v in problems.items() if v}
    if problems:
        detail = "; ".join(f"{len(v)} {k.replace('_', ' ')} (e.g. {', '.join(v[:3])})" for k, v in problems.items())
        raise ValueError(f"{path}: the weights do not fit {model_cls.__name__}: {detail}. Loading would leave "
                         "parameters randomly initialised; convert the checkpoint to this layout first")
    return model


__all__ = ["read_model_config", "load_strict"]
