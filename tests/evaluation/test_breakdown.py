from __future__ import annotations

import doctest

from asr_rl.evaluation import breakdown
from asr_rl.evaluation.breakdown import error_breakdown, is_loop, keyword_kind, longest_repeat
from asr_rl.evaluation.metrics import UtteranceResult


def test_keyword_kinds():
    digits = ["five five five one two three four", "twenty one", "seven oh five", "42", "五五五一二三四", "七点半",
              "五十"]
    names = ["anna", "living room", "张伟", "客厅", "oh", "five star hotel"]
    assert [keyword_kind(k) for k in digits] == ["digits"] * len(digits)
    assert [keyword_kind(k) for k in names] == ["names"] * len(names)


def test_longest_repeat_by_hand():
    assert longest_repeat("a b a b a b c".split()) == 3  # (a b) x 3
    assert longest_repeat("a b a b c".split()) == 2
    assert longest_repeat("a b c".split()) == 1


def test_loops_by_hand():
    # the n-gram "the lights" 3 times in a row; the reference has no repeat
    assert is_loop("turn on the lights", "turn on the lights the lights the lights")
    # twice is no loop, and a reference that itself repeats 3 times is transcribed, not looped
    assert not is_loop("turn on the lights", "turn on the lights the lights")
    assert not is_loop("dial five five five one", "dial five five five one")
    assert is_loop("dial five five five one", "dial five five five five one")  # 4 > 3
    # much longer: ref 3 words; 12 words = more than 2 x 3 and 9 more -> loop; 6 words (2 x 3) -> not
    assert is_loop("call anna now", "call anna now and then please tell her that i am late")
    assert not is_loop("call anna now", "call anna now and then please")
    # characters for zh: 开灯 x 3
    assert is_loop("打开灯", "打开灯开灯开灯", unit="char")
    assert not is_loop("打开灯", "打开灯", unit="char")


def test_error_breakdown_by_hand():
    results = [
        # en, words: "anna"->"ana" 1 substitution, "now" deleted; keyword anna missed, digits "five" found
        UtteranceResult("1", "call anna now five", "call ana five", "en", ("anna", "five")),
        # zh, characters: 客->卧 1 substitution, 1 inserted 了; name 客厅 missed, digits 七点半 found
        UtteranceResult("2", "七点半打开客厅灯", "七点半打开卧厅灯了", "zh", ("客厅", "七点半")),
        UtteranceResult("3", "call ben", "call ben ben ben", "en", ("ben",)),  # 2 insertions, a loop
        UtteranceResult("4", "x y", "", "en", ("x",), error="audio missing"),  # failed: not scored
    ]
    bd = error_breakdown(results)
    assert bd["edits"] == {"char": {"substitutions": 1, "deletions": 0, "insertions": 1, "reference": 8},
                           "word": {"substitutions": 1, "deletions": 1, "insertions": 2, "reference": 6}}
    assert bd["keywords"] == {"digits": {"keywords": 2, "missed": 0, "error_rate": 0.0},
                              "names": {"keywords": 3, "missed": 2, "error_rate": 2 / 3}}
    assert bd["loops"] == 1 and bd["loop_ids"] == ["3"]


def test_docstring_examples():
    assert doctest.testmod(breakdown).failed == 0
