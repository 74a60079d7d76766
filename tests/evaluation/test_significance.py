from __future__ import annotations

import doctest

import numpy as np
import pytest

from asr_rl.evaluation import significance
from asr_rl.evaluation.significance import paired_bootstrap, speaker_blocks


def test_identical_utterances_collapse_the_interval_to_a_point():
    # every utterance: 5 reference chars, A 1 error, B 0: every resample has CER A 1/5, B 0
    r = paired_bootstrap([1, 1, 1], [0, 0, 0], [5, 5, 5], n_resamples=50, seed=3)
    assert r.cer_a == pytest.approx(0.2) and r.cer_b == 0.0
    assert r.delta == pytest.approx(-0.2) and r.delta_ci == pytest.approx((-0.2, -0.2))
    assert r.relative == pytest.approx(-1.0) and r.relative_ci == pytest.approx((-1.0, -1.0))
    assert r.p_improvement == 1.0 and r.resamples == 50 and r.blocks == 3


def test_two_utterances_match_the_enumerated_bootstrap_distribution():
    """utt 1: 4 chars, A 2 errors, B 0; utt 2: 6 chars, A 0, B 3. A resample draws (utt1, utt2) as
    (2, 0) with prob 1/4: A 4/8, B 0 -> B-A = -0.5, B better;
    (1, 1) with prob 1/2: A 2/10, B 3/10 -> +0.1;
    (0, 2) with prob 1/4: A 0/12, B 6/12 -> +0.5.
    So P(B<A) = 1/4, the 95% interval is [-0.5, +0.5] (each end has mass 1/4 > 2.5 %), and the point
    estimate is the (1, 1) case. Relative (B-A)/A: -1 and +0.5 (undefined when A = 0)."""
    r = paired_bootstrap([2, 0], [0, 3], [4, 6], n_resamples=20000, seed=0)
    assert (r.cer_a, r.cer_b) == pytest.approx((0.2, 0.3)) and r.delta == pytest.approx(0.1)
    assert r.delta_ci == pytest.approx((-0.5, 0.5))
    assert abs(r.p_improvement - 0.25) < 0.01  # 3 binomial sd = 0.0092 at R = 20000
    assert r.relative == pytest.approx(0.5) and r.relative_ci == pytest.approx((-1.0, 0.5))
    # the three outcomes' shares, from the same seed: counts of utt1 per resample are Binomial(2, 1/2)
    counts = np.random.default_rng(0).multinomial(2, [0.5, 0.5], size=20000)[:, 0]
    assert r.p_improvement == pytest.approx(np.mean(counts == 2))


def test_swapping_a_and_b_flips_the_sign_and_p_becomes_one_minus_p():
    rng = np.random.default_rng(7)
    units = rng.integers(5, 40, size=30)
    ea, eb = rng.integers(0, 6, size=30), rng.integers(0, 6, size=30)
    ab = paired_bootstrap(ea, eb, units, n_resamples=500, seed=11)
    ba = paired_bootstrap(eb, ea, units, n_resamples=500, seed=11)
    assert ab.delta == pytest.approx(-ba.delta)
    assert ab.delta_ci == pytest.approx((-ba.delta_ci[1], -ba.delta_ci[0]))
    counts = np.random.default_rng(11).multinomial(30, np.full(30, 1 / 30), size=500)
    ties = np.mean(counts @ ea == counts @ eb)  # same units on both sides: equal errors = equal CER
    assert ab.p_improvement + ba.p_improvement + ties == pytest.approx(1.0)
    # with no ties possible (3k vs 2(2-k) errors for k draws of utt 1), exactly p -> 1 - p
    p1 = paired_bootstrap([3, 0], [0, 2], [5, 5], n_resamples=400, seed=1).p_improvement
    p2 = paired_bootstrap([0, 2], [3, 0], [5, 5], n_resamples=400, seed=1).p_improvement
    assert 0 < p1 < 1 and p1 + p2 == pytest.approx(1.0)


def test_speaker_blocks_resample_speakers_with_all_their_utterances():
    # two speakers whose summed counts are the two utterances of the enumerated case above
    errors_a, errors_b, units = [1, 1, 0, 0], [0, 0, 1, 2], [2, 2, 3, 3]
    blocks = speaker_blocks(["s1", "s1", "s2", "s2"])
    assert blocks.tolist() == [0, 0, 1, 1]
    by_spk = paired_bootstrap(errors_a, errors_b, units, n_resamples=2000, seed=5, blocks=blocks)
    summed = paired_bootstrap([2, 0], [0, 3], [4, 6], n_resamples=2000, seed=5)
    assert by_spk == summed and by_spk.blocks == 2
    # one speaker per utterance is the utterance bootstrap, draw for draw
    flat = paired_bootstrap(errors_a, errors_b, units, n_resamples=300, seed=2)
    assert paired_bootstrap(errors_a, errors_b, units, n_resamples=300, seed=2,
                            blocks=speaker_blocks(["a", "b", "c", "d"])) == flat


def test_missing_speakers_are_blocks_of_their_own_and_none_means_no_speaker_bootstrap():
    assert speaker_blocks(["s1", None, "s2", None, "s1"]).tolist() == [0, 1, 2, 3, 0]
    assert speaker_blocks([None, None]) is None


def test_resamples_of_only_empty_references_are_left_out_and_bad_inputs_are_refused():
    # utt 2 has an empty reference (0 chars, 1 inserted char by A): the (0, 2) resample has no rate
    r = paired_bootstrap([1, 1], [1, 0], [4, 0], n_resamples=1000, seed=0)
    counts = np.random.default_rng(0).multinomial(2, [0.5, 0.5], size=1000)[:, 0]
    assert r.resamples == int(np.sum(counts > 0)) < 1000
    with pytest.raises(ValueError, match="no units"):
        paired_bootstrap([1], [0], [0])
    with pytest.raises(ValueError, match="one length"):
        paired_bootstrap([1, 2], [0], [3, 3])


def test_docstring_examples():
    assert doctest.testmod(significance).failed == 0
