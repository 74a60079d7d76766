"""Text pairs a judge learns from without audio (`asr-rl data judge-pairs`): each domain sentence is
the chosen side, a copy of it with the errors speech recognisers make is the rejected side.

A user with a domain text corpus (the app's sentences, a grammar's expansions, last year's
transcripts) but no transcripts of the new audio trains a reward model on these pairs (`asr-rl
train rm`), then scores each RL hypothesis with it given the utterance's context list
(rewards/judge.py): the judge sees only the hypothesis and the context, never a reference. The
corruptions are the error types the literature counts for LLM-based ASR: substitutions by other
in-domain words, deletions, insertions, repetition loops (the hallucination mode of arXiv:2509.01939),
truncation and misspelt (non-)words; a sentence written without spaces (Chinese) is corrupted by
character.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asr_rl.data.readers.base import json_lines

CORRUPTIONS = ("substitute", "delete", "insert", "repeat", "truncate", "misspell")


def judge_prompt(context: tuple[str, ...] | list[str] = ()) -> str:
    """What the judge reads before a transcript: the task, and the utterance's context list (the
    names and phrases the app expects), the same words at training and at scoring."""
    prompt = "Transcript of a spoken request."
    return prompt + (f" Words it may use: {', '.join(context)}." if context else "")


@dataclass(frozen=True)
class DomainText:
    """One sentence of the domain corpus and the context list it came with (() for plain text)."""

    text: str
    context: tuple[str, ...] = ()


def read_domain_text(path: str | os.PathLike) -> list[DomainText]:
    """Sentences of a text file (one a line) or of a JSONL manifest (each line's `text`, with its
    `context`; lines without text are skipped). A line that is not JSON in a `.jsonl` file is an
    error naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"domain text {path} does not exist")
    if path.suffix != ".jsonl":
        return [DomainText(t.strip()) for t in path.read_text(encoding="utf-8").splitlines() if t.strip()]
    out, lines = [], 0
    for lineno, row, why in json_lines(path):
        if row is None:
            raise ValueError(f"{path}:{lineno}: {why}")
        lines += 1
        text = row.get("text")
        if isinstance(text, str) and text.strip():
            out.append(DomainText(text.strip(), tuple(row.get("context") or ())))
    if lines and not out:
        raise ValueError(f"{path}: none of its {lines} lines has a `text` (unlabelled audio?): judge pairs are made "
                         "from the domain's sentences; give a manifest with transcripts or a text file, one sentence "
                         "a line")
    return out


def _units(text: str) -> tuple[list[str], str]:
    """Words and their separator; a sentence with no spaces (Chinese) by character."""
    words = text.split()
    return (words, " ") if len(words) > 1 or not text else (list(text), "")


def corrupt(text: str, kind: str, rng: np.random.Generator, vocabulary: list[str]) -> str:
    """`text` with one error of `kind` (a name in `CORRUPTIONS`) drawn from `rng`; other words come
    from `vocabulary` (the corpus's own units). May return `text` unchanged when the kind cannot
    change it (e.g. deleting from one word); `make_judge_pairs` skips those."""
    units, sep = _units(text)
    i = int(rng.integers(len(units)))
    other = vocabulary[int(rng.integers(len(vocabulary)))]
    if kind == "substitute":
        units[i] = other
    elif kind == "delete" and len(units) > 1:
        del units[i: i + int(rng.integers(1, 3))]
    elif kind == "insert":
        units.insert(i, other)
    elif kind == "repeat":
        span = units[i: i + int(rng.integers(1, 4))]
        units[i:i] = span * int(rng.integers(1, 4))  # the span said 2-4 times
    elif kind == "truncate" and len(units) > 1:
        units = units[: max(1, int(len(units) * rng.uniform(0.3, 0.8)))]
    elif kind == "misspell":
        word = list(units[i])
        j = int(rng.integers(len(word)))
        letters = sorted({c for v in vocabulary for c in v})
        word[j] = letters[int(rng.integers(len(letters)))]
        units[i] = "".join(word)
    return sep.join(units)


def make_judge_pairs(sentences: list[DomainText], per_sentence: int = 4, seed: int = 0) -> list[dict]:
    """`{prompt, chosen, rejected, corruption}` rows, `per_sentence` a sentence (the corruption kinds
    taken in turn), as `asr-rl train rm` reads them. Seeded: the same input and seed, the same rows."""
    if not sentences:
        raise ValueError("no sentences to make judge pairs from: the domain text is empty")
    vocabulary = sorted({u for s in sentences for u in _units(s.text)[0]})
    rng = np.random.default_rng(seed)
    rows = []
    for n, sentence in enumerate(sentences):
        for k in range(per_sentence):
            kind = CORRUPTIONS[(n * per_sentence + k) % len(CORRUPTIONS)]
            for _ in range(8):  # a kind that cannot change this sentence is drawn again, then skipped
                rejected = corrupt(sentence.text, kind, rng, vocabulary)
                if rejected != sentence.text:
                    rows.append({"prompt": judge_prompt(sentence.context), "chosen": sentence.text,
                                 "rejected": rejected, "corruption": kind})
                    break
    return rows
