"""Built-in terms on hand-made cases (numbers worked out in the comments)."""
from __future__ import annotations

import pytest

from asr_rl.rewards.base import RewardError, Sample
from asr_rl.rewards.combine import WeightedReward
from asr_rl.rewards.terms import (cer_term, fluency_term, get_term, keyword_term, language_term,
                                  repeated_ngram_share, script_share, wer_gated_term, wer_term)


def S(hyp, ref, lang="en", **kw):
    return Sample(hyp, ref, lang, **kw)


def test_cer_and_wer_terms_with_floor():
    # "call ana" vs "call anna": 1 deletion / 9 chars; "x" vs "ab": 1 sub + 1 del -> CER 1.0
    assert cer_term([S("call ana", "call anna")]) == [pytest.approx(1 - 1 / 9)]
    # 3 insertions on a 1-char reference: CER 3 -> 1 - 3 = -2, floored
    assert cer_term([S("abcd", "a")], floor=-1.0) == [-1.0]
    assert cer_term([S("abcd", "a")]) == [0.0]
    # "turn of the light" vs "turn on the lights": 2 substitutions / 4 words
    assert wer_term([S("turn of the light", "turn on the lights")]) == [0.5]
    # normalisation: case, punctuation and full-width forms do not count as errors
    assert wer_term([S("Turn ON the lights!", "turn on the lights")]) == [1.0]


def test_keyword_reward_of_a_sample_does_not_depend_on_its_batch():
    # without hotwords "kitchen" is no insertion (the other sample's keyword once counted as one)
    samples = [S("call anna in the kitchen", "call anna", keywords=("anna",)),
               S("call bob", "call bob", keywords=("bob", "kitchen"))]
    whole = keyword_term(samples)
    assert whole == [1.0, 0.5]
    assert [x for chunk in (samples[:1], samples[1:]) for x in keyword_term(chunk)] == whole


