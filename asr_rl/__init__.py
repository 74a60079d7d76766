"""asr-rl: reinforcement learning for LLM-based speech recognition."""

__version__ = "0.1.0"
