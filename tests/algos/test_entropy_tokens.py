"""The top-rho entropy tokens of "Beyond the 80/20 rule" (arXiv:2506.01939), by hand."""
from __future__ import annotations

import pytest
import torch

from asr_rl.algos.entropy_tokens import high_entropy_tokens
from asr_rl.algos.losses import compute_policy_loss

NAN = float("nan")


def _t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def test_top_share_of_the_valid_tokens_by_entropy():
    # 5 valid tokens, entropies 0.1 0.5 | 0.3 0.9 0.2 (NaN at padding is ignored)
    entropy, mask = _t([[0.1, 0.5, NAN], [0.3, 0.9, 0.2]]), _t([[1, 1, 0], [1, 1, 1]])
    # rho 0.4: ceil(2.0) = 2 tokens, 0.9 and 0.5
    assert high_entropy_tokens(entropy, mask, 0.4).tolist() == [[False, True, False], [False, True, False]]
    # rho 0.5: ceil(2.5) = 3 tokens, 0.9 0.5 0.3
    assert high_entropy_tokens(entropy, mask, 0.5).tolist() == [[False, True, False], [True, True, False]]
    # rho 0.6: 0.6 * 5 is 3.0000000000000004 in floats, still 3 tokens
    assert int(high_entropy_tokens(entropy, mask, 0.6).sum()) == 3
    assert high_entropy_tokens(entropy, mask, 1.0).tolist() == mask.bool().tolist()  # off
    # ties at the threshold are kept: rho 0.2 of [0.5, 0.5, 0.1] is 1 token, both 0.5 stay
    assert high_entropy_tokens(_t([[0.5, 0.5, 0.1]]), _t([[1, 1, 1]]), 0.2).tolist() == [[True, True, False]]
    with pytest.raises(ValueError, match="in \\(0, 1\\]"):
        high_entropy_tokens(entropy, mask, 0.0)


def test_only_the_kept_tokens_get_a_gradient_and_the_normaliser_counts_all():
    # 4 tokens, r = 1, A = 1: PPO loss -1 per token. Keeping the top 1 (entropy 0.9): the paper's
    # J = 1/4 * sum 1[H >= tau] * (-A r) = -1/4; gradient -1/4 at that token, 0 elsewhere.
    logp = torch.zeros(1, 4, requires_grad=True)
    mask, entropy = torch.ones(1, 4), _t([[0.2, 0.9, 0.1, 0.3]])
    keep = high_entropy_tokens(entropy, mask, 0.25)
    adv = torch.where(keep, torch.ones(1, 4), torch.zeros(1, 4))  # as actor.py applies it
    out = compute_policy_loss("ppo", logp, logp.detach(), adv, mask)
    out.loss.backward()
    torch.testing.assert_close(out.loss, _t(-0.25))
    torch.testing.assert_close(logp.grad, _t([[0.0, -0.25, 0.0, 0.0]]))
