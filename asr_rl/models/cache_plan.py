"""How big a run's encoder cache will grow, logged before the first step, and a clear stop at the
start when its folder's disk cannot hold it (rather than a full disk hours into the run).

Size of one row: the prompt ids (int32: the text tokens plus one placeholder per audio frame) and
the audio states (frames x the encoder's width x the weights' element size). Frames grow linearly
with the duration (a fixed stride after a fixed prefix), so two dummy prompts, of 1 s and 5 s, give
the frames per second and the frames of an empty clip from the processor alone (the encoder does
not run). Rows per utterance: the clean audio plus the augmentation's variants. A missing duration
counts as the manifest's mean one. A run that draws fewer utterances than the corpus holds rows
(`max_steps` x utterances a step: a short run on a large corpus) can write no more rows than it
draws, so the plan is that share of the whole (rows of the average size).
"""
from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asr_rl.config import ConfigError
from asr_rl.models.facts import ModelFacts
from asr_rl.data.utterance_table import durations_of

log = logging.getLogger("asr_rl.train")

INDEX_LINE_BYTES = 200  # one JSON index line per row (key, offset, sizes)


@dataclass(frozen=True)
class CachePlan:
    """Attributes:
        folder: `model.encoder_cache` (None: RAM only).
        utterances, variants: the manifest's utterances, and rows per utterance.
        draws: the most utterances the run draws (None: no bound known).
        disk_bytes: the bytes of the rows the run can write: every row, or as many as it draws, and
            the dev set's.
        stored_bytes: what the folder holds already (rows of an earlier run).
        max_bytes: the RAM bound (`model.encoder_cache_max_gib`).
    """

    folder: Path | None
    utterances: int
    variants: int
    draws: int | None
    disk_bytes: int
    stored_bytes: int
    max_bytes: int
    eval_utterances: int = 0  # the dev rows evaluation writes too (in disk_bytes)

    @property
    def ram_bytes(self) -> int:
        """What the cache holds in RAM at most: its bound, or all its rows when fewer."""
        return min(self.max_bytes, self.disk_bytes)

    @property
    def rows(self) -> int:
        """Rows the run can write: every utterance's variants, or as many as it draws."""
        every = self.utterances * self.variants
        return every if self.draws is None else min(every, self.draws)

    def describe(self) -> str:
        rows = f"{self.utterances} utterances x {self.variants} variants"
        if self.rows < self.utterances * self.variants:
            rows += f", of which the run draws at most {self.rows}"
        if self.eval_utterances:
            rows += f", and {self.eval_utterances} evaluated"
        ram = f"RAM {size(self.ram_bytes)} (bound model.encoder_cache_max_gib={self.max_bytes / 2**30:g})"
        if self.folder is None:
            return f"encoder cache in RAM only: about {size(self.disk_bytes)} for {rows}; {ram}, rows past it are encoded again"
        return (f"encoder cache {self.folder}: about {size(self.disk_bytes)} on disk for {rows} "
                f"({size(self.stored_bytes)} there already); {ram}")


