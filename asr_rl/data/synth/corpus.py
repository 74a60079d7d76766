"""`synthesize_corpus`: the offline bilingual demo corpus behind `asr-rl data synth`.

Steps: validate the request -> reuse a matching corpus already in `out_dir`, or refuse a different
one -> plan one job per utterance -> render them in a process pool into a temp folder beside
`out_dir` -> write manifests and corpus.json -> rename the temp folder into place. Each utterance
draws everything (sentence, voice, noise, level) from its own RNG seeded by (seed, split, index), so
the corpus is byte-identical whatever the number of workers or the order they finish in.
"""
from __future__ import annotations

import json
import logging
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
from tqdm.auto import tqdm

from asr_rl.data.synth import augment, tts
from asr_rl.data.synth.contexts import add_contexts
from asr_rl.data.synth.nonspeech import render_clip
from asr_rl.data.synth.sentence import utterance_rng
from asr_rl.data.synth.grammar_en import sample_english
from asr_rl.data.synth.grammar_zh import sample_mandarin
from asr_rl.data.synth.voices import sample_voice
from asr_rl.utils import atomic_write_text, umasked, write_jsonl

logger = logging.getLogger(__name__)

# Bump when a change to the grammar, voices or audio processing changes the output for a given
# seed, so that an old corpus is reported as different instead of silently reused.
CORPUS_VERSION = 1
META_NAME = "corpus.json"
SAMPLERS = {"en": sample_english, "zh": sample_mandarin}
SUPPORTED_LANGUAGES = tuple(SAMPLERS)


@dataclass(frozen=True)
class SplitSpec:
    """A manifest to produce: which voice group speaks it, how many utterances, which corruption."""

    name: str
    voice_group: str
    size_param: str  # "n_train" | "n_test"
    noisy: bool = False
    english_only: bool = False  # the held-out-accent set exists only for English


SPLITS = (
    SplitSpec("train", "train", "n_train"),
    SplitSpec("dev", "dev", "n_test"),
    SplitSpec("test_clean", "test", "n_test"),
    SplitSpec("test_noisy", "test", "n_test", noisy=True),
    SplitSpec("test_accent", "accent", "n_test", english_only=True),
)


@dataclass(frozen=True)
class Job:
    """Everything a worker needs to render one utterance (picklable, no shared state)."""

    root: str
    seed: int
    split: str
    index: int
    language: str
    voice_group: str
    noisy: bool
    nonspeech: bool = False  # a clip where nobody speaks, labelled "" (synth/nonspeech.py)


def synthesize_corpus(out_dir: str | os.PathLike, langs: Iterable[str] | str = ("en", "zh"),
                      n_train: int = 200, n_test: int = 40, seed: int = 1,
                      workers: int | None = None, progress: bool = True,
                      context_sizes: Iterable[int] = (), n_nonspeech: int = 0) -> dict[str, dict]:
    """Synthesise (or reuse) the demo corpus in `out_dir`.

    Writes `wavs/<split>/<id>.wav` (16 kHz mono 16-bit), one `<split>.jsonl` manifest per split
    (train, dev, test_clean, test_noisy, and test_accent when English is included) and corpus.json.
    With `context_sizes` (e.g. 0, 10, 100), training lines carry context lists of those sizes and
    every other split gets a copy per size > 0 with lists of that size (synth/contexts.py).
    With `n_nonspeech`, train also holds that many clips where nobody speaks, labelled `""`: the
    model is taught to write nothing there (the supervised control for a reward that hears silence).

    Returns:
        {split: {"utterances": int, "hours": float, "manifest": absolute path}}.

    Raises:
        ValueError: bad arguments (unknown language, n_train < 1, ...).
        FileExistsError: `out_dir` holds something other than this exact corpus.
        RuntimeError: espeak-ng or flite is missing or fails.
    """
    params = corpus_params(langs, n_train, n_test, seed, context_sizes, n_nonspeech)
    workers = check_workers(workers)
    out_dir = Path(out_dir).expanduser().absolute()
    existing = existing_summary(out_dir, params)
    if existing is not None:
        logger.info("reusing the corpus already in %s (same parameters)", out_dir)
        return existing
    tts.check_tools(params["langs"])

    def build(tmp: Path) -> dict[str, dict]:
        rows = render_all(plan_jobs(params, root=str(tmp)), workers, progress)
        if params.get("context_sizes"):
            rows = add_contexts(rows, params["context_sizes"], params["seed"])
        return _write_outputs(tmp, params, rows)

    return _absolute_summary(out_dir, build_atomically(out_dir, build))


