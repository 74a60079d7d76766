"""Text prompt sets for the text RLHF path (docs/data.md).

    {"prompt": "..." or "messages": [{"role": ..., "content": ...}, ...], "label": "..." (optional), ...}

and preference pairs for reward-model training:

    {"prompt": "...", "chosen": "...", "rejected": "..."}

Every bad line is reported with its file and line number (never skipped silently).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from asr_rl.data.manifest import ManifestError, Problem


@dataclass(frozen=True)
class PromptItem:
    """One prompt; `messages` is the chat form the policy's template renders."""

    id: str
    messages: tuple[dict, ...]
    label: str | None = None
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def prompt_text(self) -> str:
        return "\n".join(str(m.get("content", "")) for m in self.messages if m.get("role") != "assistant")

    @property
    def text(self) -> str | None:  # the reference a reward compares with
        return self.label


@dataclass
class PromptBatch:
    items: list[PromptItem]

    def __len__(self) -> int:
        return len(self.items)

    def select(self, idx) -> "PromptBatch":
        return PromptBatch([self.items[i] for i in idx])


@dataclass(frozen=True)
class PreferencePair:
    prompt: str
    chosen: str
    rejected: str


def _rows(path: Path):
    """(line number, object, None) of each line of a JSONL prompt file, or (line, None, why)."""
    from asr_rl.data.readers.base import json_lines

    if not path.is_file():
        raise FileNotFoundError(f"prompt set {path} does not exist")
    for lineno, row, err in json_lines(path):
        yield lineno, row, err or None


def read_prompts(path: str | os.PathLike, input_key: str = "prompt", label_key: str = "label") -> list[PromptItem]:
    """All prompts of a JSONL prompt set; any bad line is an error naming it."""
    path = Path(path)
    items, problems = [], []
    for lineno, row, err in _rows(path):
        if err is None:
            try:
                items.append(_prompt_item(row, lineno, input_key, label_key))
                continue
            except ValueError as e:
                err = str(e)
        problems.append(Problem(lineno, err))
    if problems:
        raise ManifestError(path, problems, kind="prompt set")
    if not items:
        raise ManifestError(path, [Problem(0, "the prompt set holds no prompts")], kind="prompt set")
    return items


def _prompt_item(row: dict, lineno: int, input_key: str, label_key: str) -> PromptItem:
    if "messages" in row:
        msgs = row["messages"]
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) and "role" in m and "content" in m
                                                             for m in msgs):
            raise ValueError("`messages` must be a non-empty list of {role, content} objects")
        messages = tuple(msgs)
    elif isinstance(row.get(input_key), str) and row[input_key].strip():
        messages = ({"role": "user", "content": row[input_key]},)
    else:
        raise ValueError(f"missing `{input_key}` (a non-empty string) or `messages`")
    label = row.get(label_key)
    if label is not None and not isinstance(label, str):
        label = json.dumps(label, ensure_ascii=False)
    meta = {k: v for k, v in row.items() if k not in ("id", input_key, "messages", label_key)}
    return PromptItem(str(row.get("id", f"line{lineno}")), messages, label, meta)


def read_preferences(path: str | os.PathLike) -> list[PreferencePair]:
    """Pairwise preference data: `prompt`, `chosen`, `rejected` on every line."""
    pairs, problems = scan_preferences(path)
    if problems:
        raise ManifestError(path, problems, kind="preference set")
    if not pairs:
        raise ManifestError(path, [Problem(0, "the preference set holds no pairs")], kind="preference set")
    return pairs


def scan_preferences(path: str | os.PathLike) -> tuple[list[PreferencePair], list[Problem]]:
    """Every usable pair of a text preference file and every bad line (`asr-rl data check`)."""
    path = Path(path)
    pairs, problems = [], []
    for lineno, row, err in _rows(path):
        if err is None:
            missing = [k for k in ("prompt", "chosen", "rejected") if not isinstance(row.get(k), str)]
            if not missing:
                pairs.append(PreferencePair(row["prompt"], row["chosen"], row["rejected"]))
                continue
            err = f"missing or non-string {', '.join(f'`{k}`' for k in missing)}"
        problems.append(Problem(lineno, err))
    return pairs, problems