def size(n: int) -> str:
    """Bytes as GiB, or MiB under one GiB."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def plan_encoder_cache(pretrain: ModelFacts | str | os.PathLike, model_cfg, utts: list, augment, sample_rate: int,
                       draws: int | None = None, eval_utts: list = ()) -> CachePlan:
    """The cache size for `utts` (manifest rows) encoded by the model in `pretrain` (a folder, or
    its `ModelFacts`), with the run's `model` and `augment` settings, for a run that draws at most
    `draws` utterances, plus the rows of `eval_utts` (the dev set the run evaluates: clean audio,
    one row each)."""
    facts = ModelFacts.of(pretrain)
    config, spec, processor = facts.config, facts.spec, facts.processor
    language = next((u.language for u in utts if u.language), None)
    shapes = [_prompt_shape(spec, processor, config, language, model_cfg.force_language, sample_rate, s)
              for s in (1.0, 5.0)]
    per_second = (shapes[1][0] - shapes[0][0]) / 4.0
    empty, text_tokens = shapes[0][0] - per_second, shapes[0][1]
    elem = 2 if model_cfg.dtype == "bfloat16" else 4

    def pass_bytes(rows) -> float:  # one row of each utterance of `rows`
        durations = durations_of(rows)  # the index's: no row decoded (a packed table's column)
        known = durations[durations > 0]
        mean = float(known.mean()) if len(known) else 30.0
        frames = float(np.sum(empty + per_second * np.where(durations > 0, durations, mean)))
        return frames * (spec.encoder_width(config) * elem + 4) + len(rows) * (4 * text_tokens + INDEX_LINE_BYTES)

    variants = _rows_per_utterance(augment)
    folder = Path(model_cfg.encoder_cache) if model_cfg.encoder_cache else None
    stored = sum(p.stat().st_size for p in folder.glob("*.bin")) if folder is not None and folder.is_dir() else 0
    share = 1.0 if draws is None else min(1.0, draws / max(1, len(utts) * variants))
    disk = pass_bytes(utts) * variants * share + (pass_bytes(eval_utts) if len(eval_utts) else 0.0)
    return CachePlan(folder, len(utts), variants, draws, int(disk), stored, int(model_cfg.encoder_cache_max_gib * 2**30),
                     len(eval_utts))


def _prompt_shape(spec, processor, config, language, force_language: bool, sample_rate: int,
                  seconds: float) -> tuple[int, int]:
    """(audio frames, text tokens) of the prompt of a silent clip of `seconds`."""
    wav = np.zeros(int(seconds * sample_rate), dtype=np.float32)
    prompts = spec.prepare(processor, [wav], [language], force_language, sample_rate, [()])
    frames = int(spec.audio_positions(config, prompts.input_ids).sum())
    return frames, int(prompts.attention_mask.sum()) - frames


def _rows_per_utterance(augment) -> int:
    """The clean audio plus each waveform variant; with `variants=0` a fresh variant every epoch:
    counted as one (the cache then grows by a row per utterance and epoch)."""
    if not augment.waveform_active:
        return 1
    return 1 + max(augment.variants, 1)


def check_encoder_cache(plan: CachePlan) -> None:
    """Log the plan; a clear error when the folder's filesystem lacks the space still needed."""
    log.info("%s", plan.describe())
    if plan.folder is None:
        return
    needed = max(0, plan.disk_bytes - plan.stored_bytes)  # stale shards it replaces free their own space
    where = plan.folder
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    if needed > free:
        raise ConfigError(
            f"the encoder cache needs about {size(needed)} more disk in {plan.folder} "
            f"({plan.rows} rows of {plan.utterances} utterances x {plan.variants} variants, {size(plan.disk_bytes)} in all) "
            f"and its filesystem has {size(free)} free: point model.encoder_cache at a larger disk, or "
            "turn the folder off with model.encoder_cache=null (states then stay in RAM only, up to "
            "model.encoder_cache_max_gib, and are encoded again past it)")


def prepare_encoder_cache(pretrain, model_cfg, utts: list, augment, sample_rate: int,
                          draws: int | None = None, eval_manifest: str | None = None, eval_max: int = 0) -> CachePlan:
    """`plan_encoder_cache`, with the first `eval_max` (0: all) lines of `eval_manifest`, checked
    against the disk and logged: before the first step."""
    plan = plan_encoder_cache(pretrain, model_cfg, utts, augment, sample_rate, draws,
                              eval_lines(eval_manifest, eval_max))
    check_encoder_cache(plan)
    return plan


def eval_lines(eval_manifest: str | None, eval_max: int = 0) -> list:
    """The first `eval_max` (0: all) lines of `eval_manifest` (none without one): the dev rows a
    run's evaluation encodes."""
    if not eval_manifest:
        return []
    from asr_rl.data.manifest import scan_manifest

    utts = scan_manifest(eval_manifest, check_audio=False, text_needed_by=None).utterances
    return utts[:eval_max] if eval_max else utts


__all__ = ["CachePlan", "plan_encoder_cache", "check_encoder_cache", "prepare_encoder_cache", "eval_lines"]
