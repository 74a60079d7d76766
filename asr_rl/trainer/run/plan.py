"""`RunPlan`: an audio RL run's start-up facts, gathered once, and its pre-flight checks as
functions of (config, plan), run in one straight line before any model loads.

The facts: the `pretrain` folder's (`models.facts.ModelFacts`: its config, family, tokenizer,
prompt positions) and the data's (the utterance table of `train_manifest`'s datasets and each
dataset's size, how many lines are unlabelled, the longest prompt, the dev lines evaluation
encodes, the encoder cache's plan). Each is gathered the first time a check asks for it and kept,
so no check re-derives what another knew, and the checks still fail in the order `PREFLIGHT` lists,
each with its own message.
"""
from __future__ import annotations

import dataclasses
from functools import cached_property

from asr_rl.models.facts import ModelFacts


class RunPlan:
    """The facts of the run `cfg` (an `RLConfig` with `train_manifest`), each read when first asked for."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.model = ModelFacts(cfg.pretrain)

    @cached_property
    def datasets(self) -> tuple:
        """(the utterances of `train_manifest`'s datasets, each dataset's size): `read_datasets`."""
        return read_datasets(self.cfg)

    @property
    def utts(self):
        return self.datasets[0]

    @property
    def sizes(self) -> list[int]:
        return self.datasets[1]

    @cached_property
    def unlabelled(self) -> tuple[int, str | None]:
        """(how many lines have no `text`, how the first is named)."""
        from asr_rl.rewards.pipeline import count_unlabelled

        return count_unlabelled(self.utts)

    @cached_property
    def longest(self):
        """The memory estimate's prompt: `longest_prompt` of the run's lines."""
        return longest_prompt(self.utts)

    @cached_property
    def cache(self):
        """The encoder cache's `CachePlan`: every row the run can draw, and the dev rows it evaluates."""
        from asr_rl.models.cache_plan import eval_lines, plan_encoder_cache

        cfg = self.cfg
        return plan_encoder_cache(self.model, cfg.model, self.utts, cfg.augment, cfg.data.sample_rate,
                                  draws=cfg.max_steps * cfg.rollout.rollout_batch_size,
                                  eval_utts=eval_lines(cfg.eval_manifest, cfg.eval.eval_max_samples))


def read_datasets(cfg):
    """The utterances of `train_manifest`'s datasets (`a.jsonl,b.jsonl`: one after another in one
    packed table) and each dataset's size."""
    from asr_rl.data.manifest import read_manifest
    from asr_rl.data.mixture import split_paths
    from asr_rl.data.utterance_table import UtteranceTable

    data = cfg.data
    parts = [read_manifest(p, min_duration=data.min_duration, max_duration=data.max_duration, text_needed_by=None,
                           options=data, trust_durations=True)
             for p in split_paths(cfg.train_manifest)]
    if len(parts) == 1:
        return parts[0], [len(parts[0])]
    table = UtteranceTable()
    for part in parts:
        for u in part:
            table.append(u)
    return table, [len(p) for p in parts]


def longest_prompt(utts):
    """An utterance whose prompt is at least as long as any of `utts`': the longest audio with the
    longest context list (the memory estimate's prompt length)."""
    from asr_rl.data.utterance_table import context_chars_of, durations_of

    # from the index's columns: two rows decoded, not all of them (the same picks as max() over the
    # rows: the first longest; a list's characters order lists as their ", "-joined lengths do)
    longest = utts[int(durations_of(utts).argmax())]
    return dataclasses.replace(longest, context=utts[int(context_chars_of(utts).argmax())].context)


def require_manifest(cfg, plan: RunPlan) -> None:
    if not cfg.train_manifest:
        raise ValueError("`train_manifest` is not set; pass train_manifest=PATH (or prompt_data=PATH for text)")


def check_unlabelled(cfg, plan: RunPlan) -> None:
    """Unlabelled lines (no `text`) train under a reward that needs no transcript; what else reads
    the transcripts refuses them, naming the setting and the first such line."""
    from asr_rl.rewards.pipeline import check_reward_coverage

    n_unlabelled, first = plan.unlabelled
    if not n_unlabelled:
        return
    for key, on in (("rollout.reference_in_group", cfg.rollout.reference_in_group), ("algo.sft_coef", cfg.algo.sft_coef > 0)):
        if on:
            raise ValueError(f"train_manifest: {key} needs each line's transcript and {first} has none "
                             f"({n_unlabelled} of {len(plan.utts)} lines are unlabelled); turn it off for unlabelled audio")
    check_reward_coverage(cfg.reward, plan.utts, unlabelled=plan.unlabelled)


def check_writable(cfg, plan: RunPlan) -> None:
    """A reference the model cannot write caps its reward whatever it learns (and is a CE target)."""
    from asr_rl.models.tokenizer import require_writable

    require_writable(plan.utts, plan.model.tokenizer)


def check_prompts_fit(cfg, plan: RunPlan) -> None:
    from asr_rl.models.tokenizer import require_prompts_fit

    require_prompts_fit(plan.utts, plan.model.tokenizer, plan.model.prompt_limit, cfg.rollout.max_new_tokens,
                        "train_manifest")


def check_cache(cfg, plan: RunPlan) -> None:
    """The cache's size logged; a stop now when its folder's disk cannot hold it."""
    from asr_rl.models.cache_plan import check_encoder_cache

    check_encoder_cache(plan.cache)


PREFLIGHT = (require_manifest, check_unlabelled, check_writable, check_prompts_fit, check_cache)


def preflight(cfg, plan: RunPlan) -> None:
    """Every check of `PREFLIGHT`, in its order: the first that fails stops the run before any model loads."""
    for check in PREFLIGHT:
        check(cfg, plan)


__all__ = ["RunPlan", "PREFLIGHT", "preflight", "read_datasets", "longest_prompt"]
