"""Where a model's errors are: edits by kind, keyword errors by kind, repetition loops.

- Edits (substitutions / deletions / insertions) in the unit each language is scored in: characters
  for the languages written without spaces (`CHARACTER_SCORED`: zh, yue, ja, th), words otherwise,
  on the shared normalised text, aligned by jiwer (`rewards/normalize.py`).
- Keyword error rate = keywords not found in the hypothesis / keywords, split by kind: `digits` is a
  keyword made only of numerals (arabic digits, English number words, Chinese numerals; with "oh"
  and "point", and 点/半/分/秒 as in clock times 七点半, it still counts as digits when at least one
  numeral is there), `names` is every other keyword (names, rooms, devices).
- A repetition loop: the hypothesis repeats an n-gram (any n) at least 3 times in a row, more times
  in a row than the reference does (a correct "five five five" is no loop), or it is much longer than
  the reference: more than twice its units and at least 5 units more.
"""
from __future__ import annotations

import unicodedata

from asr_rl.data.languages import CHARACTER_SCORED
from asr_rl.rewards.normalize import char_errors, keyword_hits, normalize_text, word_errors

_EN_NUMBERS = frozenset(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand "
    "million billion".split())
_ZH_NUMERALS = frozenset("零〇一二两三四五六七八九十百千万亿")
_NUMBER_JOINERS = frozenset({"oh", "point", "点", "半", "分", "秒"})  # digits only beside a numeral
LOOP_MIN_REPEATS = 3


def scoring_unit(language: str) -> str:
    """`char` for the languages scored by CER alone, `word` otherwise."""
    return "char" if language in CHARACTER_SCORED else "word"


def units(text: str, unit: str) -> list[str]:
    """Normalised words, or normalised characters without spaces."""
    norm = normalize_text(text)
    return norm.split() if unit == "word" else [c for c in norm if not c.isspace()]


def keyword_kind(keyword: str) -> str:
    """`digits` or `names` (module docstring).

    >>> [keyword_kind(k) for k in ("five five one", "seven oh five", "七点半", "5551234", "anna", "张伟", "oh")]
    ['digits', 'digits', 'digits', 'digits', 'names', 'names', 'names']
    """
    norm = normalize_text(keyword)
    tokens = [t for w in norm.split() for t in ([w] if w.isascii() else list(w))]
    numeral = [t.isdigit() or t in _EN_NUMBERS or t in _ZH_NUMERALS
               or all(unicodedata.numeric(c, None) is not None for c in t) for t in tokens]
    if tokens and any(numeral) and all(n or t in _NUMBER_JOINERS for n, t in zip(numeral, tokens)):
        return "digits"
    return "names"


def longest_repeat(tokens: list[str]) -> int:
    """Most times any n-gram of `tokens` occurs back to back (1 when nothing repeats, 0 when empty).

    >>> longest_repeat("call me me me back".split()), longest_repeat(list("打开打开打开灯")), longest_repeat([])
    (3, 3, 0)
    """
    best = 1 if tokens else 0
    for n in range(1, len(tokens) // 2 + 1):
        for start in range(len(tokens) - 2 * n + 1):
            gram, reps = tokens[start:start + n], 1
            while tokens[start + reps * n:start + (reps + 1) * n] == gram:
                reps += 1
            best = max(best, reps)
    return best


def is_loop(reference: str, hypothesis: str, unit: str = "word") -> bool:
    """Whether `hypothesis` is stuck in a repetition loop or runs far past `reference` (docstring)."""
    ref, hyp = units(reference, unit), units(hypothesis, unit)
    if len(hyp) > 2 * len(ref) and len(hyp) - len(ref) >= 5:
        return True
    reps = longest_repeat(hyp)
    return reps >= LOOP_MIN_REPEATS and reps > longest_repeat(ref)


def error_breakdown(results: list) -> dict:
    """Edits per unit, keyword errors per kind and loops over scored `UtteranceResult`s (those
    without `error`):

        {"edits": {"word"|"char": {"substitutions", "deletions", "insertions", "reference"}},
         "keywords": {"names"|"digits": {"keywords", "missed", "error_rate"}},
         "loops": count, "loop_ids": the first 10}
    """
    edits: dict[str, dict] = {}
    kws: dict[str, dict] = {}
    loops = []
    for r in (r for r in results if r.error is None):
        unit = scoring_unit(r.language)
        s, d, i, n = (char_errors if unit == "char" else word_errors)(r.reference, r.hypothesis)
        e = edits.setdefault(unit, {"substitutions": 0, "deletions": 0, "insertions": 0, "reference": 0})
        e["substitutions"] += s
        e["deletions"] += d
        e["insertions"] += i
        e["reference"] += n
        for kw in r.keywords:
            k = kws.setdefault(keyword_kind(kw), {"keywords": 0, "missed": 0})
            k["keywords"] += 1
            k["missed"] += 1 - keyword_hits(r.hypothesis, (kw,))
        if is_loop(r.reference, r.hypothesis, unit):
            loops.append(r.id)
    for k in kws.values():
        k["error_rate"] = k["missed"] / k["keywords"]
    return {"edits": dict(sorted(edits.items())), "keywords": dict(sorted(kws.items())), "loops": len(loops),
            "loop_ids": loops[:10]}
