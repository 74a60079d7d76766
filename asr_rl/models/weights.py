"""Reading a Hugging Face model folder strictly: its config, and weights that must fit the class
exactly (no parameter left random, no key left unused). A leaf: the families, the policies and
`model info` all read folders through it; and the causal LLM's weights as a standalone model names
them (what a rollout engine serving only the LLM loads)."""
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


# ---------------------------------------------------------------------------------- the LLM alone
def is_tied(policy) -> bool:
    head = policy.model.get_output_embeddings()
    emb = policy.model.get_input_embeddings()
    return head.weight is emb.weight or head.weight.data_ptr() == emb.weight.data_ptr()


def module_prefix(model: torch.nn.Module, module: torch.nn.Module) -> str:
    for name, m in model.named_modules():
        if m is module:
            return name
    raise ValueError("the language model is not a submodule of the policy model")


def llm_named_weights(policy) -> list[tuple[str, torch.Tensor]]:
    """The policy's causal-LLM weights under standalone `*ForCausalLM` names (`model.*`, plus
    `lm_head.weight` when untied), LoRA adapters merged. Tensors are the live ones (no copy) except
    merged LoRA weights; call under `GatheredParameters` with ZeRO-3."""
    lm = policy.body()
    deltas = {}
    if any("lora_" in n for n, _ in lm.named_parameters()):
        from peft.tuners.lora import LoraLayer

        for name, m in lm.named_modules():
            if isinstance(m, LoraLayer) and not m.merged:
                deltas[f"{name}.base_layer.weight"] = sum(m.get_delta_weight(a) for a in m.active_adapters)
    out = []
    for name, t in lm.state_dict().items():
        if "lora_" in name:
            continue
        if name in deltas:
            t = t + deltas[name].to(t.dtype)
        out.append(("model." + name.replace(".base_layer.", "."), t))
    if not is_tied(policy):
        out.append(("lm_head.weight", policy.model.get_output_embeddings().weight))
    return out


__all__ = ["read_model_config", "config_error", "load_strict", "is_tied", "module_prefix", "llm_named_weights"]
