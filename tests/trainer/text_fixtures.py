"""Toy text data and a tiny Qwen2 for the text RLHF tests."""
from __future__ import annotations

import json
from pathlib import Path

GOOD = ["great", "good", "nice", "yes", "kind", "fine", "glad", "happy"]
BAD = ["awful", "bad", "rude", "no", "mean", "sad", "angry", "ugly"]


def write_text_data(root: Path) -> dict[str, Path]:
    root.mkdir(parents=True, exist_ok=True)
    prompts = [{"prompt": f"reply to {w}", "label": w} for w in GOOD + BAD]
    prefs = [{"prompt": f"how was it {i}", "chosen": f"it was {g}", "rejected": f"it was {b}"}
             for i, (g, b) in enumerate(zip(GOOD * 2, BAD + BAD[::-1]))]
    paths = {"prompts": root / "prompts.jsonl", "prefs": root / "prefs.jsonl"}
    paths["prompts"].write_text("".join(json.dumps(r) + "\n" for r in prompts))
    paths["prefs"].write_text("".join(json.dumps(r) + "\n" for r in prefs))
    return paths
