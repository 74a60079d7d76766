"""The configs of preference training: `asr-rl train dpo|kto` (DPOConfig) and `asr-rl train rm`
(RMConfig)."""
from __future__ import annotations

from dataclasses import dataclass, field

from asr_rl.algos.preference_losses import PREFERENCE_LOSSES
from asr_rl.config import RunConfig
from asr_rl.settings import setting
from asr_rl.trainer.configs.model import EvalConfig, ModelConfig
from asr_rl.trainer.configs.optim import OptimConfig


@dataclass(frozen=True)
class DPOConfig(RunConfig):
    """Attributes:
        loss_type: a preference loss: `sigmoid` (DPO), `ipo`, `hinge` on pairs, or `kto` on unpaired
            examples (the registry's `PreferenceSpec.paired` says which data it reads).
        beta: strength of the implicit KL to the reference (OpenRLHF/TRL `beta`).
        label_smoothing: conservative DPO's label-flip probability (sigmoid only).
        desirable_weight: KTO's weight of desirable examples.
        undesirable_weight: KTO's weight of undesirable examples.
        nll_loss_coef: + coef x the chosen response's token-mean cross-entropy (OpenRLHF
            `--nll_loss_coef`); keeps the chosen transcripts likely, not only likelier than the
            rejected ones.
        train_batch_size: pairs (KTO: examples) per optimiser step.
        micro_train_batch_size: pairs per forward/backward.
        optim: AdamW and its schedule over `max_steps` (trainer/update/strategy.py); DPO's defaults: learning
            rate 5e-7, warmup 0.03.
    """

    loss_type: str = "sigmoid"
    beta: float = setting(0.1, gt=0)
    label_smoothing: float = setting(0.0, ge=0, lt=0.5)
    desirable_weight: float = setting(1.0, ge=0)
    undesirable_weight: float = setting(1.0, ge=0)
    nll_loss_coef: float = setting(0.0, ge=0)
    max_steps: int = setting(200, ge=1)
    train_batch_size: int = setting(8, ge=1)
    micro_train_batch_size: int = setting(8, ge=1)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(learning_rate=5e-7, lr_warmup_ratio=0.03))
    model: ModelConfig = field(default_factory=ModelConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        PREFERENCE_LOSSES.check(self.loss_type)
        if self.train_batch_size % self.micro_train_batch_size:
            raise ValueError(f"train_batch_size {self.train_batch_size} is not a multiple of "
                             f"micro_train_batch_size {self.micro_train_batch_size}")


@dataclass(frozen=True)
class RMConfig(RunConfig):
    """Attributes:
        train_batch_size: preference pairs per step.
        optim: AdamW and its schedule over `max_steps` (trainer/update/strategy.py); RM takes the shared
            defaults (learning rate 1e-3).
        margin: Bradley-Terry margin (0 = plain).
        max_len: tokens per scored text.
    """

    max_steps: int = setting(200, ge=1)
    train_batch_size: int = setting(8, ge=1)
    optim: OptimConfig = field(default_factory=OptimConfig)
    margin: float = 0.0
    max_len: int = setting(512, ge=1)
