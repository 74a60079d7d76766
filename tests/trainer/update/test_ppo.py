"""How micro-batches weigh in an optimiser step, by the unit the loss aggregation declares."""
from __future__ import annotations

import pytest
import torch

from asr_rl.algos.losses import LOSS_AGG_MODES, agg_count
from asr_rl.trainer.update.ppo import micro_weights
from asr_rl.trainer.rollout.experience import Group, build_experience


class _OneRank:
    def mean_over_ranks(self, x: float) -> float:
        return float(x)


class _TwoRanks:
    """This rank's total and the other rank's (`other`): their mean, as the all-reduce gives."""

    def __init__(self, other: float):
        self.other = other

    def mean_over_ranks(self, x: float) -> float:
        return (float(x) + self.other) / 2


def _mask(lengths: list[int], T: int = 3) -> torch.Tensor:
    return (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).float()


def test_each_mode_declares_the_unit_it_averages_over():
    # rows of 1, 3 and 0 tokens: 4 tokens, 2 non-empty sequences, 3 rows
    m = _mask([1, 3, 0])
    assert {mode: LOSS_AGG_MODES.spec(mode).unit for mode in LOSS_AGG_MODES} == {
        "token-mean": "token", "seq-mean-token-mean": "sequence", "seq-mean-token-sum": "row"}
    assert [agg_count(mode, m) for mode in LOSS_AGG_MODES] == [4.0, 2.0, 3.0]


def test_micro_batches_weigh_by_their_share_of_the_modes_units():
    # responses of 1 and 3 tokens, one per micro-batch: token-mean weighs them 1/4 and 3/4 of the
    # minibatch's 4 tokens; the seq-mean modes weigh each micro-batch 1/2 (one sequence each)
    exp = build_experience([Group(None, None, [[4], [1, 1, 1]], ["a", "b"], rewards=[0.0, 0.0])], 2, pad_id=0)
    masks = [exp.response_mask[[0]], exp.response_mask[[1]]]
    assert micro_weights(masks, "token-mean", _OneRank()) == [pytest.approx(0.25), pytest.approx(0.75)]
    for mode in ("seq-mean-token-mean", "seq-mean-token-sum"):
        assert micro_weights(masks, mode, _OneRank()) == [0.5, 0.5]
    with pytest.raises(ValueError, match="unknown loss_agg_mode 'tokens'; valid: seq-mean-token-mean"):
        micro_weights(masks, "tokens", _OneRank())


def test_seq_mean_divides_by_the_non_empty_sequences_of_all_micro_batches_and_ranks():
    # this rank: micro-batch A with 3 sequences (one empty), B with 1; the other rank holds 4
    # non-empty sequences. Step: 2 + 1 + 4 = 7 non-empty sequences over W = 2 ranks, 3.5 a rank:
    # A weighs 2 / 3.5, B 1 / 3.5 (each micro-batch's own seq mean times its share), so that
    # after DeepSpeed averages the 2 ranks each sequence weighs 1/7. Equal weights would give 1/2.
    masks = [_mask([2, 0, 1]), _mask([3])]
    assert micro_weights(masks, "seq-mean-token-mean", _TwoRanks(other=4.0)) == [
        pytest.approx(2 / 3.5), pytest.approx(1 / 3.5)]
    # rows count the empty one: 3 + 1 here, 4 there -> 4 a rank: 3/4 and 1/4
    assert micro_weights(masks, "seq-mean-token-sum", _TwoRanks(other=4.0)) == [0.75, 0.25]
    # no unit anywhere: weight 0, not a division by zero
    assert micro_weights([_mask([0])], "seq-mean-token-mean", _TwoRanks(other=0.0)) == [0.0]


class _FixedPolicy:
    """A policy whose log-probs and entropies of the micro-batch's responses are given tensors."""

    eos_id = 99

    def __init__(self, logp: torch.Tensor, entropy: torch.Tensor):
        self.logp, self.entropy = logp, entropy

    def embed_rows(self, rows):
        return torch.zeros(1), torch.zeros(1)

    def logprobs(self, embeds, mask, responses, prompt_index, temperature, with_entropy):
        return self.logp, self.entropy


@pytest.mark.parametrize("term_mode, kl, entropy", [
    # rows of 1 and 3 tokens; k1 KL per token 4 | 1 1 1, entropy 2 | 1 1 1. Token mean: KL 7/4,
    # entropy 5/4 (OpenRLHF 0.11.2, whatever the policy's mode); as loss_agg_mode
    # (seq-mean-token-mean, verl): KL (4 + 1) / 2 = 2.5, entropy (2 + 1) / 2 = 1.5
    ("token-mean", 1.75, 1.25), (None, 2.5, 1.5)])
def test_kl_and_entropy_terms_aggregate_by_their_own_mode(term_mode, kl, entropy):
    from asr_rl.trainer.configs.rl import AlgoConfig
    from asr_rl.trainer.update.ppo import actor_loss

    exp = build_experience([Group(None, None, [[5], [5, 5, 5]], ["a", "b"], rewards=[0.0, 0.0])], 2, pad_id=0)
    exp.advantages = torch.zeros(2, 3)  # the policy term is 0
    exp.ref_logp = -torch.tensor([[4.0, 0, 0], [1, 1, 1]])
    policy = _FixedPolicy(torch.zeros(2, 3), torch.tensor([[2.0, 0, 0], [1, 1, 1]]))
    algo = AlgoConfig(loss_agg_mode="seq-mean-token-mean", kl_entropy_value_agg_mode=term_mode,
                      kl_estimator="k1", entropy_coef=0.1)
    out = actor_loss(policy, exp.select([0, 1]), algo, temperature=1.0, kl_coef=0.5)
    assert out.metrics["kl/loss"] == pytest.approx(kl) and out.metrics["policy/entropy"] == pytest.approx(entropy)
    # the policy part under its mode, KL - entropy under theirs (one part when they are the same)
    expected = 0.5 * kl - 0.1 * entropy
    if term_mode is None:
        assert set(out.parts) == {"seq-mean-token-mean"}
        assert float(out.parts["seq-mean-token-mean"]) == pytest.approx(expected)
    else:
        assert float(out.parts["seq-mean-token-mean"]) == 0.0
        assert float(out.parts["token-mean"]) == pytest.approx(expected)
    assert float(out.loss) == pytest.approx(expected)
