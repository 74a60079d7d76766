"""The configs of SFT and RL (`asr-rl train sft|grpo|ppo`). Every trainer's config lives in this
package and each default in one place: the sections are modules beside this one (`optim`:
optim.py, `model` and `eval`: model.py, `distributed`: distributed.py, the `early_stopping_*` keys:
early_stopping.py; preference training: preference.py); option names follow OpenRLHF where it has
one (micro_train_batch_size, lr_warmup_ratio, max_norm, ...)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from asr_rl.config import RunConfig
from asr_rl.settings import setting
from asr_rl.rewards.config import RewardConfig
from asr_rl.data.augment import AugmentConfig
from asr_rl.data.mixture import check_one_dataset, check_paths_distinct, check_probs, split_paths
from asr_rl.data.readers import ReadingDataConfig
from asr_rl.data.signal_sampler import RLDataConfig
from asr_rl.trainer.configs.early_stopping import EarlyStoppingConfig
from asr_rl.trainer.configs.optim import AdamWConfig, OptimConfig
from asr_rl.trainer.configs.distributed import DistributedConfig  # noqa: F401 (re-exported)
from asr_rl.trainer.configs.model import EvalConfig, ModelConfig  # noqa: F401 (re-exported)


@dataclass(frozen=True)
class SFTConfig(EarlyStoppingConfig, RunConfig):
    """`asr-rl train sft`: supervised fine-tuning on a manifest; early stopping on dev with the
    `early_stopping_*` keys (trainer/run/early_stopping.py: `best/` keeps the best weights).

    Attributes:
        train_batch_size: utterances per optimiser step (global).
        micro_train_batch_size: utterances per forward/backward; the rest is gradient accumulation.
        optim: AdamW and its schedule over `max_steps` (trainer/update/strategy.py); SFT's defaults suit a
            model trained from scratch: learning rate 2e-3, weight decay 0.01, betas (0.9, 0.98),
            cosine floor 0.05.
        ctc_weight: weight of the auxiliary CTC loss on the encoder output; null = 0.5 when the
            encoder trains and off when it is frozen (CTC only trains the encoder).
        ctc_labels_per_frame: CTC slots each encoder frame predicts (the encoder is slower than speech).
        token_dropout: share of teacher-forced input tokens replaced by random ones (labels kept),
            which pushes a small decoder to listen instead of guessing from the text so far.
        data: the shared `data` section plus how `train_manifest` is read (data/readers `ReadOptions`).
    """

    train_batch_size: int = setting(16, ge=1)
    micro_train_batch_size: int = setting(16, ge=1)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(learning_rate=2e-3, weight_decay=0.01,
                                                                   adam_betas=(0.9, 0.98), min_lr_ratio=0.05))
    ctc_weight: float | None = setting(None, ge=0)
    ctc_labels_per_frame: int = setting(3, ge=1)
    token_dropout: float = setting(0.0, ge=0, lt=1)
    model: ModelConfig = field(default_factory=ModelConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    data: ReadingDataConfig = field(default_factory=ReadingDataConfig)

    def __post_init__(self) -> None:
        if self.train_batch_size % self.micro_train_batch_size:
            raise ValueError(f"train_batch_size {self.train_batch_size} is not a multiple of "
                             f"micro_train_batch_size {self.micro_train_batch_size}")
        self.check_early_stopping(self.eval_manifest, self.eval_steps)
        check_one_dataset(self.train_manifest, "SFT")


@dataclass(frozen=True)
class RolloutConfig:
    """Sampling a group of responses per prompt.

    Attributes:
        rollout_batch_size: prompts (utterances) per RL step, after dynamic filtering.
        n_samples_per_prompt: group size n.
        mode: `sample` (n samples at `temperature`) or `beam` (each utterance's beam-n N-best: deterministic,
            each hypothesis scored by the policy at `temperature`; for `policy_loss=mwer`). Beam needs an
            engine that declares it (`EngineSpec.beam_search`: hf; vLLM's takes no prompt embeddings).
        temperature: sampling temperature (the same one scales logits when scoring).
        top_p: nucleus sampling threshold (1.0 = off).
        top_k: top-k sampling (0 = off).
        max_new_tokens: response length limit.
        engine: the rollout engine, a name in `ROLLOUT_ENGINES` (trainer/rollout/engines.py): `hf` (the
            policy's own generate) or `vllm`; checked at load.
        dynamic_filtering: drop groups whose rewards all tie (zero advantage for every sample) and
            refill the batch (DAPO, arXiv:2503.14476); null = on for group estimators, off otherwise.
        dynamic_filtering_range: [low, high]: with dynamic filtering on, also drop the groups whose mean
            reward (over the sampled members) is not strictly inside (OpenRLHF
            `--algo.dynamic_filtering_range`, which reads the reward's scores; [0, 1] with 0/1 rewards
            is DAPO's filter). null = ties only.
        max_filter_rounds: extra sampling rounds to refill a filtered batch before training on fewer.
        max_oversample: with dynamic filtering, a round draws as many prompts as it predicts it needs to
            fill the batch after filtering (each prompt's chance of a group with signal, from the
            sampler's history and the share kept lately; trainer/rollout/refill.py), at most this many
            times the prompts it lacks; 1 = draw only what it lacks, and refill.
        async_enable: engine actors (`distributed.vllm_num_engines`, HF or vLLM) generate the next
            batches while the trainer updates (OpenRLHF `async_enable`); Ray only.
        async_queue_size: batches generated ahead: their samples are this many updates stale, which
            `algo.rollout_correction` corrects; 0 = on-policy, through the same actors.
        reference_in_group: each group gets the utterance's reference transcript as one more,
            off-policy member, scored like the samples (n + 1 rows a group); its loss is LUFFY's
            shaped, unclipped one (algos/off_policy.py, arXiv:2504.14945), no CE term. Audio only.
    """

    rollout_batch_size: int = setting(8, ge=1)
    n_samples_per_prompt: int = setting(8, ge=1)
    mode: Literal["sample", "beam"] = "sample"
    temperature: float = setting(1.0, gt=0, note="sampling; greedy decoding is asr-rl eval")
    top_p: float = setting(1.0, gt=0, le=1)
    top_k: int = setting(0, ge=0, note="0 = off")
    max_new_tokens: int = setting(64, ge=1)
    engine: str = "hf"
    dynamic_filtering: bool | None = None
    dynamic_filtering_range: tuple[float, ...] | None = None
    max_filter_rounds: int = setting(3, ge=0)
    max_oversample: float = setting(3.0, ge=1, note="1 = no over-sampling")
    async_enable: bool = False
    async_queue_size: int = setting(1, ge=0, le=8, note="samples more than a few updates stale train poorly")
    reference_in_group: bool = False

    def __post_init__(self) -> None:
        from asr_rl.trainer.rollout.engines import ROLLOUT_ENGINES  # checked at load, before any model loads

        ROLLOUT_ENGINES.check(self.engine)
        band = self.dynamic_filtering_range
        if band is not None and (len(band) != 2 or not band[0] < band[1]):
            raise ValueError(f"rollout.dynamic_filtering_range must be [low, high] with low < high, got {list(band)}")
        if self.mode == "beam" and not ROLLOUT_ENGINES.spec(self.engine).beam_search:
            raise ValueError(f"rollout.mode=beam needs an engine that returns the beam N-best (EngineSpec.beam_search: "
                             f"{', '.join(ROLLOUT_ENGINES.where(beam_search=True))}); rollout.engine={self.engine} "
                             "has none: use one of those, or rollout.mode=sample")

    @property
    def group_size(self) -> int:
        """Rows of a group in the experience: the n samples, and the reference when it joins."""
        return self.n_samples_per_prompt + int(self.reference_in_group)


@dataclass(frozen=True)
class AlgoConfig:
    """Advantages, policy loss and KL (OpenRLHF names).

    Attributes:
        advantage_estimator: gae | group_norm | dr_grpo | rloo | reinforce | reinforce_baseline | mwer
            (the rewards passed through to the mwer loss, which subtracts the group baseline).
        policy_loss: ppo (token ratio) | gspo (sequence ratio, sequence gradient) | gspo_token (sequence
            ratio, token gradient) | mwer (expected risk over each group's N-best, asr_rl/algos/mwer.py:
            whole groups per micro-batch, a seq-mean loss_agg_mode, sft_coef <= 0.1; checked at load).
        eps_clip: symmetric clip range of the ratio.
        eps_clip_low_high: asymmetric [low, high] clip range; overrides eps_clip when set.
        dual_clip: dual-clip constant c > 1 for negative advantages (null = off).
        loss_agg_mode: token-mean | seq-mean-token-mean | seq-mean-token-sum, of the policy loss; each
            a mean over the whole optimiser step (all micro-batches and ranks).
        kl_entropy_value_agg_mode: how the KL-loss, entropy and critic (value) terms aggregate:
            token-mean (OpenRLHF 0.11.2, whatever its policy loss's mode), or null = as
            `loss_agg_mode` (verl; the GRPO objective, arXiv:2402.03300 eq. 3, puts the KL term inside
            each sequence's 1/|o_i| mean, so a GRPO recipe from verl keeps its KL weighting).
        init_kl_coef: KL coefficient; a reward penalty, or a loss term when `use_kl_loss`.
        use_kl_loss: put KL in the loss (GRPO) instead of the reward.
        kl_estimator: k1 | k2 | k3.
        kl_target: adaptive KL controller target (null = fixed coefficient).
        kl_horizon: adaptive KL controller horizon.
        kl_unbiased_gradient: the KL-loss term keeps its estimator's value and takes the gradient
            w * k1 * grad(logp), w = pi / pi_old (at most 10): the unbiased gradient of KL(pi || ref)
            for tokens the old policy sampled, the same for every estimator (OpenRLHF
            `--algo.kl.unbiased_gradient`; algos/losses.py `kl_loss`).
        kl_clamp: bound on the per-token KL estimate, |kl| <= kl_clamp (OpenRLHF: 10); null = none.
        reward_clip_range: [low, high] the sequence rewards are clipped to before any advantage
            (OpenRLHF `--reward_clip_range`, default [-10, 10]); null = no clipping.
        overlong_buffer_len: DAPO's soft overlong punishment (arXiv:2503.14476; OpenRLHF
            `--reward.overlong_buffer_len`): a response longer than max_new_tokens - this many tokens
            loses min(excess, buffer) / buffer * `overlong_penalty_factor` of reward (an ASR output
            that loops until max_new_tokens loses the whole factor); null = off.
        overlong_penalty_factor: the largest overlong penalty.
        stop_properly_penalty_coef: ProRL's penalty on responses cut at max_new_tokens without EOS
            (arXiv:2505.24864; OpenRLHF `--reward.stop_properly_penalty_coef`): in [0, 1] their
            reward is multiplied by it, below 0 it replaces their reward; null = off.
        group_std_eps: added to the group std of "group_norm" (verl 1e-6; OpenRLHF 1e-9). A mean-only
            baseline (no std division) is the "dr_grpo" estimator.
        reward_aggregation: how the built-in reward terms combine before the advantage: "sum" (the
            weighted sum, then the estimator) or "normalize_then_sum" (each term normalised within
            its group, then the weighted sum: GDPO, TRL `multi_objective_aggregation`).
        rollout_correction: correct the rollout/trainer mismatch with per-token importance weights
            between the trainer's and the rollout engine's log-probs (trainer/rollout_correction.py):
            tis | icepop | token_mis | seq_mis | seq_mask_tis (gated on the ratio) | token_binary_kl |
            seq_binary_kl | token_tv | seq_tv (gated on a divergence); null = off (the mismatch is still
            logged as rollout_corr/kl). OpenRLHF 0.11.2 `--algo.advantage.is_correction_level/mode/
            gating` (docs/from-openrlhf.md maps each combination).
        rollout_correction_threshold: [low, high] of the correction (OpenRLHF
            `is_correction_threshold`, default [0.5, 5.0]); a divergence gate takes [0, high].
        entropy_coef: entropy bonus weight (0 = off).
        gamma: discount.
        lambd: GAE lambda.
        value_clip: critic value clip range (PPO).
        max_epochs: passes over each rollout's experience.
        normalize_gae_advantages: whiten GAE advantages over the batch (OpenRLHF does for gae).
        advantage_std_norm: the batch whitening of gae / reinforce / reinforce_baseline divides by
            the std; false = subtract the mean only (OpenRLHF `--algo.advantage.no_std_norm`).
        sft_coef: weight of the cross-entropy on each utterance's reference transcript, added to the
            policy loss (0 = pure RL). Sequence-level ASR training interpolates with CE for
            stability (MWER + CE, Prabhavalkar et al. 2018, arXiv:1712.01818); PPO-ptx does the same
            with pretraining data (Ouyang et al. 2022). Audio manifests only. A loss may cap it
            (`PolicyLossSpec.max_sft_coef`: mwer 0.1, the paper's interpolation; it uses 0.01).
        entropy_token_top_ratio: keep the policy gradient only on the top share of tokens by
            entropy in each micro-batch (Wang et al. 2025, arXiv:2506.01939: 0.2); 1.0 = off.
    """

    advantage_estimator: str = "group_norm"
    policy_loss: str = "ppo"
    eps_clip: float = setting(0.2, ge=0)
    eps_clip_low_high: tuple[float, ...] | None = setting(None, ge=0)
    dual_clip: float | None = setting(None, gt=1)
    loss_agg_mode: str = "token-mean"
    kl_entropy_value_agg_mode: str | None = "token-mean"
    init_kl_coef: float = setting(0.02, ge=0)
    use_kl_loss: bool = True
    kl_estimator: str = "k3"
    kl_target: float | None = setting(None, gt=0)
    kl_horizon: int = setting(10000, ge=1)
    kl_unbiased_gradient: bool = False
    kl_clamp: float | None = setting(10.0, gt=0)
    reward_clip_range: tuple[float, ...] | None = (-10.0, 10.0)
    overlong_buffer_len: float | None = setting(None, gt=0)
    overlong_penalty_factor: float = setting(1.0, ge=0)
    stop_properly_penalty_coef: float | None = setting(None, le=1)
    group_std_eps: float = setting(1e-6, gt=0)
    reward_aggregation: str = "sum"
    rollout_correction: str | None = None
    rollout_correction_threshold: tuple[float, ...] = setting((0.5, 5.0), ge=0)
    entropy_coef: float = 0.0
    gamma: float = setting(1.0, ge=0, le=1)
    lambd: float = setting(1.0, ge=0, le=1)
    value_clip: float = setting(0.2, gt=0)
    max_epochs: int = setting(1, ge=1)
    normalize_gae_advantages: bool = True
    advantage_std_norm: bool = True
    sft_coef: float = setting(0.0, ge=0)
    entropy_token_top_ratio: float = setting(1.0, gt=0, le=1, note="1.0 = every token")

    def __post_init__(self) -> None:
        # checked against the registries at load time, before any model loads
        from asr_rl.algos.advantages import ADVANTAGE_ESTIMATORS
        from asr_rl.algos.losses import KL_ESTIMATORS, LOSS_AGG_MODES, POLICY_LOSSES
        from asr_rl.algos.reward_shaping import REWARD_AGGREGATIONS
        from asr_rl.algos.rollout_correction import ROLLOUT_CORRECTIONS

        ADVANTAGE_ESTIMATORS.check(self.advantage_estimator)
        POLICY_LOSSES.check(self.policy_loss)
        KL_ESTIMATORS.check(self.kl_estimator)
        LOSS_AGG_MODES.check(self.loss_agg_mode)
        if self.kl_entropy_value_agg_mode is not None:
            LOSS_AGG_MODES.check(self.kl_entropy_value_agg_mode)
        REWARD_AGGREGATIONS.check(self.reward_aggregation)
        if self.rollout_correction is not None:
            ROLLOUT_CORRECTIONS.check(self.rollout_correction)
        t = self.rollout_correction_threshold
        if len(t) != 2 or not 0 <= t[0] < t[1]:
            raise ValueError(f"algo.rollout_correction_threshold must be [low, high] with 0 <= low < high, "
                             f"got {list(t)}")
        if self.rollout_correction and ROLLOUT_CORRECTIONS.spec(self.rollout_correction).upper_only and t[0] > 0:
            raise ValueError(f"algo.rollout_correction={self.rollout_correction} bounds a divergence from above only: "
                             f"set algo.rollout_correction_threshold=[0, {t[1]}] (e.g. [0, 0.01])")
        r = self.reward_clip_range
        if r is not None and (len(r) != 2 or not r[0] < r[1]):
            raise ValueError(f"algo.reward_clip_range must be [low, high] with low < high, got {list(r)}")

    @property
    def term_agg_mode(self) -> str:
        """The mode of the KL-loss, entropy and value terms (`kl_entropy_value_agg_mode`, resolved)."""
        return self.kl_entropy_value_agg_mode or self.loss_agg_mode

    @property
    def spec(self):
        """The advantage estimator's `AdvantageSpec` (what it needs: a critic, groups of n)."""
        from asr_rl.algos.advantages import advantage_spec

        return advantage_spec(self.advantage_estimator)

    @property
    def reward_spec(self):
        """The reward aggregation's `AggregationSpec` (whether it needs the terms one by one)."""
        from asr_rl.algos.reward_shaping import REWARD_AGGREGATIONS

        return REWARD_AGGREGATIONS.spec(self.reward_aggregation)


@dataclass(frozen=True)
class RLOptimConfig(AdamWConfig):
    """`optim` of RL: actor and critic share AdamW and the schedule (the shared section,
    trainer/update/strategy.py) over the run's optimiser steps, each with its own peak rate (OpenRLHF names).

    Attributes:
        micro_train_batch_size: sequences per forward/backward.
        train_batch_size: sequences per optimiser step; 0 = the whole rollout (one step per rollout).
        actor_learning_rate: policy learning rate.
        critic_learning_rate: critic learning rate (PPO).
    """

    micro_train_batch_size: int = setting(8, ge=1)
    train_batch_size: int = setting(0, ge=0, note="0 = the whole rollout")
    actor_learning_rate: float = setting(2e-4, gt=0)
    critic_learning_rate: float = setting(1e-3, gt=0)


@dataclass(frozen=True)
class RLConfig(RunConfig):
    """`asr-rl train grpo|ppo`: the RL loop (same loop on both backends).

    Attributes:
        train_manifest_probs: with several datasets in `train_manifest` (`a.jsonl,b.jsonl`), the
            probability each round's utterance comes from each (OpenRLHF's `prompt_data_probs`;
            data/mixture.py), e.g. `[0.7, 0.3]`: labelled home lines beside an unlabelled pool.
        critic_pretrain: starting weights of the critic (PPO with gae); default: `pretrain`.
        reward_pretrain: a reward model folder (`*ForSequenceClassification`) scoring prompt and response
            (the text path); when set it is the reward.
        freeze_critic_steps: train only the critic for this many first steps (PPO warm-up).
        augment: augmentation variants of the rollout audio (off by default); rollouts that hear
            noisy/reverberant audio too, as SFT did, keep RL from drifting away from robustness.
        data: the shared `data` section plus the utterance sampler (data/signal_sampler.py).
    """

    max_steps: int = setting(50, ge=1)
    save_steps: int = 25
    eval_steps: int = 25
    train_manifest_probs: list[float] | None = None
    critic_pretrain: str | None = None
    reward_pretrain: str | None = None
    freeze_critic_steps: int = setting(0, ge=0)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: RLOptimConfig = field(default_factory=RLOptimConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    augment: AugmentConfig = field(default_factory=lambda: AugmentConfig(spec_augment=False, noise_prob=0.0))
    data: RLDataConfig = field(default_factory=RLDataConfig)

    def __post_init__(self) -> None:
        n, b = self.rollout.n_samples_per_prompt, self.rollout.rollout_batch_size
        if self.algo.spec.grouped and n < 2:
            raise ValueError(f"advantage_estimator {self.algo.advantage_estimator} normalises within a group and "
                             f"needs n_samples_per_prompt >= 2, got {n}")
        g = self.rollout.group_size
        total, rows = g * b, "n_samples_per_prompt" if g == n else "(n_samples_per_prompt + the reference)"
        micro, train = self.optim.micro_train_batch_size, self.optim.train_batch_size or total
        if total % train:
            raise ValueError(f"rollout_batch_size x {rows} = {total} samples is not a multiple of "
                             f"train_batch_size {train}")
        if train % micro:
            what = (f"train_batch_size {train}" if self.optim.train_batch_size else
                    f"rollout_batch_size x {rows} = {b} x {g} = {total} samples (one optimiser step "
                    "per rollout: train_batch_size=0)")
            raise ValueError(f"{what} is not a multiple of micro_train_batch_size {micro}; change one of them")
        if self.algo.sft_coef > 0 and self.prompt_data:
            raise ValueError("algo.sft_coef trains on reference transcripts, which audio manifests carry and "
                             f"text prompt sets (prompt_data={self.prompt_data}) do not; set algo.sft_coef=0")
        if self.rollout.reference_in_group and self.prompt_data:
            raise ValueError("rollout.reference_in_group adds each utterance's reference transcript to its group; "
                             f"text prompt sets (prompt_data={self.prompt_data}) carry none")
        if self.algo.reward_spec.per_term and (self.reward.remote_url or self.reward.file or self.reward_pretrain):
            raise ValueError(f"algo.reward_aggregation={self.algo.reward_aggregation} combines the built-in terms by "
                             "their weights (reward.terms); a remote, file or model reward gives one score: use "
                             "reward_aggregation=sum")
        ranks = self.distributed.actor_num_nodes * self.distributed.actor_num_gpus_per_node
        if self.backend == "ray" and b % ranks:
            raise ValueError(f"rollout_batch_size {b} is not a multiple of the {ranks} policy ranks "
                             "(distributed.actor_num_nodes x actor_num_gpus_per_node): each rank trains on whole "
                             "groups in equal shares")
        r = self.rollout
        if r.async_enable and (self.backend != "ray" or (r.async_queue_size and not self.algo.rollout_correction)):
            raise ValueError("rollout.async_enable needs backend=ray (engine actors) and, with async_queue_size > 0, "
                             "algo.rollout_correction (e.g. tis) to correct for the stale samples")
        if r.async_enable and r.async_queue_size > max(1, self.max_steps - 1):
            raise ValueError(f"rollout.async_queue_size={r.async_queue_size} would generate batches that max_steps="
                             f"{self.max_steps} never trains on; use at most {max(1, self.max_steps - 1)}")
        if self.model.freeze_encoder is False:
            raise ValueError("RL keeps the audio encoder frozen (its states are computed once per utterance); "
                             "set model.freeze_encoder=true")
        self._check_filtering_and_length()
        if self.train_manifest and (self.train_manifest_probs or "," in self.train_manifest):
            check_paths_distinct(split_paths(self.train_manifest))
            check_probs(self.train_manifest_probs, len(split_paths(self.train_manifest)))
        from asr_rl.trainer.configs.group_loss import check_group_loss  # what a group loss (its spec) needs

        check_group_loss(self)

    def _check_filtering_and_length(self) -> None:
        """Settings that only mean something with another one, refused here rather than ignored or
        found after the model loads."""
        r, a = self.rollout, self.algo
        if r.dynamic_filtering_range is not None and not self.dynamic_filtering:
            raise ValueError(f"rollout.dynamic_filtering_range={list(r.dynamic_filtering_range)} filters groups, and "
                             "dynamic filtering is off (rollout.dynamic_filtering=false, or an estimator without "
                             "groups): set rollout.dynamic_filtering=true or drop the range")
        if a.overlong_buffer_len is not None and a.overlong_buffer_len > r.max_new_tokens:
            raise ValueError(f"algo.overlong_buffer_len={a.overlong_buffer_len:g} must be at most "
                             f"rollout.max_new_tokens={r.max_new_tokens}: the penalty starts that many tokens before "
                             "the limit")

    @property
    def dynamic_filtering(self) -> bool:
        if self.rollout.dynamic_filtering is None:
            return self.algo.spec.grouped
        return self.rollout.dynamic_filtering
