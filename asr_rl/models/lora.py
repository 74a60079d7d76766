"""Optional LoRA on the policy's LLM (Hu et al., 2021, "LoRA: Low-Rank Adaptation of Large Language
Models", arXiv:2106.09685), through peft.

Adapters are injected in place (`peft.inject_adapter_in_model`) so that the policy keeps the
model's own class and attribute paths; the LLM's base weights are frozen, the projector stays
trainable. Checkpoints merge the adapters into a copy, so the saved folder is a plain model that
transformers loads without peft.
"""
from __future__ import annotations

import copy

from torch import nn


def add_lora(policy, rank: int, alpha: int, target_modules: tuple[str, ...], dropout: float = 0.0) -> int:
    """Inject LoRA adapters into the policy's language model; returns the number of adapted layers."""
    from peft import LoraConfig, inject_adapter_in_model

    lm = policy.body()
    for p in lm.parameters():
        p.requires_grad_(False)
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules))
    inject_adapter_in_model(config, lm)
    adapted = [m for m in lm.modules() if _is_lora_layer(m)]
    if not adapted:
        raise ValueError(f"lora_target_modules {list(target_modules)} matched no module of the language model")
    for m in adapted:
        for name, p in m.named_parameters():
            p.requires_grad_("lora_" in name)
    return len(adapted)


def merged_copy(model: nn.Module) -> nn.Module:
    """A copy of `model` with every LoRA layer merged into its base layer and unwrapped. Only the
    base layers that merging changes are copied; every other tensor is shared with `model` (saving
    reads it), so a checkpoint of a 1.7B LoRA model does not hold the whole model twice."""
    merged = {id(p) for m in model.modules() if _is_lora_layer(m) for p in m.get_base_layer().parameters()}
    model = copy.deepcopy(model, {id(p): p for p in model.parameters() if id(p) not in merged})
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if _is_lora_layer(child):
                child.merge()
                setattr(parent, name, child.get_base_layer())
    return model


def has_lora(model: nn.Module) -> bool:
    return any(_is_lora_layer(m) for m in model.modules())


def _is_lora_layer(module: nn.Module) -> bool:
    from peft.tuners.lora import LoraLayer

    return isinstance(module, LoraLayer)
