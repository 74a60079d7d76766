"""`reward.term_options`, checked when the config loads, before any model loads or Ray starts.

Every option a config gives a term (`reward.term_options: {silence: {min_speech: 0.3}}`) must be a
keyword the term's function takes (a misspelt one is named, with the term's valid options), of its
default's kind (a finite number where the default is a number, a bool where it is one), and within
the bounds the term declares (`TermSpec.check_options`: a probability in (0, 1)). A term that cannot
score without an option (the acoustic scorer's folder, the plausibility judge's) says so here; the
folder itself is checked with the run's other paths (`check_term_folders`), before any model loads,
not after the policy loads and a rollout runs.
"""
from __future__ import annotations

import difflib
import inspect
import math
from pathlib import Path
from typing import Any


def check_term_options(name: str, options: Any, fn, check=None) -> None:
    """ValueError naming `reward.term_options.<name>`, the option and the fix (module docstring), for
    the term function `fn` and its spec's `check_options` (`check`)."""
    where = f"reward.term_options.{name}"
    if not isinstance(options, dict):
        raise ValueError(f"{where} must be a mapping of option: value, got {options!r}")
    params = term_parameters(fn)
    for key, value in options.items():
        if key not in params:
            close = difflib.get_close_matches(str(key), params, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            valid = ", ".join(params) or "none"
            raise ValueError(f"{where}: the {name} term has no option {key!r}{hint}; its options: {valid}")
        _check_kind(f"{where}.{key}", value, params[key].default)
    if check is not None:
        try:
            check(options)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None


def term_parameters(fn) -> dict[str, inspect.Parameter]:
    """The options of a term function: its keyword parameters after the samples."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name: p for p in list(inspect.signature(fn).parameters.values())[1:] if p.kind in kinds}


def _check_kind(where: str, value: Any, default: Any) -> None:
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ValueError(f"{where} must be true or false, got {value!r}")
    elif isinstance(default, (int, float)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{where} must be a finite number, got {value!r}")
        if isinstance(default, int) and not isinstance(value, int):
            raise ValueError(f"{where} must be a whole number, got {value!r}")
    elif isinstance(default, str) and not isinstance(value, str):
        raise ValueError(f"{where} must be a string, got {value!r}")


# --- the bounds terms declare (`register_term(..., check_options=...)`) ---------------------------
def silence_options(options: dict) -> None:
    if options.get("min_speech", 0.0) < 0:
        raise ValueError(f"min_speech is seconds of detected speech, >= 0; got {options['min_speech']!r}")
    threshold = options.get("threshold", 0.5)
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold is silero-vad's speech probability, in (0, 1); got {threshold!r} (at 1 or "
                         "above nothing is ever speech, and the term would push the policy to silence on speech)")


def acoustic_options(options: dict) -> None:
    if not options.get("scorer"):
        raise ValueError("the acoustic term needs its scorer folder: {acoustic: {scorer: DIR}} (made by "
                         "`asr-rl train scorer`)")


def plausibility_options(options: dict) -> None:
    if not options.get("model"):
        raise ValueError("the plausibility term needs its judge: {plausibility: {model: DIR}} (made by "
                         "`asr-rl train rm` on `asr-rl data judge-pairs`)")


# the folders term options name, checked with the run's other paths (trainer/run/folder.py), before
# any model loads: (term, option, the file the folder holds, what makes one)
TERM_FOLDERS = (("acoustic", "scorer", "scorer.json", "`asr-rl train scorer`"),
                ("plausibility", "model", "config.json", "`asr-rl data judge-pairs` and `asr-rl train rm`"))


def check_term_folders(reward) -> None:
    """ValueError naming `reward.term_options.<term>.<option>` whose folder is not what the term reads."""
    for term, option, marker, maker in TERM_FOLDERS:
        folder = (reward.term_options.get(term) or {}).get(option) if reward.terms and term in reward.terms else None
        if folder and not (Path(folder) / marker).is_file():
            raise ValueError(f"reward.term_options.{term}.{option}={folder} is not the folder the {term} term reads "
                             f"(no {marker}); make one with {maker}")


__all__ = ["check_term_options", "check_term_folders", "term_parameters"]
