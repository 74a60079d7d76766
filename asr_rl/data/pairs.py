"""Preference data for DPO and KTO: what a response is compared on, and the responses.

Audio (`train_manifest=`): manifest lines (`id`, `audio`, `text`, `language`, ...; data/manifest.py)
that also carry
    DPO:  `chosen`, `rejected` (transcripts), optionally `chosen_score`, `rejected_score`;
    KTO:  `completion` and `label` (true: desirable), or a DPO pair (read as one of each).
`asr-rl data pairs` writes such files from a model's own N-best lists (trainer/pairs.py).
Text (`prompt_data=`): `{"prompt", "chosen", "rejected"}` lines, as OpenRLHF's `train_dpo` and
`train_rm` read them, or `{"prompt", "completion", "label"}` for KTO.
Every bad line is an error that names its line.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from asr_rl.data.manifest import ManifestError, Problem, Utterance, scan_manifest
from asr_rl.data.prompts import PromptItem, _rows


@dataclass(frozen=True)
class Pair:
    """`source`: the utterance (audio) or prompt (text) both responses answer."""

    source: Utterance | PromptItem
    chosen: str
    rejected: str


@dataclass(frozen=True)
class Unpaired:
    source: Utterance | PromptItem
    completion: str
    desirable: bool


def _line(u: Utterance) -> int:
    return int(u.source.rsplit(":", 1)[1])


def _texts(row: dict, keys: tuple[str, ...]) -> str | None:
    """None when every key holds a non-empty string; else the problem."""
    for k in keys:
        if row.get(k) is not None and not isinstance(row[k], str):
            return f"`{k}` must be a string, got {type(row[k]).__name__} {json.dumps(row[k])[:40]}"
    bad = [k for k in keys if not isinstance(row.get(k), str) or not row[k].strip()]
    return f"missing or empty {', '.join(f'`{k}`' for k in bad)}" if bad else None


def _pair_problem(row: dict) -> str | None:
    return _texts(row, ("chosen", "rejected")) or (
        "`chosen` and `rejected` are the same text" if row["chosen"].strip() == row["rejected"].strip() else None)


def _unpaired(row: dict) -> tuple[list[tuple[str, bool]], str | None]:
    if "chosen" in row or "rejected" in row:
        problem = _pair_problem(row)
        return ([] if problem else [(row["chosen"], True), (row["rejected"], False)]), problem
    problem = _texts(row, ("completion",))
    if problem is None and not isinstance(row.get("label"), bool):
        problem = "`label` must be true (desirable) or false"
    return ([] if problem else [(row["completion"], row["label"])]), problem


def read_pairs(path: str | os.PathLike, audio: bool) -> list[Pair]:
    """DPO pairs of an audio pair manifest or a text pair file; ManifestError names bad lines."""
    out, problems = [], []
    for source, row, lineno in _sources(path, audio, problems):
        problem = _pair_problem(row)
        if problem:
            problems.append(Problem(lineno, problem))
        else:
            out.append(Pair(source, row["chosen"].strip(), row["rejected"].strip()))
    return _checked(path, out, problems)


def read_unpaired(path: str | os.PathLike, audio: bool) -> list[Unpaired]:
    """KTO examples: `completion` + `label` lines, and each DPO pair as one desirable and one
    undesirable example."""
    out, problems = [], []
    for source, row, lineno in _sources(path, audio, problems):
        items, problem = _unpaired(row)
        if problem:
            problems.append(Problem(lineno, problem))
        out += [Unpaired(source, text.strip(), good) for text, good in items]
    return _checked(path, out, problems)


def preference_kind(path: str | os.PathLike) -> str | None:
    """What a manifest holds, from the keys of its first JSON-object line: `paired` (`chosen`,
    `rejected`, `audio`: what `train dpo` reads), `unpaired` (`completion`, `label`: `train kto`),
    `text_pairs` (`prompt`, `chosen`, `rejected` without audio: what `train rm` and the text path of
    `train dpo` read), or None (a plain manifest)."""
    if not Path(path).is_file():
        return None  # the manifest's reader names it
    try:
        with open(path, encoding="utf-8") as f:
            for raw in f:
                try:
                    row = json.loads(raw)
                except json.JSONDecodeError:
                    continue
                if isinstance(row, dict):
                    if {"chosen", "rejected"} & row.keys():
                        return "text_pairs" if "prompt" in row and "audio" not in row else "paired"
                    return "unpaired" if "completion" in row else None
    except UnicodeDecodeError:
        return None  # not text (a parquet file): not a preference file
    return None


def preference_problems(utterances: list[Utterance], kind: str) -> list[Problem]:
    """The lines of a scanned `paired` (DPO) or `unpaired` (KTO) manifest that `train dpo`/`train kto`
    would refuse for their preference fields (the manifest fields are `scan_manifest`'s to check)."""
    check = _pair_problem if kind == "paired" else (lambda row: _unpaired(row)[1])
    return [Problem(_line(u), problem) for u in utterances if (problem := check(u.meta))]


def _sources(path, audio: bool, problems: list[Problem]):
    """(utterance or prompt, raw row, line) of every line that parses; parse problems go to `problems`."""
    path = Path(path)
    if audio:
        scan = scan_manifest(path)
        problems += scan.problems
        for u in scan.utterances:
            yield u, u.meta, _line(u)
        return
    if not path.is_file():
        raise FileNotFoundError(f"preference file {path} does not exist")
    for lineno, row, err in _rows(path):
        if err is None and (not isinstance(row.get("prompt"), str) or not row["prompt"].strip()):
            err = "missing or empty `prompt`"
        if err is not None:
            problems.append(Problem(lineno, err))
            continue
        prompt = PromptItem(str(row.get("id", f"line{lineno}")), ({"role": "user", "content": row["prompt"]},))
        yield prompt, row, lineno


def _checked(path, items: list, problems: list[Problem]) -> list:
    if problems:
        raise ManifestError(path, sorted(problems, key=lambda p: p.line), kind="preference file")
    if not items:
        raise ManifestError(path, [Problem(0, "the file holds no preference examples")], kind="preference file")
    return items


__all__ = ["Pair", "Unpaired", "read_pairs", "read_unpaired", "preference_kind", "preference_problems"]