def test_every_built_in_term_scores_a_batch_whole_as_in_chunks():
    # what the Ray reward pool and the remote client do: cut a batch into chunks of whole groups
    # (rewards/groups.py), here utterances of two samples each
    import dataclasses

    from asr_rl.rewards.groups import group_chunks
    from asr_rl.rewards.terms import TERMS

    hot = {"hotwords": ["anna", "bob", "kitchen"]}
    samples = [S("call anna in the kitchen", "call anna", keywords=("anna",), metadata=hot),
               S("call bob bob bob bob", "call bob", keywords=("bob",), metadata=hot),
               S("", "turn on the lights"),
               S("打开客厅的灯", "打开卧室的灯", "zh", keywords=("卧室",)),
               S("turn on the light", "turn on the lights", keywords=("lights",)),
               S("call bob at six", "call anna at six", keywords=("anna", "six"))]  # "bob": sample 2's keyword
    samples = [dataclasses.replace(s, group_id=i // 2) for i, s in enumerate(samples)]
    # acoustic and silence: test_acoustic_scorer.py, test_silence.py; plausibility needs a judge: test_judge.py
    names = [n for n in TERMS.where(needs_audio=False) if n != "plausibility"]
    reward = WeightedReward({name: 1.0 for name in names})
    whole = reward(samples)
    cuts = group_chunks([s.group_id for s in samples], size=1)
    assert cuts == [(0, 2), (2, 4), (4, 6)]
    chunks = [reward(samples[a:b]) for a, b in cuts]
    assert [r for c in chunks for r in c.rewards] == pytest.approx(whole.rewards)
    for name in names:
        assert [x for c in chunks for x in c.terms[name]] == pytest.approx(whole.terms[name]), name


def test_hotwords_that_are_not_a_list_of_strings_name_the_sample():
    bad = S("call anna", "call anna", keywords=("anna",), prompt="u7", metadata={"hotwords": "anna,bob"})
    with pytest.raises(RewardError, match="sample 'u7': metadata 'hotwords' must be a list of strings"):
        keyword_term([bad])


def test_wer_gated_is_token_level_below_the_gate_and_flat_above():
    samples = [S("turn on the light", "turn on the lights"),   # WER 1/4 -> 0.75
               S("turn of a light", "turn on the lights"),    # WER 3/4 > 0.5 -> -1
               S("打开客厅的等", "打开客厅的灯", "zh"),          # zh uses CER 1/6 -> 5/6
               S("一二三四五六七", "打开客厅的灯", "zh")]           # CER 7/6 > gate -> -1
    assert wer_gated_term(samples, gate=0.5) == [0.75, -1.0, pytest.approx(5 / 6), -1.0]
    assert wer_gated_term(samples[1:2], gate=0.5, above_gate=0.0) == [0.0]


def test_keyword_recall_and_inserted_hotword_penalty():
    hot = {"hotwords": ["anna", "bob", "kitchen"]}
    samples = [S("call anna in the kitchen", "call anna", keywords=("anna",), metadata=hot),  # recall 1, inserts "kitchen"
               S("call bob", "call bob", keywords=("bob", "kitchen"), metadata=hot),           # recall 1/2
               S("turn on the lights", "turn on the lights"),                    # no keywords, no insertion
               S("打开客厅的灯", "打开卧室的灯", "zh", keywords=("卧室",))]          # recall 0
    # 1 - 0.5 * 1/1 = 0.5; 1/2 - 0 = 0.5; 1; 0
    assert keyword_term(samples) == [0.5, 0.5, 1.0, 0.0]
    assert keyword_term(samples, insertion_penalty=0.0)[0] == 1.0


def test_language_term_script_and_tag():
    assert script_share("打开 tv", "zh", "打开 TV") == 1.0          # Latin allowed: the reference has it
    assert script_share("打开 tv", "zh", "打开电视") == pytest.approx(2 / 4)
    assert script_share("call anna", "en") == 1.0
    assert script_share("", "en") == 0.0
    samples = [S("打开灯", "打开灯", "zh", predicted_language="Chinese"),
               S("call anna", "call anna", "en", predicted_language="Chinese"),   # wrong tag -> 0
               S("call 安娜", "call anna", "en")]                                  # 4 Latin of 6 letters
    assert language_term(samples) == [1.0, 0.0, pytest.approx(4 / 6)]


def test_fluency_penalties():
    # "a b c a b c" -> 4 trigrams, (a b c) twice -> 1 repeat / 4 = 0.25
    assert repeated_ngram_share("a b c a b c", 3) == 0.25
    # characters for CJK: 哈哈哈哈 -> bigrams 哈哈 x3 -> 2 repeats / 3
    assert repeated_ngram_share("哈哈哈哈", 2) == pytest.approx(2 / 3)
    ref = "call anna"  # 9 chars -> allowed 13.5
    samples = [S("call anna", ref),
               S("", ref),                                                  # empty: 1 - 1 = 0
               S("call anna", ref, well_formed=False),                       # malformed: 0
               S("call anna call anna call anna", ref),                     # 29 chars, trigrams repeat
               S("call anna", ref, duration=0.2)]                            # 25 ch/s x 0.2 s = 5 allowed
    out = fluency_term(samples)
    assert out[:3] == [1.0, 0.0, 0.0]
    # 6 words -> 4 trigrams, 2 distinct -> repeats 2/4; length (29 - 13.5) / 13.5 capped at 1 -> 1 - 0.5 - 1
    assert out[3] == pytest.approx(-0.5)
    # length over audio: (9 - 5) / 5 = 0.8 -> 0.2
    assert out[4] == pytest.approx(0.2)


def test_weighted_reward_combines_and_logs_each_term():
    reward = WeightedReward({"cer": 1.0, "keyword": 0.5})
    out = reward([S("call ana", "call anna", keywords=("anna",))])
    # cer 8/9; keyword: "ana" misses "anna" -> 0 -> total 8/9
    assert out.rewards == [pytest.approx(8 / 9)]
    assert out.terms == {"cer": [pytest.approx(8 / 9)], "keyword": [0.0]}
    logs = out.log()
    assert logs["reward/cer"] == pytest.approx(8 / 9) and logs["reward/keyword"] == 0.0


@pytest.mark.parametrize("override, message", [
    (["reward.terms={cer: 1.0, bleu: 0.5}"], "reward: reward.terms: unknown reward term 'bleu'; valid: acoustic, biasing, cer, consensus, dg_wer"),
    (["reward.term_options={wer: {floor: 0}}"], "reward.term_options names terms that are not in reward.terms: ['wer']"),
    (["reward.remote_url=http://127.0.0.1:1,127.0.0.1:18761"],
     "reward.remote_url: reward server URL '127.0.0.1:18761' has no http:// or https:// scheme: add http:// "
     "(http://127.0.0.1:18761)"),
])
def test_reward_names_and_urls_are_checked_at_config_load(override, message):
    from asr_rl.config import ConfigError, load_config
    from asr_rl.trainer.configs.rl import RLConfig

    with pytest.raises(ConfigError) as e:
        load_config(RLConfig, None, override)
    assert message in str(e.value)


def test_terms_of_a_reward_file_or_server_are_not_checked_and_a_registered_term_is_valid():
    from asr_rl.config import load_config
    from asr_rl.rewards.terms import register_term
    from asr_rl.trainer.configs.rl import RLConfig

    # the default terms stay in the config but do not apply to a file or remote reward
    assert load_config(RLConfig, None, ["reward.file=f.py"]).reward.file == "f.py"
    assert load_config(RLConfig, None, ["reward.remote_url=https://h:1"]).reward.remote_url == "https://h:1"

    @register_term("test_constant")
    def constant(samples):
        return [1.0] * len(samples)

    assert load_config(RLConfig, None, ["reward.terms={test_constant: 2.0}"]).reward.terms == {"test_constant": 2.0}


def test_unknown_term_and_a_term_that_raises():
    with pytest.raises(ValueError, match="unknown reward term 'bleu'; valid: acoustic, biasing, cer, consensus, dg_wer, empty, fluency, hallucination, keyword"):
        get_term("bleu")
    with pytest.raises(ValueError, match="not in reward.terms"):
        WeightedReward({"cer": 1.0}, {"wer": {"floor": 0}})
    bad = WeightedReward({"cer": 1.0}, {"cer": {"no_such_option": 1}})
    with pytest.raises(RewardError, match="reward term 'cer' raised TypeError"):
        bad([S("a", "a")])


def test_failure_terms_tell_omission_hallucination_and_empty_apart():
    from asr_rl.rewards.terms import empty_term, hallucination_term, omission_term

    ref = "turn on the kitchen lights"  # 5 words
    omitted = S("turn on the", ref)                            # 2 deletions
    hallucinated = S("turn on the kitchen lights and call anna", ref)  # 3 insertions
    looped = S("turn on turn on turn on", ref)
    empty = S("", ref)
    assert omission_term([omitted, hallucinated, empty]) == [-2 / 5, 0.0, -1.0]
    assert hallucination_term([omitted, hallucinated, empty]) == [0.0, -3 / 5, 0.0]
    # the loop aligns as "turn on [the->turn] [kitchen->on] [lights->turn] +on": 3 sub, 1 ins (1/5);
    # its word 3-grams (turn on turn)(on turn on)(turn on turn)(on turn on): 2 of 4 repeat an earlier one
    assert hallucination_term([looped]) == [pytest.approx(-(1 / 5 + 2 / 4))]
    assert empty_term([omitted, empty, S("", "")]) == [0.0, -1.0, 0.0]
    # Mandarin counts characters: 打开客厅的灯 (6) -> 打开灯 leaves out 3; as one "word" it is 1 substitution
    assert omission_term([S("打开灯", "打开客厅的灯", "zh")]) == [-0.5]
    assert omission_term([S("打开灯", "打开客厅的灯", "zh")], unit="word") == [0.0]
    with pytest.raises(ValueError, match="unit must be auto, char or word"):
        omission_term([omitted], unit="phone")


def test_dual_granularity_reward_ranks_how_a_transcript_fails():
    from asr_rl.rewards.terms import dual_granularity_term

    ref = "turn on the kitchen lights"  # 5 words, gate 0.3
    near = S("turn on the kitchen light", ref)          # 1 sub: e = 0.2 <= gate -> 1 - 0.2
    partial = S("turn on", ref)                         # 3 del: e = 0.6 -> 0.7 * 2/5 = 0.28
    wrong = S("play some music now please", ref)        # 5 sub: hits 0 -> 0
    empty = S("", ref)                                  # -> empty = -0.5
    # 10 words for 5: 'the' kept, 4 sub, 5 ins -> 0.7 * 1/5 - 5/5 = -0.86
    hallucinated = S("play some music in the bedroom and call anna now", ref)
    looped = S("lights lights lights lights lights lights lights lights", ref)  # 7 ins + repeats -> -1 (floor)
    r = dual_granularity_term([near, partial, wrong, empty, hallucinated, looped])
    assert r == [pytest.approx(0.8), pytest.approx(0.28), 0.0, -0.5, pytest.approx(-0.86), -1.0]
    assert r[0] > r[1] > r[2] > r[3] > r[4] > r[5]
    assert dual_granularity_term([empty], empty=-0.2) == [-0.2]
