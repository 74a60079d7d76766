"""A toy text RLHF set for recipes/run_ppo_text.sh and the tests: prompts with labels, and preference
pairs whose preferred answer is learnable (kind words over unkind ones).

    python -m asr_rl.data.text_demo --out data/text_demo
"""
from __future__ import annotations

import argparse
from pathlib import Path

from asr_rl.utils import write_jsonl

GOOD = ["great", "good", "nice", "yes", "kind", "fine", "glad", "happy"]
BAD = ["awful", "bad", "rude", "no", "mean", "sad", "angry", "ugly"]


def write_text_demo(root: str | Path) -> dict[str, Path]:
    """`prompts.jsonl` ({prompt, label}) and `prefs.jsonl` ({prompt, chosen, rejected}) under `root`."""
    root = Path(root)
    prompts = [{"prompt": f"reply to {w}", "label": w} for w in GOOD + BAD]
    prefs = [{"prompt": f"how was it {i}", "chosen": f"it was {g}", "rejected": f"it was {b}"}
             for i, (g, b) in enumerate(zip(GOOD * 2, BAD + BAD[::-1]))]
    paths = {"prompts": root / "prompts.jsonl", "prefs": root / "prefs.jsonl"}
    write_jsonl(paths["prompts"], prompts)
    write_jsonl(paths["prefs"], prefs)
    return paths


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", required=True)
    for name, path in write_text_demo(p.parse_args().out).items():
        print(f"{name}: {path}")
