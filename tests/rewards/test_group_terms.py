"""Terms that read a sample's whole group (consensus, language on unlabelled lines) and the cutting
of a batch between groups (rewards/groups.py)."""
from __future__ import annotations

import random

import pytest

from asr_rl.rewards.base import RewardError, Sample
from asr_rl.rewards.combine import WeightedReward
from asr_rl.rewards.group_terms import agreement, consensus_term
from asr_rl.rewards.groups import cut_points, group_chunks, group_languages
from asr_rl.rewards.terms import TERMS, language_term


def _group(texts, gid=0, **kw):
    return [Sample(t, None, group_id=gid, prompt=f"u{gid}", **kw) for t in texts]


def test_mbr_agreement_by_hand():
    # d("abcd", "abce") = 1/4, d("abcd", "xyz") = 4/4, d("abce", "xyz") = 1
    assert agreement(["abcd", "abce", "xyz"]) == pytest.approx([1 - (0.25 + 1) / 2, 1 - (0.25 + 1) / 2, 0.0])
    # words: "call anna now" / "call bob now" differ in 1 of 3 words
    assert agreement(["call anna now", "call bob now"], unit="word") == pytest.approx([2 / 3, 2 / 3])
    assert agreement(["", ""]) == [1.0, 1.0]  # two empty transcripts agree


def test_consensus_scores_each_group_alone_and_normalises_text():
    samples = _group(["Call Anna.", "call anna", "call bob"]) + _group(["打开灯", "打开灯"], gid=1)
    r = consensus_term(samples)
    # normalised, the first two are equal: d = 0 between them, 4/9 to "call bob"
    assert r[:3] == pytest.approx([1 - 4 / 18, 1 - 4 / 18, 1 - 8 / 18])
    assert r[3:] == [1.0, 1.0]
    maj = consensus_term(samples, mode="majority", confidence=True)
    assert maj == pytest.approx([2 / 3, 2 / 3, 0.0, 1.0, 1.0])


def test_majority_tie_goes_to_the_transcript_seen_first():
    assert consensus_term(_group(["a b", "c d", "c d", "a b"]), mode="majority") == [1.0, 0.0, 0.0, 1.0]


def test_a_group_of_one_is_refused_naming_the_utterance():
    with pytest.raises(ValueError, match=r"utterance 'u3' \(group 3\) has only 1 here: sample n >= 2"):
        consensus_term(_group(["a", "b"]) + _group(["c"], gid=3))
    with pytest.raises(RewardError, match="reward term 'consensus' raised ValueError"):
        WeightedReward({"consensus": 1.0})(_group(["c"]))


def test_its_spec_says_it_reads_groups_and_its_options_are_checked():
    spec = TERMS.spec("consensus")
    assert (spec.needs_reference, spec.needs_group, spec.min_group_size) == (False, True, 2)
    assert TERMS.spec("language").needs_group and not TERMS.spec("cer").needs_group
    from asr_rl.rewards.config import RewardConfig

    with pytest.raises(ValueError, match=r"reward\.term_options\.consensus.*mode must be one of mbr, majority"):
        RewardConfig(terms={"consensus": 1.0}, term_options={"consensus": {"mode": "vote"}})
    with pytest.raises(ValueError, match=r"has no option 'confidance'.*did you mean 'confidence'"):
        RewardConfig(terms={"consensus": 1.0}, term_options={"consensus": {"confidance": True}})


def test_rl_config_refuses_one_sample_an_utterance_for_consensus():
    from asr_rl.trainer.recipes.rl import load_rl_config

    with pytest.raises(ValueError, match=r"reward term 'consensus' .* needs at least 2 of them: "
                                         r"rollout\.n_samples_per_prompt is 1"):
        load_rl_config("grpo", None, ["reward.terms={consensus: 1.0}", "algo.advantage_estimator=reinforce",
                                       "rollout.n_samples_per_prompt=1", "optim.micro_train_batch_size=1"])
    load_rl_config("grpo", None, ["reward.terms={consensus: 1.0, silence: 1.0}"])


def test_language_without_a_transcript_votes_in_the_group():
    zh = _group(["打开灯", "打开灯", "open the light"], predicted_language="Chinese")
    zh = [*zh[:2], Sample("open the light", None, group_id=0, predicted_language="English")]
    en = _group(["call anna", "call anna"], gid=1, predicted_language="English")
    assert group_languages(zh + en) == ["zh", "zh", "zh", "en", "en"]
    assert language_term(zh + en) == [1.0, 1.0, 0.0, 1.0, 1.0]
    # the line's own language (a deployment's log) wins over the vote
    logged = [Sample(s.hypothesis, None, "en", group_id=0, predicted_language=s.predicted_language) for s in zh]
    assert language_term(logged) == [0.0, 0.0, 1.0]


@pytest.mark.parametrize("ids, parts, size, want", [
    ([0, 0, 1, 1, 2, 2, 3, 3], 2, None, [(0, 4), (4, 8)]),
    ([0, 0, 0, 1, 1, 1, 2], None, 2, [(0, 3), (3, 6), (6, 7)]),
    ([0, 0, 1, 1, 0], 3, None, [(0, 5)]),  # group 0 comes back: no cut holds it whole
    ([5], 4, None, [(0, 1)]),
    ([], 2, None, []),
])
def test_group_chunks_cut_between_groups(ids, parts, size, want):
    assert group_chunks(ids, parts=parts, size=size) == want


def test_no_chunk_ever_splits_a_group():
    rng = random.Random(0)
    for _ in range(200):
        ids = [g for g in range(rng.randint(1, 8)) for _ in range(rng.randint(1, 5))]
        if rng.random() < 0.3:
            ids[rng.randrange(len(ids))] = ids[0]  # a group that comes back later
        chunks = group_chunks(ids, size=rng.randint(1, 6))
        assert chunks[0][0] == 0 and chunks[-1][1] == len(ids)
        assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
        seen = [set(ids[a:b]) for a, b in chunks]
        assert all(not (x & y) for i, x in enumerate(seen) for y in seen[i + 1:])
        assert set(cut_points(ids)) >= {a for a, _ in chunks[1:]}
