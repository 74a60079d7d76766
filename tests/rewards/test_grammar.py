"""The word grammar (edit distance to the nearest sentence) and the demo's verifier reward file."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from asr_rl.rewards.base import Sample
from asr_rl.rewards.grammar import WordGrammar, characters
from asr_rl.rewards.plugins import load_reward_file

VERIFIER = Path(__file__).resolve().parents[2] / "recipes" / "rewards" / "voice_commands.py"
G = WordGrammar(["call {name} {tail}?", "dial {phone}"],
                {"name": ["anna", "ben"], "tail": ["on speaker", "at {phone}"], "d": ["one", "two"],
                 "phone": ["{d} {d} {d}"]})


@pytest.mark.parametrize("text, distance", [
    ("call anna", 0), ("call ben on speaker", 0), ("call anna at one two one", 0), ("dial two two two", 0),
    ("call emma", 1),                      # a name the grammar does not hold: one substitution
    ("call anna at one two", 1),           # a digit short: one deletion
    ("call anna anna", 1),                 # one word too many: an insertion
    ("call anna at one two one two", 1),   # a digit too many
    ("", 2),                               # the shortest sentence is two words
    ("hello", 2),                          # substitute one, add one
    ("dial dial one", 2),                  # 'dial one' + one missing digit + one extra word
])
def test_distance_to_the_nearest_sentence(text, distance):
    assert G.distance(text.split()) == distance


def test_score_is_one_minus_edits_per_word():
    assert G.score("call anna at one two one") == 1.0
    assert G.score("call anna at one two") == pytest.approx(1 - 1 / 5)
    assert G.score("") == 0.0 and G.score("hello there friend") == 0.0  # 3 edits for 3 words


def test_a_script_without_spaces_is_matched_by_character():
    assert characters("把{room}的灯{when}?") == ["把", "{room}", "的", "灯", "{when}?"]
    g = WordGrammar(["给{name}打电话", "拨打{d}{d}{d}"], {"name": ["赵磊", "妈妈"], "d": ["五", "六"]}, split=characters)
    assert g.distance(characters("给赵磊打电话")) == 0
    assert g.distance(characters("给赵雷打电话")) == 1       # one character of the name wrong
    assert g.distance(characters("拨打五六")) == 1           # a digit short
    assert g.score("拨打五六") == pytest.approx(1 - 1 / 4)  # one edit in four characters
    assert g.score("") == 0.0


def test_grammar_mistakes_are_named():
    with pytest.raises(ValueError, match="template token '{who}' names no slot"):
        WordGrammar(["call {who}"], {"name": ["anna"]})
    with pytest.raises(ValueError, match="slot 'a' uses itself"):
        WordGrammar(["{a}"], {"a": ["x {a}"]})


@pytest.mark.parametrize("language", ["en", "zh"])
def test_the_verifier_passes_every_sentence_the_demo_grammars_speak(language):
    from asr_rl.data.synth.grammar_en import sample_english
    from asr_rl.data.synth.grammar_zh import sample_mandarin

    sample = {"en": sample_english, "zh": sample_mandarin}[language]
    rng = np.random.default_rng(0)
    texts = [sample(rng).text for _ in range(400)]
    out = load_reward_file(VERIFIER)([Sample(t, None, language, duration=2.0) for t in texts])
    assert out.terms["command_validity"] == [1.0] * len(texts)


def test_the_verifier_gives_partial_credit_and_needs_no_reference():
    reward = load_reward_file(VERIFIER)
    samples = [Sample("call anna at five five five one two three four", None, "en", duration=3.0),
               Sample("call anna at five five five one two three", None, "en", duration=3.0),  # a digit short
               Sample("call zelda", None, "en", duration=1.0, metadata={"entities": ["zelda", "kitchen"]}),
               Sample("call zelda", None, "en", duration=1.0, metadata={"entities": None}),
               Sample("", None, "en", duration=1.0),
               Sample("拨打五五五一二三", None, "zh", duration=1.0),        # Mandarin: a digit short
               Sample("给胡艳打电话", None, "zh", duration=1.0, metadata={"entities": ["胡艳"]}),
               Sample("给胡艳打电话", None, "zh", duration=1.0),
               Sample("appelle anna", None, "fr", duration=1.0)]
    out = reward(samples)
    validity = out.terms["command_validity"]
    # the phone number a digit short: one deletion for nine words
    assert validity[:5] == [1.0, pytest.approx(1 - 1 / 9), 1.0, 0.5, 0.0]
    # Mandarin by character: a digit short is one deletion in eight characters; a contact from the
    # line's entity list passes, without it the nearest lexicon name is two characters away
    assert validity[5:8] == [pytest.approx(1 - 1 / 8), 1.0, pytest.approx(1 - 2 / 6)]
    assert validity[8] is None  # no French grammar: the term does not apply, the other two do
    # the empty transcript: validity 0, no loop, speaking rate -1 (0 characters a second): 0.5 * -1
    assert out.rewards[4] == pytest.approx(-0.5)
    assert out.rewards[8] == pytest.approx(0.0)  # 11 characters in 1 s: in the band, no loop
