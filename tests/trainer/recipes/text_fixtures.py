"""Toy text data for the text RLHF tests (the same set recipes/run_ppo_text.sh uses)."""
from asr_rl.data.text_demo import BAD, GOOD, write_text_demo as write_text_data

__all__ = ["BAD", "GOOD", "write_text_data"]
