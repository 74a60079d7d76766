"""Configs of the trainers. Defaults live here and only here; option names follow OpenRLHF where it
has one (micro_train_batch_size, lr_warmup_ratio, max_norm, ...)."""
from __future__ import annotations

from dataclasses import dataclass, field

from asr_rl.config import RunConfig
from asr_rl.trainer.augment import AugmentConfig


@dataclass(frozen=True)
class ModelConfig:
    """How the policy is loaded and which parameters train.

    Attributes:
        force_language: prefill `language <Name><asr_text>` from the manifest, so the model writes only
            the transcript; otherwise it writes its own language tag (needed for language accuracy).
        freeze_encoder: freeze the audio encoder (the family's default patterns).
        freeze_patterns: extra fnmatch patterns of parameter names to freeze.
        lora_rank: >0 adds LoRA adapters (peft) to the LLM's attention/MLP projections.
        lora_alpha: LoRA scaling numerator.
        lora_target_modules: module-name suffixes that get adapters.
        dtype: `float32` or `bfloat16` weights.
    """

    force_language: bool = False
    freeze_encoder: bool = True
    freeze_patterns: tuple[str, ...] = ()
    lora_rank: int = 0
    lora_alpha: int = 16
    lora_target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    dtype: str = "float32"


@dataclass(frozen=True)
class EvalConfig:
    """Periodic evaluation on `eval_manifest` during training.

    Attributes:
        eval_batch_size: utterances per decoding batch.
        eval_max_samples: evaluate at most this many utterances (the first ones), 0 = all.
        num_beams: 1 = greedy.
        max_new_tokens: decoding length limit.
    """

    eval_batch_size: int = 32
    eval_max_samples: int = 200
    num_beams: int = 1
    max_new_tokens: int = 96


@dataclass(frozen=True)
class SFTConfig(RunConfig):
    """`asr-rl train sft`: supervised fine-tuning on a manifest.

    Attributes:
        train_batch_size: utterances per optimiser step (global).
        micro_train_batch_size: utterances per forward/backward; the rest is gradient accumulation.
        learning_rate: peak learning rate (AdamW).
        weight_decay: AdamW weight decay.
        adam_betas: AdamW betas.
        lr_warmup_ratio: share of `max_steps` spent warming up linearly.
        min_lr_ratio: the cosine decays to `learning_rate * min_lr_ratio`.
        max_norm: gradient clipping norm.
        ctc_weight: weight of the auxiliary CTC loss on the encoder output (0 disables it).
        ctc_labels_per_frame: CTC slots each encoder frame predicts (the encoder is slower than speech).
        max_minutes: stop early (with a final checkpoint) after this much wall time; 0 = no limit.
    """

    train_batch_size: int = 16
    micro_train_batch_size: int = 16
    learning_rate: float = 2e-3
    weight_decay: float = 0.01
    adam_betas: tuple[float, ...] = (0.9, 0.98)
    lr_warmup_ratio: float = 0.05
    min_lr_ratio: float = 0.05
    max_norm: float = 1.0
    ctc_weight: float = 0.5
    ctc_labels_per_frame: int = 3
    max_minutes: float = 0.0
    model: ModelConfig = field(default_factory=lambda: ModelConfig(freeze_encoder=False))
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        if self.train_batch_size % self.micro_train_batch_size:
            raise ValueError(f"train_batch_size {self.train_batch_size} is not a multiple of "
                             f"micro_train_batch_size {self.micro_train_batch_size}")
