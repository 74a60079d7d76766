"""`head_logprobs` against the plain path it replaces: the whole `(N, T, V)` log-softmax."""
from __future__ import annotations

import pytest
import torch

from asr_rl.models.head import MASKED_LOGIT, head_logprobs


def _plain(hidden, head, ids, mask, forbidden, temperature):
    logits = head(hidden).float().index_fill(-1, forbidden, MASKED_LOGIT) / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, ids[..., None]).squeeze(-1).masked_fill(mask == 0, 0.0)
    entropy = -(logp_all.exp() * logp_all).sum(-1).masked_fill(mask == 0, 0.0)
    return logp, entropy


@pytest.mark.parametrize("chunk_bytes", [64 << 20, 4 * 50 * 3])  # the dense pass; chunks of 3 positions
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_equals_the_full_log_softmax_values_and_gradients(chunk_bytes, temperature):
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    hidden = torch.randn(4, 6, 16, requires_grad=True)
    ids = torch.randint(0, 48, (4, 6))
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] + [0] * 5, [0] * 6])
    forbidden = torch.tensor([48, 49])
    logp, ent = head_logprobs(hidden, head, ids, mask, forbidden, temperature, with_entropy=True,
                              chunk_bytes=chunk_bytes)
    ref_logp, ref_ent = _plain(hidden, head, ids, mask, forbidden, temperature)
    assert torch.allclose(logp, ref_logp, atol=1e-5) and torch.allclose(ent, ref_ent, atol=1e-5)
    assert (logp[mask == 0] == 0).all() and (ent[mask == 0] == 0).all()
    (g,) = torch.autograd.grad((logp * 1.3 - ent).sum(), hidden)
    (ref_g,) = torch.autograd.grad((ref_logp * 1.3 - ref_ent).sum(), hidden)
    assert torch.allclose(g, ref_g, atol=1e-5)
    assert head_logprobs(hidden, head, ids, torch.zeros_like(mask), forbidden).abs().sum() == 0


def test_log_probs_alone_take_one_reduction_and_the_same_gradient():
    torch.manual_seed(1)
    head = torch.nn.Linear(8, 30, bias=False)
    hidden = torch.randn(3, 5, 8, requires_grad=True)
    ids, mask, forbidden = torch.randint(0, 29, (3, 5)), torch.ones(3, 5, dtype=torch.long), torch.tensor([29])
    mask[1, 3:] = 0
    logp = head_logprobs(hidden, head, ids, mask, forbidden, temperature=1.3, chunk_bytes=4 * 30 * 2)
    ref, _ = _plain(hidden, head, ids, mask, forbidden, 1.3)
    assert torch.allclose(logp, ref, atol=1e-5)
    (g,) = torch.autograd.grad(logp.sum(), hidden)
    (ref_g,) = torch.autograd.grad(ref.sum(), hidden)
    assert torch.allclose(g, ref_g, atol=1e-5)