def build_atomically(out_dir: Path, build: Callable[[Path], dict[str, dict]]) -> dict[str, dict]:
    """Run `build(tmp)` in a temp folder beside `out_dir`, then rename it into place; nothing is
    left behind if it fails. Returns what `build` returns (the corpus's splits)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    os.chmod(tmp, umasked(0o777))  # mkdtemp makes it private; the corpus is meant to be shared
    start = time.time()
    try:
        splits = build(tmp)
        move_into_place(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    count = sum(s["utterances"] for s in splits.values())
    logger.info("synthesised %s (%d manifest lines) in %.1f s", out_dir, count, time.time() - start)
    return splits


def corpus_params(langs: Iterable[str] | str, n_train: int, n_test: int, seed: int,
                  context_sizes: Iterable[int] = (), n_nonspeech: int = 0) -> dict:
    """Validated, canonical generation parameters (what corpus.json records and reruns compare);
    `context_sizes` and `n_nonspeech` only when given, so corpora made without them keep their parameters."""
    languages = parse_languages(langs)
    for name, value, minimum in (("n_train", n_train, 1), ("n_test", n_test, 1), ("seed", seed, 0),
                                 ("n_nonspeech", n_nonspeech, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    sizes = sorted(set(context_sizes))
    if any(isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0 for n in sizes):
        raise ValueError(f"context sizes must be integers >= 0, got {list(context_sizes)!r}")
    return {"version": CORPUS_VERSION, "langs": list(languages), "n_train": int(n_train),
            "n_test": int(n_test), "seed": int(seed), **({"context_sizes": [int(n) for n in sizes]} if sizes else {}),
            **({"n_nonspeech": int(n_nonspeech)} if n_nonspeech else {})}


def parse_languages(langs: Iterable[str] | str) -> tuple[str, ...]:
    """Accept ("en", "zh") or "en,zh"; return them deduplicated in canonical order, so that
    zh,en and en,zh name the same corpus."""
    items = langs.split(",") if isinstance(langs, str) else list(langs)
    codes = {str(code).strip().lower() for code in items} - {""}
    unknown = sorted(codes - set(SUPPORTED_LANGUAGES))
    if unknown:
        raise ValueError(f"unknown language code(s) {', '.join(unknown)}; supported: "
                         f"{', '.join(SUPPORTED_LANGUAGES)}")
    if not codes:
        raise ValueError(f"no language given; supported: {', '.join(SUPPORTED_LANGUAGES)}")
    return tuple(code for code in SUPPORTED_LANGUAGES if code in codes)


def plan_jobs(params: dict, root: str) -> list[Job]:
    """One job per utterance; languages alternate by index so every split is balanced."""
    langs = params["langs"]
    jobs = []
    for spec in SPLITS:
        if spec.english_only and "en" not in langs:
            continue
        split_langs = ("en",) if spec.english_only else langs
        for index in range(params[spec.size_param]):
            jobs.append(Job(root, params["seed"], spec.name, index, split_langs[index % len(split_langs)],
                            spec.voice_group, spec.noisy))
    jobs += [Job(root, params["seed"], "train", i, langs[i % len(langs)], "train", False, nonspeech=True)
             for i in range(params.get("n_nonspeech", 0))]
    return jobs


def render_utterance(job: Job) -> dict:
    """Draw the sentence and voice, synthesise, corrupt if noisy, write the WAV; return its manifest row."""
    if job.nonspeech:
        return _render_nonspeech(job)
    rng = utterance_rng(job.seed, job.split, job.index)
    sentence = SAMPLERS[job.language](rng)
    voice = sample_voice(job.voice_group, job.language, rng)
    audio = tts.synthesize(voice, sentence.speak).astype(np.float64)
    extra: dict = {}
    if job.noisy:
        audio, extra = augment.corrupt(audio, rng, tts.SAMPLE_RATE)
    # A random level per utterance so that loudness is no cue; the peak stays below clipping.
    audio = augment.set_peak(audio, float(rng.uniform(0.3, 0.9)))
    uid = f"{job.split}-{job.index:06d}-{job.language}"
    rel = f"wavs/{job.split}/{uid}.wav"
    pcm = np.round(audio * 32767.0).astype(np.int16)
    sf.write(os.path.join(job.root, rel), pcm, tts.SAMPLE_RATE, subtype="PCM_16")
    return {"id": uid, "audio": rel, "text": sentence.text, "language": sentence.language,
            "keywords": list(sentence.keywords), "duration": round(pcm.size / tts.SAMPLE_RATE, 3),
            "speaker": voice.id, "accent": voice.accent, **extra}


def _render_nonspeech(job: Job) -> dict:
    """A training clip where nobody speaks (a stream of its own: the speech lines stay as they were)."""
    audio, extra = render_clip(job.index, utterance_rng(job.seed, f"{job.split}/nonspeech", job.index), tts.SAMPLE_RATE)
    uid = f"{job.split}-nonspeech-{job.index:06d}-{job.language}"
    rel = f"wavs/{job.split}/{uid}.wav"
    pcm = np.round(audio * 32767.0).astype(np.int16)
    sf.write(os.path.join(job.root, rel), pcm, tts.SAMPLE_RATE, subtype="PCM_16")
    return {"id": uid, "audio": rel, "text": "", "language": job.language, "keywords": [],
            "duration": round(pcm.size / tts.SAMPLE_RATE, 3), "speaker": "nonspeech", **extra}


def render_all(jobs: list, workers: int, progress: bool, render: Callable[..., dict] | None = None
               ) -> dict[str, list[dict]]:
    """Render every job with `render` (default `render_utterance`; a module-level function, so a
    process pool can pickle it) in a process pool when workers > 1; rows grouped by split, in job
    order. A job needs `root` and `split`."""
    for root, split in {(j.root, j.split) for j in jobs}:
        Path(root, "wavs", split).mkdir(parents=True, exist_ok=True)
    rows: dict[str, list[dict]] = {}
    bar = tqdm(total=len(jobs), desc="synth", unit="utt", disable=not progress)
    try:
        for job, row in zip(jobs, _map(jobs, min(workers, len(jobs)), render or render_utterance)):
            rows.setdefault(job.split, []).append(row)
            bar.update()
    finally:
        bar.close()
    return rows


def _map(jobs: list, workers: int, render: Callable[..., dict]) -> Iterator[dict]:
    if workers <= 1:
        yield from map(render, jobs)
        return
    # forkserver: fork() from a process that may already run threads (torch, tqdm) can deadlock.
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("forkserver"))
    try:
        yield from pool.map(render, jobs, chunksize=max(1, min(16, len(jobs) // (8 * workers))))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def existing_summary(out_dir: Path, params: dict) -> dict | None:
    """The summary of a matching corpus in `out_dir`; None if `out_dir` is missing or empty.
    Anything else in it is an error: we never write into or over someone else's folder."""
    if not out_dir.exists():
        return None
    if not out_dir.is_dir():
        raise FileExistsError(f"{out_dir} exists and is not a folder; choose another --out.")
    meta_path = out_dir / META_NAME
    if not meta_path.is_file():
        if any(out_dir.iterdir()):
            raise FileExistsError(
                f"{out_dir} is not empty and has no {META_NAME}, so it is not a corpus made by "
                f"`asr-rl data synth`; refusing to write into it. Choose another --out, or delete "
                f"the folder if you do not need its contents.")
        return None
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        old, splits = meta["params"], meta["splits"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise FileExistsError(f"{meta_path} cannot be read ({err!r}); delete {out_dir} and rerun, "
                              f"or choose another --out.") from err
    # a source corpus records no domain (it predates the target domain)
    keys = [*params, *(["domain"] if "domain" not in params else [])]
    diffs = [f"{k}: existing {_param(old, k)!r}, requested {_param(params, k)!r}" for k in keys
             if _param(old, k) != _param(params, k)]
    if diffs:
        raise FileExistsError(
            f"{out_dir} already holds a different synthetic corpus ({'; '.join(diffs)}). Choose "
            f"another --out, or delete {out_dir} to regenerate it with the new parameters.")
    missing = [s["manifest"] for s in splits.values() if not (out_dir / s["manifest"]).is_file()]
    if missing:
        raise FileExistsError(f"{out_dir} holds this corpus but {', '.join(missing)} is missing; "
                              f"delete {out_dir} and rerun.")
    return _absolute_summary(out_dir, splits)


def _param(params: dict, key: str):
    return params.get(key, "source" if key == "domain" else None)


def _write_outputs(root: Path, params: dict, rows: dict[str, list[dict]]) -> dict[str, dict]:
    splits = {}
    for split, split_rows in rows.items():
        write_jsonl(root / f"{split}.jsonl", split_rows)
        os.chmod(root / f"{split}.jsonl", umasked(0o666))  # atomic writes go through private files
        hours = sum(r["duration"] for r in split_rows) / 3600.0
        splits[split] = {"utterances": len(split_rows), "hours": round(hours, 4),
                         "manifest": f"{split}.jsonl"}
    meta = {"generator": "asr_rl.data.synth", "params": params, "sample_rate": tts.SAMPLE_RATE,
            "splits": splits,
            "voice_groups": {s.name: s.voice_group for s in SPLITS if s.name in splits},
            "speakers": {s: len({r["speaker"] for r in rs}) for s, rs in rows.items()}}
    # Written last: a folder with corpus.json is a finished corpus.
    atomic_write_text(root / META_NAME, json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    os.chmod(root / META_NAME, umasked(0o666))
    return splits


def move_into_place(tmp: Path, out_dir: Path) -> None:
    # rename(2) replaces an empty folder atomically and refuses a non-empty one, so a folder that
    # got filled meanwhile is never overwritten.
    try:
        os.replace(tmp, out_dir)
    except OSError as err:
        raise FileExistsError(f"{out_dir} was created or filled by something else while the corpus "
                              f"was being made; it was left untouched. Choose another --out, or "
                              f"delete it and rerun.") from err


def _absolute_summary(out_dir: Path, splits: dict[str, dict]) -> dict[str, dict]:
    return {name: {"utterances": s["utterances"], "hours": s["hours"],
                   "manifest": str(out_dir / s["manifest"])} for name, s in splits.items()}


def check_workers(workers: int | None) -> int:
    if workers is None:
        return os.cpu_count() or 1
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer or None (all cores), got {workers!r}")
    return workers
