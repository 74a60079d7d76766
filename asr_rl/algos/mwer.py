"""Minimum word error rate training over N-best groups: Prabhavalkar et al. 2018, "Minimum Word Error
Rate Training for Attention-based Sequence-to-Sequence Models", arXiv:1712.01818, eq. 6-8.

The expected risk of an utterance is approximated over its group of hypotheses (the beam N-best of
`rollout.mode=beam`, or the n samples), each weighed by its probability renormalised over the group,
with the group's mean risk as the baseline:

    log p(y_i) = sum_t log p(y_i,t | y_i,<t, x)                  (current policy, with grad)
    P^(y_i)    = exp(log p(y_i)) / sum_j exp(log p(y_j))
    L          = sum_i P^(y_i) (W(y_i) - W_bar),   W_bar = mean_i W(y_i)
    dL / dlog p(y_i) = P^(y_i) (W(y_i) - sum_j P^(y_j) W(y_j))

W_bar is a constant, so it moves the loss value and not its gradient (the paper keeps it for
variance reduction); the gradient's own baseline is the P^-weighted risk. Adding a constant to
every log p of a group changes nothing (the renormalisation cancels it).

Unterminated hypotheses (no EOS before max_new_tokens: the looping beams that dominated the risk
in issue 27's measurements) are left out of the renormalisation and of W_bar: the log p of a cut
hypothesis is that of a prefix, not of a transcript, so it is not comparable with the others', and
its risk (CER up to 130% measured) would swamp W_bar. They get no gradient of their own. A group
with fewer than two ended hypotheses gives 0 (with one, P^ = 1 and there is no gradient).

Pure functions of tensors. Shapes: N hypotheses, T tokens; rows of a group share a group id.
"""
from __future__ import annotations

import torch
from torch import Tensor


def sequence_risk(advantages: Tensor, mask: Tensor) -> Tensor:
    """``(N,)`` W = minus the advantage at each sequence's first valid token, i.e. minus the
    sequence's return (the reward when the advantages are the rewards passed through; a row with
    no valid token gets 0). `advantages`, `mask`: ``(N, T)``, anything at padding."""
    m = mask.bool()
    first = m.long().argmax(dim=1, keepdim=True)
    a = torch.where(m, advantages, torch.zeros_like(advantages)).gather(1, first).squeeze(1)
    return -a.detach()


def mwer_loss(seq_logp: Tensor, risk: Tensor, group_index: Tensor,
              keep: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    """MWER (Prabhavalkar et al. 2018, arXiv:1712.01818; see the module docstring), the mean over
    groups of sum_i P^(y_i) (W_i - W_bar) over each group's kept hypotheses.

    Args:
        seq_logp: ``(N,)`` log p(y_i) under the current policy (with grad), finite on kept rows.
        risk: ``(N,)`` W(y_i) (detached); anything on rows not kept.
        group_index: ``(N,)`` long, rows with the same value form a group (any order and sizes);
            every group of the batch must be whole.
        keep: ``(N,)`` bool, the hypotheses in the renormalisation (the ended ones); None = all.

    Returns:
        (loss, metrics). loss: scalar, the mean over all G groups (a group with fewer than two kept
        hypotheses adds 0). metrics: "mwer/risk" the P^-weighted risk and "mwer/mean_risk" W_bar,
        each averaged over the groups with a kept hypothesis; "mwer/top_prob" the mean largest P^;
        "mwer/unterminated" the share of hypotheses left out; "mwer/groups_without_signal" the
        share of groups with fewer than two kept hypotheses.
    """
    keep = torch.ones_like(seq_logp, dtype=torch.bool) if keep is None else keep.bool()
    _, g = torch.unique(group_index, return_inverse=True)
    G = int(g.max()) + 1 if g.numel() else 0
    zeros = seq_logp.new_zeros(G)
    # the group's largest kept log p, detached: any per-group constant leaves P^ and its gradient exact
    top = seq_logp.new_full((G,), float("-inf")).scatter_reduce(0, g[keep], seq_logp.detach()[keep], "amax")
    top = torch.where(torch.isfinite(top), top, zeros)
    # rows left out get 0 before exp, not after: exp of an unbounded value would give NaN gradients
    e = torch.where(keep, torch.where(keep, seq_logp - top[g], torch.zeros_like(seq_logp)).exp(),
                    torch.zeros_like(seq_logp))
    z = zeros.index_add(0, g, e)
    p_hat = e / torch.where(z > 0, z, torch.ones_like(z))[g]
    w = torch.where(keep, risk.detach().to(seq_logp.dtype), torch.zeros_like(seq_logp))
    count = zeros.index_add(0, g, keep.to(seq_logp.dtype))
    w_bar = zeros.index_add(0, g, w) / count.clamp(min=1)
    per_group = zeros.index_add(0, g, p_hat * (w - w_bar[g]))
    loss = per_group.mean() if G else seq_logp.sum() * 0.0
    with torch.no_grad():
        has = count > 0
        expected = zeros.index_add(0, g, p_hat * w)
        top_prob = zeros.scatter_reduce(0, g, p_hat, "amax")
        mean = (lambda t: float(t[has].mean()) if bool(has.any()) else 0.0)  # noqa: E731
        metrics = {"mwer/risk": mean(expected), "mwer/mean_risk": mean(w_bar), "mwer/top_prob": mean(top_prob),
                   "mwer/unterminated": float((~keep).float().mean()) if keep.numel() else 0.0,
                   "mwer/groups_without_signal": float((count < 2).float().mean()) if G else 0.0}
    return loss, metrics


def mwer_group_loss(x) -> tuple[Tensor, dict[str, float]]:
    """The "mwer" policy loss (registered in asr_rl/algos/losses.py) on a `PolicyLossInputs`:
    log p(y_i) = the sum of the valid token log-probs `x.logp` (with grad), W_i = `sequence_risk` of
    `x.advantages` (minus the reward under the "mwer" estimator), groups `x.group_index`, and only
    the rows that `x.ended` (all rows with a token when None) in the renormalisation.

    No importance ratio (an N-best is not a sample of the old policy): `old_logp`, the clip range
    and rollout weights are not read. The paper's CE interpolation is `algo.sft_coef`, at most 0.1
    (`PolicyLossSpec.max_sft_coef`; the paper uses 0.01).
    """
    if x.group_index is None:
        raise ValueError("policy loss 'mwer' renormalises over each group: pass group_index, (N,) group ids")
    m = x.mask.bool()
    keep = m.any(dim=-1) if x.ended is None else x.ended.bool() & m.any(dim=-1)
    seq_logp = torch.where(m, x.logp, torch.zeros_like(x.logp)).sum(dim=-1)
    return mwer_loss(seq_logp, sequence_risk(x.advantages, m), x.group_index.to(seq_logp.device), keep)


__all__ = ["sequence_risk", "mwer_loss", "mwer_group_loss"]
