"""Responses attend to their group's prompt without a per-response copy of its keys and values.

The idea is PrefixGrouper's (arXiv:2506.05433): the n responses of a group share one prompt, so
the prompt is encoded once and its keys/values are laid out per group, `(U, Hkv, P, D)`, never per
response `(U*n, Hkv, P, D)`. For the response pass the n responses of group u are laid side by
side: their queries `(N, H, T, D)` become `(U, H, n*T, D)` against the group's prompt keys (its
padding masked), and each response's queries meet its own earlier keys (causal, its padding
masked); one softmax joins the two score sets, so the result is the repeated-prompt attention
exactly, and autograd sums the prompt's gradient over its n responses. (One sdpa call over
[prompt ; all n responses] with a block-diagonal mask is exact too, but scores n*T x n*T per group
where n x T x T are needed: measured slower at the demo's shape.) Decoding is the same with one
query per sample against the prompt and a cache of the samples' own tokens.

It runs inside transformers' own attention layers: `ALL_ATTENTION_FUNCTIONS` gets one more entry
(`NAME`), and `grouped_prefix` points the body's configs at it for one forward. That name has no
mask function registered, so `create_causal_mask` returns None and the mask is built here from the
prompt and response padding. Every layer must come through the function (checked after the
forward): a body whose attention bypasses the interface fails loudly instead of silently attending
to the responses alone.
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

NAME = "asr_rl_grouped_prefix"


@dataclass
class GroupedPrefix:
    """The prompt keys/values of one response pass, grouped.

    Attributes:
        keys, values: per layer `(U, Hkv, P, D)` (the prompt forward's cache, positions applied).
        prompt_mask: `(U, P)` True at real prompt tokens (prompts are left-padded).
        response_mask: `(N, S)` True at the responses' real keys, N = U * n, rows u*n..u*n+n-1:
            group u. The queries are the last `queries` of them (all when scoring; the new token
            when decoding against a cache of the responses' own keys).
        calls: layers that came through `grouped_attention_forward` (checked after the forward).
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    prompt_mask: torch.Tensor
    response_mask: torch.Tensor
    queries: int | None = None
    calls: set[int] = field(default_factory=set)

    def __post_init__(self):
        (U, P), (N, S) = self.prompt_mask.shape, self.response_mask.shape
        T = self.queries = S if self.queries is None else self.queries
        self.n = N // U
        # built once per forward, shared by the layers; shaped as the scores below
        self.prompt_blocked = ~self.prompt_mask.reshape(U, 1, 1, 1, 1, P)
        causal = torch.ones(T, S, dtype=torch.bool, device=self.prompt_mask.device).tril(S - T)
        self.response_blocked = ~(causal & self.response_mask.reshape(U, 1, 1, self.n, 1, S))


_ACTIVE: ContextVar[GroupedPrefix | None] = ContextVar("asr_rl_grouped_prefix", default=None)


def grouped_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              attention_mask, dropout: float = 0.0, scaling: float | None = None,
                              sliding_window: int | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """An `AttentionInterface` function: `query` `(N, H, T, D)` and the responses' own `key`/`value`
    `(N, Hkv, S, D)` (S = T when scoring, the tokens so far when decoding) against their group's
    prompt `(U, Hkv, P, D)`. Returns `(N, T, H, D)` as sdpa's does.

    The scores are explicit and exact in size: each group's n*T queries against its P prompt keys
    (one batched matmul over U groups, the prompt broadcast to its n responses), and each response's
    T queries against its own T keys; one softmax over both, all in float32 (as sdpa's CPU
    kernels accumulate; a no-op in fp32). Query heads are folded onto their key/value head (`r` = H / Hkv query heads share
    one, grouped-query attention), so no key is repeated either."""
    state = _ACTIVE.get()
    if state is None or sliding_window is not None:
        raise RuntimeError(f"{NAME} runs only inside `grouped_prefix` and without a sliding window")
    layer = module.layer_idx
    state.calls.add(layer)
    dtype = query.dtype  # bf16/fp16 scores lose ~0.05 nats against sdpa's float32 ones: compute in float32
    query, key, value, pk, pv = (t.float() for t in (query, key, value, state.keys[layer], state.values[layer]))
    (U, Hkv, P, D), (N, H, T, _), S, n = pk.shape, query.shape, key.shape[2], state.n
    r, scale = H // Hkv, D ** -0.5 if scaling is None else scaling
    q = query.reshape(U, n, Hkv, r, T, D).permute(0, 2, 3, 1, 4, 5)  # (U, Hkv, r, n, T, D)
    prompt = (q.reshape(U, Hkv, r * n * T, D) @ pk.transpose(-1, -2) * scale).reshape(U, Hkv, r, n, T, P)
    own = (query.reshape(N, Hkv, r * T, D) @ key.transpose(-1, -2) * scale)  # (N, Hkv, r*T, S)
    own = own.reshape(U, n, Hkv, r, T, S).permute(0, 2, 3, 1, 4, 5)
    scores = torch.cat([prompt.masked_fill(state.prompt_blocked, float("-inf")),
                        own.masked_fill(state.response_blocked, float("-inf"))], dim=-1)
    weights = torch.softmax(scores, dim=-1)  # (U, Hkv, r, n, T, P + S)
    weights = F.dropout(weights, p=dropout, training=module.training)
    out = (weights[..., :P].reshape(U, Hkv, r * n * T, P) @ pv).reshape(U, Hkv, r, n, T, D).permute(0, 3, 1, 2, 4, 5)
    out = out.reshape(N, H, T, D) + (weights[..., P:].permute(0, 3, 1, 2, 4, 5).reshape(N, Hkv, r * T, S)
                                     @ value).reshape(N, H, T, D)
    return out.transpose(1, 2).to(dtype), None


def register() -> None:
    """Add `NAME` to transformers' attention functions (idempotent; imported here, not at the
    module's import: transformers' modeling utilities probe for the distributed stack)."""
    from transformers import AttentionInterface

    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, grouped_attention_forward)


def can_group(prompt_index: torch.Tensor, n_prompts: int) -> bool:
    """True when `prompt_index` is `group_index(n_prompts, n)`: contiguous groups of equal size."""
    N = prompt_index.shape[0]
    if n_prompts == 0 or N % n_prompts:
        return False
    expected = torch.arange(n_prompts, device=prompt_index.device).repeat_interleave(N // n_prompts)
    return bool(torch.equal(prompt_index, expected))


@contextlib.contextmanager
def grouped_prefix(body: nn.Module, state: GroupedPrefix):
    """Run `body`'s attention through `grouped_attention_forward` with `state` for one forward."""
    register()
    configs = {id(m.config): m.config for m in body.modules() if hasattr(getattr(m, "config", None),
                                                                          "_attn_implementation_internal")}
    saved = {k: c._attn_implementation_internal for k, c in configs.items()}
    token = _ACTIVE.set(state)
    try:
        for c in configs.values():  # set directly: the property's setter would recurse into sub-configs
            c._attn_implementation_internal = NAME
        yield state
    finally:
        _ACTIVE.reset(token)
        for k, c in configs.items():
            c._attn_implementation_internal = saved[k]
    if state.calls != set(range(len(state.keys))):
        raise RuntimeError(f"{type(body).__name__}: layers {sorted(set(range(len(state.keys))) - state.calls)} "
                           "bypassed transformers' attention interface; use model.shared_prefix with the gather")


class GroupedDecoding:
    """A decoding step `(ids (N,), positions (N, 1)) -> logits (N, V)` against grouped prompt keys
    (policy's `_grouped_decoder`); `select` keeps some groups (finished ones leave the batch)."""

    def __init__(self, policy, prompt_cache, prompt_mask: torch.Tensor, n: int, cache_kw: str):
        from transformers import DynamicCache

        self.policy, self.n, self.cache_kw, self.body = policy, n, cache_kw, policy.body()
        self.keys = [layer.keys for layer in prompt_cache.layers]
        self.values = [layer.values for layer in prompt_cache.layers]
        self.prompt_mask, self.own = prompt_mask.bool(), DynamicCache()

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        seen = torch.ones(ids.shape[0], self.own.get_seq_length() + 1, dtype=torch.bool, device=ids.device)
        with grouped_prefix(self.body, GroupedPrefix(self.keys, self.values, self.prompt_mask, seen, queries=1)):
            out = self.policy.model(input_ids=ids[:, None], position_ids=positions, use_cache=True, logits_to_keep=1,
                                    **{self.cache_kw: self.own})
        return out.logits[:, -1]

    def select(self, groups: torch.Tensor) -> None:
        """Keep groups `groups` (indices into the current ones) and their samples' own caches."""
        self.keys, self.values = [k[groups] for k in self.keys], [v[groups] for v in self.values]
        self.prompt_mask = self.prompt_mask[groups]
        rows = (groups[:, None] * self.n + torch.arange(self.n, device=groups.device)).reshape(-1)
        for layer in self.own.layers:  # indexed here: the cache's own batch_select_indices is the per-response gather
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys, layer.values = layer.keys[rows], layer.values[rows]
