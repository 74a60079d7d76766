"""`ModelFacts`: what a run's start-up needs to know of a model folder, each fact read once.

A trainer's checks ask the same folder the same questions: is it an audio-LLM (its `config.json`'s
`model_type`), which family serves it, what can its tokenizer write, how many positions its LLM
takes, how wide its encoder's states are (the cache plan). Each property here is read the first
time one is asked for and kept, so the checks cost one `config.json` read and one processor load
between them, and each still raises its own error at its own turn (nothing is read up front).
"""
from __future__ import annotations

from functools import cached_property
from pathlib import Path


class ModelFacts:
    """The facts of the model folder `path`, read lazily and once."""

    def __init__(self, path: str | Path):
        self.path = path

    @classmethod
    def of(cls, model: "ModelFacts | str | Path") -> "ModelFacts":
        """`model` itself when it is already facts, else the facts of the folder it names."""
        return model if isinstance(model, ModelFacts) else cls(model)

    @property
    def exists(self) -> bool:
        """Whether the folder holds a `config.json` (a missing one is `check_paths`' to name)."""
        return bool(self.path) and (Path(self.path) / "config.json").is_file()

    @cached_property
    def config(self):
        """The folder's HF config (`weights.read_model_config`: its errors name the file)."""
        from asr_rl.models.weights import read_model_config

        return read_model_config(self.path)

    @property
    def model_type(self) -> str:
        return self.config.model_type

    @cached_property
    def kind(self) -> str | None:
        """"audio-LLM", "causal LM" (the text RLHF path) or None (`families.model_kind`)."""
        from asr_rl.models.families import model_kind

        return model_kind(self.model_type)

    @cached_property
    def spec(self):
        """The `AudioLLMSpec` serving the folder (a ValueError listing the families otherwise)."""
        from asr_rl.models.families import spec_for

        return spec_for(self.model_type)

    @cached_property
    def processor(self):
        """The family's processor, from the folder."""
        return self.spec.load_processor(self.path)

    @property
    def tokenizer(self):
        return self.processor.tokenizer

    @cached_property
    def prompt_limit(self) -> int | None:
        """The positions the LLM takes (its `max_position_embeddings`; None: no limit known)."""
        return getattr(self.spec.llm_config(self.config), "max_position_embeddings", None)


__all__ = ["ModelFacts"]
