"""The unit the grammars produce: what the reference says, what the TTS engine reads, what matters."""
from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

T = TypeVar("T")


@dataclass(frozen=True)
class Sentence:
    """One voice command.

    Attributes:
        text: the reference transcript, exactly what is spoken (numbers written as the words said).
        language: "en" or "zh".
        keywords: the words a user cares about (contact, room, device, number, time), each a substring
            of `text`, in the order they appear.
        speak: what the TTS engine is given; equal to `text` for English, tone-numbered pinyin for
            Mandarin (espeak-ng's `cmn-latn-pinyin` voice reads pinyin, not characters).
    """

    text: str
    language: str
    keywords: tuple[str, ...]
    speak: str

    def __post_init__(self) -> None:
        # A keyword that is not in the reference would silently make keyword rewards unreachable.
        missing = [k for k in self.keywords if k not in self.text]
        if missing:
            raise ValueError(f"keywords {missing} are not substrings of {self.text!r}")


def pick(rng: np.random.Generator, options: Sequence[T]) -> T:
    """Uniform choice that keeps the element's type (np.random.choice would turn tuples into arrays)."""
    return options[int(rng.integers(len(options)))]


def utterance_rng(seed: int, split: str, index: int) -> np.random.Generator:
    """Independent stream per utterance; crc32 (not hash()) keeps split names stable across runs."""
    return np.random.default_rng([seed, zlib.crc32(split.encode()), index])
