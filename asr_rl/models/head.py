"""The LM head where scoring needs it: log-probs of the given tokens (and the entropy) of the
response positions only, chunk by chunk.

The plain form runs the head over every position, padding included, then takes a float32
log-softmax of the whole `(N, T, V)` logits and, for the entropy, its exponential: three or four
tensors of that size. At a released vocabulary (131k-152k entries) that is most of a scoring pass.
Here, when the logits would not fit in `chunk_bytes`, only the valid positions go through the head,
in chunks of at most `chunk_bytes` of logits, and each chunk is reduced at once: log p(token) = z_token - logsumexp(z) and H = logsumexp(z) -
sum_v softmax(z)_v z_v, the same quantities in other floating-point order. Logits that fit take
the plain dense pass: at a character vocabulary selecting the rows costs more than it saves.
"""
from __future__ import annotations

import torch
from torch import nn

MASKED_LOGIT = -1e9  # finite, so that p * log p stays 0 (not NaN) for forbidden tokens


def head_logprobs(hidden: torch.Tensor, head: nn.Module, ids: torch.Tensor, mask: torch.Tensor,
                  forbidden: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False,
                  chunk_bytes: int = 64 << 20):
    """Per-token log-probs of `ids` under `head(hidden)` / `temperature`, forbidden ids masked.

    Args:
        hidden: ``(N, T, H)`` the hidden states that predict each token.
        head: the LM head (``H -> V``).
        ids: ``(N, T)`` the tokens scored.
        mask: ``(N, T)`` 1 at the positions scored; the others give 0.
        forbidden: ``(F,)`` ids no distribution may put mass on.
        chunk_bytes: the float32 logits held at once (a chunk of positions x V).

    Returns:
        ``(N, T)`` log-probs, and with `with_entropy` also the ``(N, T)`` entropy; 0 where `mask` is 0.
    """
    vocab = head.weight.shape[0]
    if mask.numel() * vocab * 4 <= chunk_bytes:  # small: one dense pass costs less than selecting rows
        return _dense(hidden, head, ids, mask, forbidden, temperature, with_entropy)
    keep = mask.bool()
    rows, tokens = hidden[keep], ids[keep]  # (M, H), (M,)
    step = max(1, chunk_bytes // (4 * vocab))
    logps, entropies = [], []
    for start in range(0, rows.shape[0], step):
        # in place on the head's fresh output: its backward needs none of it
        z = head(rows[start:start + step]).float().index_fill_(-1, forbidden, MASKED_LOGIT)
        if temperature != 1.0:
            z = z.div_(temperature)
        chosen = tokens[start:start + step]
        if with_entropy:
            logp, entropy = _TokenLogpEntropy.apply(z, chosen)
            entropies.append(entropy)
        else:  # one reduction over the vocabulary, no (M, V) output written
            logp = z.gather(-1, chosen[:, None]).squeeze(-1) - torch.logsumexp(z, dim=-1)
        logps.append(logp)
    logp = _scatter(logps, keep, hidden)
    return (logp, _scatter(entropies, keep, hidden)) if with_entropy else logp


def _dense(hidden, head, ids, mask, forbidden, temperature: float, with_entropy: bool):
    """`head_logprobs` over every position at once: the plain form, for logits that fit one chunk."""
    logits = head(hidden).float().index_fill_(-1, forbidden, MASKED_LOGIT)
    if temperature != 1.0:
        logits = logits.div_(temperature)
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, ids[..., None]).squeeze(-1).masked_fill(mask == 0, 0.0)
    if not with_entropy:
        return logp
    return logp, -(logp_all.exp() * logp_all).sum(-1).masked_fill(mask == 0, 0.0)


class _TokenLogpEntropy(torch.autograd.Function):
    """`(M, V)` logits z and `(M,)` tokens -> log p(token) and the entropy, from one softmax.

    Backward (p = softmax(z), log p = z - logsumexp(z)): d log p(t)/dz = onehot(t) - p, and
    dH/dz = -p * (log p + H); autograd through logsumexp and a second softmax would take the
    exponentials again and keep two more `(M, V)` tensors.
    """

    @staticmethod
    def forward(ctx, z: torch.Tensor, tokens: torch.Tensor):
        lse = torch.logsumexp(z, dim=-1, keepdim=True)
        p = (z - lse).exp_()
        entropy = lse.squeeze(-1) - (p * z).sum(-1)
        ctx.save_for_backward(z, p, lse, entropy, tokens)
        return z.gather(-1, tokens[:, None]).squeeze(-1) - lse.squeeze(-1), entropy

    @staticmethod
    def backward(ctx, g_logp: torch.Tensor, g_entropy: torch.Tensor):
        z, p, lse, entropy, tokens = ctx.saved_tensors
        # -g_logp * p - g_entropy * p * (log p + H), then + g_logp at the token
        grad = (z - lse).add_(entropy[:, None]).mul_(-g_entropy[:, None]).sub_(g_logp[:, None]).mul_(p)
        grad.scatter_add_(-1, tokens[:, None], g_logp[:, None])
        return grad, None


def _scatter(parts: list[torch.Tensor], keep: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The `(M,)` values of the kept positions back into an `(N, T)` float32 tensor of zeros."""
    out = torch.zeros(keep.shape, dtype=torch.float32, device=like.device)
    if parts:
        out = out.masked_scatter(keep, torch.cat(parts))
    return out


__all__ = ["MASKED_LOGIT", "head_logprobs"]
