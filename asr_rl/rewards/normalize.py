"""Text normalisation before scoring, shared by the rewards and `asr-rl eval`, so that a reward and
the evaluation never disagree about what counts as an error.

    casefold; NFKC (full-width ASCII -> half-width, compatibility forms); punctuation removed (ASCII
    and CJK: 。，？！、 ...); whitespace collapsed; no spaces between two CJK characters.

Error rates are computed with jiwer: CER over characters (spaces count between Latin words, and
there are none between CJK characters), WER over whitespace-separated words.
"""
from __future__ import annotations

import re
import unicodedata
from collections import Counter

import jiwer

from asr_rl.data.languages import CHARACTER_SCORED

_CJK_RANGES = (
    (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0x20000, 0x2FA1F),  # Han
    (0x3040, 0x30FF),  # kana
    (0xAC00, 0xD7AF),  # hangul
)
_SPACE_BETWEEN_CJK = re.compile(r"(?<=[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af])\s+"
                                r"(?=[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af])")


def is_cjk(ch: str) -> bool:
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def normalize_text(text: str) -> str:
    """The canonical form both references and hypotheses are scored in.

    >>> normalize_text("Call ＡＮＮＡ, now!")
    'call anna now'
    >>> normalize_text("打开 客厅 的灯。")
    '打开客厅的灯'
    """
    text = unicodedata.normalize("NFKC", text).casefold()
    # Apostrophes inside words ("don't") are kept; other punctuation becomes a space.
    text = "".join(ch if ch == "'" or not unicodedata.category(ch).startswith(("P", "S")) else " " for ch in text)
    text = re.sub(r"(?<!\w)'|'(?!\w)", " ", text)
    text = " ".join(text.split())
    return _SPACE_BETWEEN_CJK.sub("", text)


def char_errors(ref: str, hyp: str) -> tuple[int, int, int, int]:
    """(substitutions, deletions, insertions, reference length) over characters of normalised text."""
    ref_n, hyp_n = normalize_text(ref), normalize_text(hyp)
    if not ref_n:
        return 0, 0, len(hyp_n), 0
    if not hyp_n:
        return 0, len(ref_n), 0, len(ref_n)
    out = jiwer.process_characters(ref_n, hyp_n)
    return out.substitutions, out.deletions, out.insertions, len(ref_n)


def word_errors(ref: str, hyp: str) -> tuple[int, int, int, int]:
    """(substitutions, deletions, insertions, reference words) over words of normalised text."""
    ref_w, hyp_n = normalize_text(ref).split(), normalize_text(hyp)
    if not ref_w:
        return 0, 0, len(hyp_n.split()), 0
    if not hyp_n:
        return 0, len(ref_w), 0, len(ref_w)
    out = jiwer.process_words(" ".join(ref_w), hyp_n)
    return out.substitutions, out.deletions, out.insertions, len(ref_w)


def cer(ref: str, hyp: str) -> float:
    """Character error rate of one pair (may exceed 1 with many insertions)."""
    s, d, i, n = char_errors(ref, hyp)
    return (s + d + i) / max(n, 1)


def wer(ref: str, hyp: str) -> float:
    s, d, i, n = word_errors(ref, hyp)
    return (s + d + i) / max(n, 1)


def keyword_hits(hypothesis: str, keywords: tuple[str, ...] | list[str]) -> int:
    """How many of `keywords` occur in the hypothesis (both normalised), as whole words: a keyword's
    neighbours must not be letters or digits of a spaced script, so "anna" is not in "annabel" and
    "26" is not in "126", while "26" is in "调到26度" (Mandarin writes digits between characters
    without spaces) and a CJK keyword is a plain substring.

    >>> keyword_hits("把空调调到26度", ["26", "空调"]), keyword_hits("turn to 126", ["26"])
    (2, 0)
    """
    hyp = normalize_text(hypothesis)
    return sum(1 for kw in keywords if (k := normalize_text(kw))
               and (k in hyp if any(map(is_cjk, k)) else _whole_word_in(k, hyp)))


def _whole_word_in(k: str, hyp: str) -> bool:
    def spaced_word_char(i: int) -> bool:
        return 0 <= i < len(hyp) and hyp[i].isalnum() and not is_cjk(hyp[i])

    return any(not spaced_word_char(m.start() - 1) and not spaced_word_char(m.end())
               for m in re.finditer(re.escape(k), hyp))


_LATIN_WORD = re.compile(r"[a-z]+")


def script_share(text: str, language: str | None, reference: str = "") -> float:
    """Share of the hypothesis' letters written in the reference language's script.

    zh/ja/yue: CJK characters count; Latin words count too when the reference itself has them
    (code-switching such as "打开 TV"). Other languages: Latin letters count.
    """
    norm = normalize_text(text)
    letters = [c for c in norm if unicodedata.category(c).startswith("L")]
    if not letters:
        return 0.0
    if language in CHARACTER_SCORED:
        allowed = set(_LATIN_WORD.findall(normalize_text(reference)))
        latin_ok = sum(len(w) for w in _LATIN_WORD.findall(norm) if w in allowed)
        return (sum(is_cjk(c) for c in letters) + latin_ok) / len(letters)
    return sum(not is_cjk(c) for c in letters) / len(letters)


def repeated_ngram_share(text: str, n: int) -> float:
    """Share of n-grams (words; characters for CJK-only text) that repeat an earlier n-gram."""
    norm = normalize_text(text)
    units = list(norm.replace(" ", "")) if norm and all(is_cjk(c) or c == " " for c in norm) else norm.split()
    grams = [tuple(units[i:i + n]) for i in range(len(units) - n + 1)]
    if not grams:
        return 0.0
    counts = Counter(grams)
    return sum(c - 1 for c in counts.values()) / len(grams)
