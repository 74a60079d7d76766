"""`synthesize_target`: a target domain the SFT never heard, behind `asr-rl data synth --domain target`.

The source corpus (corpus.py) trains the SFT. The target domain is what the deployed model meets
next: English in the two held-out accents (en-029, en-gb-scotland) and Mandarin, spoken by espeak-ng
variants no source group uses (voices.py `TARGET_GROUPS`: one group each for the pool, dev and test,
disjoint), over a telephone line (augment.py `telephone`), in new sentences of the same grammars
(streams named `target/<split>`, which no source split uses); the languages alternate line by line.
It is written as

- pool.jsonl: the unlabelled pool as a deployment would log it: lines without `text` or `keywords`
  (nothing of the transcript), and about `POOL_NONSPEECH_SHARE` of them clips where nobody speaks,
  unmarked (the same fields and channel as speech: only listening tells them apart);
- pool_transcripts.jsonl (`{"id", "text"}` a line, kept aside) and pool_labelled.jsonl (the same
  lines with their text, `""` where nobody speaks, and keywords) for the labelled arms and for checking;
- dev.jsonl, test.jsonl: with transcripts;
- nonspeech.jsonl: clips where nobody speaks (`"text": ""`, `kind` says what it is; nonspeech.py);
- corpus.json: the parameters and a summary.

Each speech line also carries `entities`: the app's entity list for it (the user's contacts, rooms
and devices: the line's own entity words and distractors of the same kinds, `ENTITY_LIST_SIZE`
items), which a reward may read; it is not the `context` field, which goes into the prompt.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from asr_rl.data.synth import augment, tts
from asr_rl.data.synth.contexts import context_list
from asr_rl.data.synth.corpus import META_NAME, build_atomically, check_workers, existing_summary, render_all
from asr_rl.data.synth.grammar_en import sample_english
from asr_rl.data.synth.grammar_zh import sample_mandarin
from asr_rl.data.synth.nonspeech import render_clip
from asr_rl.data.synth.sentence import utterance_rng
from asr_rl.data.synth.voices import sample_voice
from asr_rl.utils import atomic_write_text, umasked, write_jsonl

# Bump when a change alters the output for given parameters (as corpus.py's CORPUS_VERSION).
TARGET_VERSION = 2  # 2: Mandarin lines, unmarked non-speech in the pool, no keywords there
ENTITY_LIST_SIZE = 10
TRANSCRIPTS_NAME = "pool_transcripts.jsonl"
POOL_NONSPEECH_SHARE = 0.1
POOL_FIELDS = ("id", "audio", "language", "entities", "channel", "duration")  # what a logged line carries


@dataclass(frozen=True)
class TargetSplit:
    """A manifest of the target domain: its voice group (None: non-speech) and size parameter."""

    name: str
    voice_group: str | None
    size_param: str


TARGET_SPLITS = (
    TargetSplit("pool", "target_pool", "n_pool"),
    TargetSplit("dev", "target_dev", "n_test"),
    TargetSplit("test", "target_test", "n_test"),
    TargetSplit("nonspeech", None, "n_nonspeech"),
)


@dataclass(frozen=True)
class TargetJob:
    """One line to render (picklable): `split` names the manifest and the folder of its WAV."""

    root: str
    seed: int
    split: str
    index: int
    voice_group: str | None
    language: str = "en"
    nonspeech_share: float = 0.0  # the pool: lines where nobody speaks, unmarked


def synthesize_target(out_dir: str | os.PathLike, n_pool: int = 200, n_test: int = 40, n_nonspeech: int = 150,
                      seed: int = 1, workers: int | None = None, progress: bool = True,
                      langs: tuple[str, ...] = ("en", "zh")) -> dict[str, dict]:
    """Synthesise (or reuse) the target domain in `out_dir` (see the module docstring); `langs`:
    the languages its speech lines alternate through.

    Returns:
        {name: {"utterances": int, "hours": float, "manifest": absolute path}} for pool,
        pool_labelled, dev, test, nonspeech and the pool's transcripts file.

    Raises:
        ValueError: bad arguments. FileExistsError: `out_dir` holds something else.
        RuntimeError: espeak-ng is missing or fails.
    """
    params = target_params(n_pool, n_test, n_nonspeech, seed, langs)
    workers = check_workers(workers)
    out_dir = Path(out_dir).expanduser().absolute()
    splits = existing_summary(out_dir, params)
    if splits is None:
        tts.check_tools(())  # espeak-ng only: no target voice is flite's

        def build(tmp: Path) -> dict[str, dict]:
            rows = render_all(plan_target_jobs(params, str(tmp)), workers, progress, render=render_target_job)
            return write_target_outputs(tmp, params, rows)

        splits = build_atomically(out_dir, build)
        splits = {name: dict(s, manifest=str(out_dir / s["manifest"])) for name, s in splits.items()}
    transcripts = out_dir / TRANSCRIPTS_NAME
    if not transcripts.is_file():
        raise FileExistsError(f"{out_dir} holds this target domain but {transcripts} is missing; delete "
                              f"{out_dir} and rerun.")
    return {**splits, "pool_transcripts": dict(splits["pool"], manifest=str(transcripts))}


def target_params(n_pool: int, n_test: int, n_nonspeech: int, seed: int, langs=("en", "zh")) -> dict:
    """Validated parameters, as corpus.json records them and a rerun compares them."""
    for name, value, minimum in (("n_pool", n_pool, 1), ("n_test", n_test, 1), ("n_nonspeech", n_nonspeech, 0),
                                 ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    from asr_rl.data.synth.corpus import parse_languages

    return {"version": TARGET_VERSION, "domain": "target", "langs": list(parse_languages(langs)), "n_pool": int(n_pool),
            "n_test": int(n_test), "n_nonspeech": int(n_nonspeech), "seed": int(seed),
            "pool_nonspeech_share": POOL_NONSPEECH_SHARE}


def plan_target_jobs(params: dict, root: str) -> list[TargetJob]:
    langs, share = params["langs"], params["pool_nonspeech_share"]
    return [TargetJob(root, params["seed"], spec.name, index, spec.voice_group, langs[index % len(langs)],
                      share if spec.name == "pool" else 0.0)
            for spec in TARGET_SPLITS for index in range(params[spec.size_param])]


def render_target_job(job: TargetJob) -> dict:
    """Render one line: speech by a target voice over the phone, or a non-speech clip; write its
    WAV and return its manifest row (with `text`; the pool's is taken off when it is written)."""
    # "target/<split>": a stream no source split draws from, whatever the seed
    rng = utterance_rng(job.seed, f"target/{job.split}", job.index)
    silent = job.nonspeech_share > 0 and utterance_rng(job.seed, "target/pool/silent", job.index).random() < job.nonspeech_share
    if job.voice_group is None:
        audio, row = _nonspeech_row(job, rng)
    elif silent:
        audio, row = _silent_pool_row(job, rng)
    else:
        audio, row = _speech_row(job, rng)
    rel = f"wavs/{job.split}/{row['id']}.wav"
    pcm = np.round(audio * 32767.0).astype(np.int16)
    sf.write(os.path.join(job.root, rel), pcm, tts.SAMPLE_RATE, subtype="PCM_16")
    return {"id": row.pop("id"), "audio": rel, **row, "duration": round(pcm.size / tts.SAMPLE_RATE, 3)}


def _speech_row(job: TargetJob, rng: np.random.Generator) -> tuple[np.ndarray, dict]:
    lang = job.language
    sentence = sample_english(rng) if lang == "en" else sample_mandarin(rng)
    voice = sample_voice(job.voice_group, lang, rng)
    audio = tts.synthesize(voice, sentence.speak).astype(np.float64)
    # The level is set before the line (its hiss and coding noise are absolute); the band-pass can
    # overshoot a little, so the peak is capped afterwards.
    audio, extra = augment.telephone(augment.set_peak(audio, float(rng.uniform(0.3, 0.9))), tts.SAMPLE_RATE, rng)
    audio = augment.set_peak(audio, min(float(np.max(np.abs(audio))), 0.99))
    entities = context_list(list(sentence.keywords), lang, ENTITY_LIST_SIZE,
                            utterance_rng(job.seed, f"target/{job.split}/entities", job.index), omit_prob=0.0)
    return audio, {"id": f"target-{job.split}-{job.index:06d}-{lang}", "text": sentence.text, "language": lang,
                   "keywords": list(sentence.keywords), "speaker": voice.id, "accent": voice.accent,
                   "entities": entities, **extra}


def _nonspeech_row(job: TargetJob, rng: np.random.Generator) -> tuple[np.ndarray, dict]:
    audio, extra = render_clip(job.index, rng, tts.SAMPLE_RATE)
    return audio, {"id": f"target-nonspeech-{job.index:06d}-{extra['kind']}", "text": "", "language": "en",
                   **extra}


def _silent_pool_row(job: TargetJob, rng: np.random.Generator) -> tuple[np.ndarray, dict]:
    """A pool line where nobody speaks, logged as the speech lines are: over the same telephone line,
    with an entity list of the app's (distractors only) and no field that says what it is."""
    audio, extra = render_clip(job.index, rng, tts.SAMPLE_RATE)
    if extra["channel"] != "telephone":
        audio, line = augment.telephone(audio, tts.SAMPLE_RATE, rng)
        extra.update(line)
    entities = context_list([], job.language, ENTITY_LIST_SIZE,
                            utterance_rng(job.seed, f"target/{job.split}/entities", job.index), omit_prob=0.0)
    return np.clip(audio, -1.0, 1.0), {"id": f"target-{job.split}-{job.index:06d}-{job.language}", "text": "",
                                       "language": job.language, "keywords": [], "entities": entities, **extra}


def write_target_outputs(root: Path, params: dict, rows: dict[str, list[dict]]) -> dict[str, dict]:
    """The manifests (the pool three ways) and corpus.json, written last; returns the splits."""
    pool = rows.get("pool", [])
    files = {"pool": [{k: r[k] for k in POOL_FIELDS if k in r} for r in pool], "pool_labelled": pool,
             **{name: rows.get(name, []) for name in ("dev", "test", "nonspeech")}}
    splits = {}
    for name, lines in files.items():
        write_jsonl(root / f"{name}.jsonl", lines)
        hours = sum(r["duration"] for r in lines) / 3600.0
        splits[name] = {"utterances": len(lines), "hours": round(hours, 4), "manifest": f"{name}.jsonl"}
    write_jsonl(root / TRANSCRIPTS_NAME, [{"id": r["id"], "text": r["text"]} for r in pool])
    for name in (*files, TRANSCRIPTS_NAME.removesuffix(".jsonl")):
        os.chmod(root / f"{name}.jsonl", umasked(0o666))  # atomic writes go through private files
    meta = {"generator": "asr_rl.data.synth.target", "params": params, "sample_rate": tts.SAMPLE_RATE,
            "splits": splits, "transcripts": {"pool": TRANSCRIPTS_NAME},
            "voice_groups": {s.name: s.voice_group for s in TARGET_SPLITS if s.voice_group},
            "speakers": {s: len({r["speaker"] for r in rs if "speaker" in r}) for s, rs in rows.items() if s != "nonspeech"},
            "pool_nonspeech": sum(r["text"] == "" for r in pool),
            "channel": "telephone (nonspeech: every other round of kinds)"}
    atomic_write_text(root / META_NAME, json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    os.chmod(root / META_NAME, umasked(0o666))
    return splits


__all__ = ["ENTITY_LIST_SIZE", "TARGET_SPLITS", "synthesize_target", "target_params"]
