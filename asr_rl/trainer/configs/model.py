"""The `model` and `eval` sections every trainer shares (re-exported by rl.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from asr_rl.settings import setting


@dataclass(frozen=True)
class ModelConfig:
    """How the policy is loaded and which parameters train.

    Attributes:
        force_language: prefill `language <Name><asr_text>` from the manifest, so the model writes only
            the transcript; otherwise it writes its own language tag (needed for language accuracy).
        freeze_encoder: freeze the audio encoder (the family's default patterns); null = the
            checkpoint decides: frozen unless `model init` initialised the encoder randomly
            (`asr_rl.json`). RL always keeps it frozen.
        freeze_patterns: extra fnmatch patterns of parameter names to freeze.
        lora_rank: >0 adds LoRA adapters (peft) to the LLM's attention/MLP projections.
        lora_alpha: LoRA scaling numerator.
        lora_target_modules: module-name suffixes that get adapters.
        dtype: `float32` or `bfloat16` weights.
        encoder_cache: a folder of frozen-encoder states shared by runs (shards of at most 256 MiB,
            memory-mapped): read when it was written by the same encoder and prompt format (else
            ignored with a warning and replaced), each row written as it is encoded, so that GRPO
            from that SFT does not run the encoder again for what SFT already encoded, and a killed
            run keeps what it encoded. The run refuses to start when the disk it would need is not
            free. null: the states of a run are cached in RAM only (while the encoder is frozen).
        encoder_cache_max_gib: RAM bound of the cached states (GiB, per process); past it the least
            recently used rows are dropped, and read back from `encoder_cache`'s folder (or
            encoded again without one) when next used.
        shared_prefix: the n responses of a prompt share one forward of it (rollout prefill, log-prob
            passes, update; exact); false repeats the prompt per response (the reference path).
        prefix_attention: how the responses attend to their shared prompt when sampling and
            scoring: `grouped` reads the prompt's keys/values once per group (no per-response
            copy), `gather` copies them per response (the earlier path, kept to compare); both exact.
    """

    force_language: bool = False
    freeze_encoder: bool | None = None
    freeze_patterns: tuple[str, ...] = ()
    lora_rank: int = setting(0, ge=0, note="0 = no LoRA")
    lora_alpha: int = setting(16, gt=0)
    lora_target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    dtype: Literal["float32", "bfloat16"] = "float32"
    encoder_cache: str | None = None
    encoder_cache_max_gib: float = setting(4.0, gt=0)
    shared_prefix: bool = True
    prefix_attention: Literal["grouped", "gather"] = "grouped"


@dataclass(frozen=True)
class EvalConfig:
    """Periodic evaluation on `eval_manifest` during training.

    Attributes:
        eval_batch_size: utterances per decoding batch.
        eval_max_samples: evaluate at most this many utterances (the first ones), 0 = all.
        num_beams: 1 = greedy.
        eval_max_new_tokens: decoding length limit.
    """

    eval_batch_size: int = setting(32, ge=1)
    eval_max_samples: int = setting(200, ge=0, note="0 = all")
    num_beams: int = setting(1, ge=1)
    eval_max_new_tokens: int = setting(96, ge=1)
