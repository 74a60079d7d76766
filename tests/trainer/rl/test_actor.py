"""How micro-batches weigh in an optimiser step, by the loss aggregation's declared spec."""
from __future__ import annotations

import pytest

from asr_rl.algos.losses import LOSS_AGG_MODES
from asr_rl.trainer.rl.actor import micro_weights
from asr_rl.trainer.rl.rollout import Group, build_experience


class _OneRank:
    def mean_over_ranks(self, x: float) -> float:
        return float(x)


def test_micro_batches_weigh_by_tokens_only_under_a_token_weighted_mode():
    # responses of 1 and 3 tokens, one per micro-batch: token-mean weighs them 1/4 and 3/4 of the
    # minibatch's 4 tokens; the seq-mean modes weigh each micro-batch 1/2
    exp = build_experience([Group(None, None, [[4], [1, 1, 1]], ["a", "b"], rewards=[0.0, 0.0])], 2, pad_id=0)
    assert [m for m in LOSS_AGG_MODES if LOSS_AGG_MODES.spec(m).token_weighted] == ["token-mean"]
    assert micro_weights(exp, [[0], [1]], "token-mean", _OneRank()) == [pytest.approx(0.25), pytest.approx(0.75)]
    for mode in ("seq-mean-token-mean", "seq-mean-token-sum"):
        assert micro_weights(exp, [[0], [1]], mode, _OneRank()) == [0.5, 0.5]
    with pytest.raises(ValueError, match="unknown loss_agg_mode 'tokens'; valid: seq-mean-token-mean"):
        micro_weights(exp, [[0], [1]], "tokens", _OneRank())
