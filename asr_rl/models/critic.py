"""The critic for PPO with GAE: a copy of the policy's network with a scalar value head.

Value of the state before each response token (the position that predicts it), as OpenRLHF's
critic computes it, so `values[:, t]` pairs with `logp[:, t]`.
"""
from __future__ import annotations

import copy

import torch
from torch import nn


class ValueModel(nn.Module):
    def __init__(self, policy):
        super().__init__()
        self.policy = policy
        hidden = policy.model.config.get_text_config().hidden_size
        self.value_head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_policy(cls, policy) -> "ValueModel":
        """A critic initialised from (a deep copy of) the policy's weights."""
        return cls(copy.deepcopy(policy))

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for _, p in self.policy.trainable_parameters()] + list(self.value_head.parameters())

    def values(self, prompt_rows: list, prompt_index: torch.Tensor, responses) -> torch.Tensor:
        """`(N, T)` values, zero at padding."""
        embeds, mask = self.policy.embed_rows(prompt_rows)
        hidden = self.policy.response_hidden(embeds, mask, responses, prompt_index)
        values = self.value_head(hidden.float()).squeeze(-1)
        return values.masked_fill(responses.mask == 0, 0.0)
