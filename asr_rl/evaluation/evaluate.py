"""`asr-rl eval`: decode test sets with a model folder and score them.

For each set: CER, WER, S/D/I, keyword recall, language accuracy, utterances, hours and real-time
factor, and the failure modes (`failures.py`: insertion, loop and non-speech hallucination rates,
keyword and entity errors, and with `--verifier` its pass rate, `verifier.py`); a table on stdout,
`report.json`, `report.md` and `<set>.hyps.jsonl` under `--output`.
A line whose audio fails to load, or is longer than the model's encoder window (it would be cut and
its transcript scored against the whole reference), is reported and counted (`failed`), and the
rest are scored.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from asr_rl.data.audio import AudioError, load_audio
from asr_rl.data.batching import AudioBatch
from asr_rl.data.manifest import Utterance, scan_manifest
from asr_rl.evaluation.failures import failure_lines
from asr_rl.evaluation.metrics import SetMetrics, UtteranceResult, score_set
from asr_rl.evaluation.verifier import Verifier, verify
from asr_rl.models.families import AudioTooLong
from asr_rl.models.tokenizer import require_contexts_fit, require_prompts_fit
from asr_rl.utils import atomic_write_text, write_jsonl

log = logging.getLogger("asr_rl.eval")


def resolve_device(device: str) -> str:
    """`auto` -> cuda when available; asking for cuda where there is none is an error."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r} was asked for, but no CUDA device is available here; "
                           "use --device cpu (or auto)")
    return device


# what `load_decodable` raises for a line that cannot be decoded (reported, and the rest go on)
DECODE_ERRORS = (AudioError, AudioTooLong)


def load_decodable(policy, u: Utterance):
    """`u`'s waveform at the policy's rate; `AudioError` when it fails to load, `AudioTooLong` when
    it is longer than the model's encoder window (it would be cut and its transcript lose the end)."""
    wav = load_audio(u.audio, policy.sample_rate)
    policy.check_durations([wav], [u.id])
    return wav


def transcribe(policy, utterances: list[Utterance], batch_size: int = 16, num_beams: int = 1,
               max_new_tokens: int = 96, progress: bool = False) -> list[UtteranceResult]:
    """Greedy (or beam) transcripts of `utterances`, in input order. Utterances are batched by
    duration to limit padding; one whose audio fails to load or is too long gets `error` set."""
    from tqdm import tqdm

    results: dict[int, UtteranceResult] = {}
    loaded = []
    for i, u in enumerate(utterances):
        try:
            loaded.append((i, u, load_decodable(policy, u)))
        except DECODE_ERRORS as e:
            log.warning("%s: %s (skipped, counted as failed)", u.source or u.id, e)
            results[i] = UtteranceResult(u.id, u.text, "", u.language, u.keywords, error=str(e), speaker=u.speaker,
                                         context=u.context, metadata=dict(u.meta))
    loaded.sort(key=lambda x: len(x[2]))
    policy.eval()
    bar = tqdm(total=len(loaded), desc="decode", disable=not progress, leave=False)
    for start in range(0, len(loaded), batch_size):
        chunk = loaded[start:start + batch_size]
        # through encode_batch: a frozen encoder's states for a dev set come from the cache after
        # the first evaluation of a run
        rows = policy.encode_batch(AudioBatch([u for _, u, _ in chunk], [w for _, _, w in chunk], policy.sample_rate))
        with torch.no_grad():
            embeds, mask = policy.embed_rows(rows)
            out = policy.generate_from_embeds(embeds, mask, n=1, do_sample=False, num_beams=num_beams,
                                              max_new_tokens=max_new_tokens)
        for (i, u, wav), text in zip(chunk, out.texts):
            lang, transcript, _ = policy.parse(text, u.language)
            results[i] = UtteranceResult(u.id, u.text, transcript, u.language, u.keywords,
                                         predicted_language=None if policy.force_language else lang,
                                         duration=len(wav) / policy.sample_rate, speaker=u.speaker,
                                         context=u.context, metadata=dict(u.meta))
        bar.update(len(chunk))
    bar.close()
    return [results[i] for i in range(len(utterances))]


def evaluate_manifest(policy, manifest: str | Path, batch_size: int = 16, num_beams: int = 1,
                      max_new_tokens: int = 96, max_utterances: int | None = None,
                      progress: bool = False, context: tuple[str, ...] = (),
                      verifier: Verifier | None = None, options=None, decode=None
                      ) -> tuple[SetMetrics, list[UtteranceResult]]:
    """Decode and score one test set (any format `READERS` reads, `options` its reading options);
    `context` is the list for lines that carry none of their own; `verifier` checks each transcript
    (its pass rate is reported); `decode(policy, utterances, batch_size, max_new_tokens, progress)`
    replaces greedy (or beam) decoding, e.g. N samples reranked by a reward (trainer/recipes/rerank.py)."""
    scan = scan_manifest(manifest, check_audio=False, text_needed_by=None, options=options)
    if scan.unlabelled:  # a refusal, not a failed line: the set cannot be scored as the user meant
        u = scan.unlabelled[0]
        raise ValueError(f"test set {manifest}: {u.source} has no `text`: eval needs the transcripts "
                         f"({len(scan.unlabelled)} of {len(scan.utterances)} lines lack one); unlabelled audio is "
                         "for RL, or label it first (`asr-rl data pseudo-label`)")
    for p in scan.problems:
        log.warning("%s: %s (skipped, counted as failed)", p.at(manifest), p.message)
    utts = scan.utterances[:max_utterances] if max_utterances else scan.utterances
    utts = [replace(u, context=context) if context and not u.context else u for u in utts]
    if not utts and not scan.problems:
        raise ValueError(f"test set {manifest} is empty: it holds no utterances")
    require_prompts_fit([u for u in utts if u.context], policy.tokenizer,
                        getattr(policy.llm_config(), "max_position_embeddings", None), max_new_tokens,
                        f"test set {manifest}")
    start = time.perf_counter()
    if decode is not None:
        results = decode(policy, utts, batch_size, max_new_tokens, progress)
    else:
        results = transcribe(policy, utts, batch_size, num_beams, max_new_tokens, progress)
    seconds = time.perf_counter() - start
    results += [UtteranceResult(f"line{p.line}", "", "", "", error=p.message) for p in scan.problems]
    if verifier is not None:
        results = verify(results, verifier)
    return score_set(results, decode_seconds=seconds), results


def run_eval(model: str | Path, test_sets: dict[str, str], output: str | Path | None = None,
             batch_size: int = 16, num_beams: int = 1, device: str = "auto", max_new_tokens: int = 96,
             force_language: bool | None = None, progress: bool = True, dtype: str = "auto",
             contexts: dict[str, tuple[str, ...]] | None = None,
             verifier: Verifier | None = None, options=None, decode=None) -> dict[str, SetMetrics]:
    """Evaluate `model` on each named test set; write reports under `output` when given. `dtype`:
    float32, bfloat16, or auto (the dtype the checkpoint was saved in); `contexts`: a set's context
    list for its lines that carry none; `verifier`: a checker of transcripts (`verifier.py`);
    `options`: how the sets are read (`ReadOptions`: format, columns, default language)."""
    report = {name: m for name, (m, _) in decode_sets(model, test_sets, output, batch_size, num_beams, device,
                                                      max_new_tokens, force_language, progress, dtype,
                                                      contexts, verifier, options, decode).items()}
    print(format_table(report))
    return report


def decode_sets(model: str | Path, test_sets: dict[str, str], output: str | Path | None = None,
                batch_size: int = 16, num_beams: int = 1, device: str = "auto", max_new_tokens: int = 96,
                force_language: bool | None = None, progress: bool = True, dtype: str = "auto",
                contexts: dict[str, tuple[str, ...]] | None = None, verifier: Verifier | None = None,
                options=None, decode=None) -> dict[str, tuple[SetMetrics, list[UtteranceResult]]]:
    """`run_eval` without the table: metrics and per-utterance results of each set."""
    from asr_rl.models.audio_policy import AudioPolicy

    for name, path in test_sets.items():
        if not Path(path).exists():  # a file, or a folder of another format (datasets, parquet, Kaldi)
            raise FileNotFoundError(f"test set {name}={path}: does not exist")
    policy = AudioPolicy.from_pretrained(model, device=resolve_device(device), dtype=resolve_dtype(model, dtype))
    check_num_beams(num_beams, len(policy.tokenizer))
    limit = getattr(policy.llm_config(), "max_position_embeddings", None)
    require_contexts_fit([(f"context file for {name}", items) for name, items in (contexts or {}).items()],
                         policy.tokenizer, limit, max_new_tokens, "--context-file")
    if force_language is not None:
        policy.force_language = force_language
    out: dict[str, tuple[SetMetrics, list[UtteranceResult]]] = {}
    for name, path in test_sets.items():
        out[name] = evaluate_manifest(policy, path, batch_size, num_beams, max_new_tokens, progress=progress,
                                      context=(contexts or {}).get(name, ()), verifier=verifier, options=options,
                                      decode=decode)
        if output is not None:
            write_jsonl(Path(output) / f"{name}.hyps.jsonl", (asdict(r) for r in out[name][1]))
    if output is not None:
        write_reports({name: m for name, (m, _) in out.items()}, Path(output), model=str(model), verifier=verifier)
    return out


def parse_test_sets(test_sets: list[str], context_files: list[str]
                    ) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """`--test-set NAME=PATH.jsonl` and `--context-file NAME=PATH` arguments: (set name -> manifest,
    set name -> its context list), with errors naming the argument."""
    from asr_rl.data.manifest import read_context_file

    sets = {}
    for item in test_sets:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--test-set {item!r} must be NAME=PATH.jsonl")
        sets[name] = path
    contexts = {}
    for item in context_files:
        name, sep, path = item.partition("=")
        if not sep or name not in sets:
            raise ValueError(f"--context-file {item!r} must be NAME=PATH with NAME one of the --test-set names "
                             f"({', '.join(sets) or 'none given'})")
        contexts[name] = read_context_file(path)
    return sets, contexts


def check_num_beams(num_beams: int, vocab_size: int | None = None) -> None:
    """ValueError for a beam width that is no search: below 1 (1 is greedy), or wider than the
    vocabulary (the first step cannot fill the beams)."""
    if num_beams < 1:
        raise ValueError(f"--num-beams must be at least 1 (1 = greedy decoding), got {num_beams}")
    if vocab_size is not None and num_beams > vocab_size:
        raise ValueError(f"--num-beams {num_beams} is wider than the model's vocabulary ({vocab_size} tokens); "
                         f"use at most {vocab_size}")


def resolve_dtype(model: str | Path, dtype: str) -> torch.dtype:
    """`auto`: the dtype a checkpoint was saved in (float32 unless its config says bfloat16)."""
    if dtype == "auto":
        from asr_rl.models.weights import read_model_config

        saved = str(getattr(read_model_config(model), "dtype", None) or "float32").removeprefix("torch.")
        dtype = "bfloat16" if saved == "bfloat16" else "float32"
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"--dtype {dtype!r}: choose auto, float32 or bfloat16")
    return getattr(torch, dtype)


def format_table(report: dict[str, SetMetrics]) -> str:
    head = f"{'test set':<14}{'utts':>6}{'failed':>7}{'hours':>8}{'CER%':>8}{'WER%':>8}{'S/D/I':>16}{'kw rec%':>9}{'lang acc%':>10}{'RTF':>7}"
    rows = [head, "-" * len(head)]
    for name, m in report.items():
        rows.append(f"{name:<14}{m.utterances:>6}{m.failed:>7}{m.hours:>8.3f}{_pct(m.cer):>8}{_pct(m.wer):>8}"
                    f"{f'{m.substitutions}/{m.deletions}/{m.insertions}':>16}{_pct(m.keyword_recall):>9}"
                    f"{_pct(m.language_accuracy):>10}{(f'{m.rtf:.3f}' if m.rtf is not None else '-'):>7}")
    return "\n".join(rows + biasing_lines(report) + failure_lines(report))


def biasing_lines(report: dict[str, SetMetrics]) -> list[str]:
    """The sets evaluated with context lists: B-WER, U-WER (Le et al. 2021) and false biasing."""
    sets = {name: m for name, m in report.items() if m.biased_units or m.b_wer is not None or m.u_wer is not None}
    if not sets:
        return []
    head = f"{'with context':<14}{'B-WER%':>8}{'U-WER%':>8}{'biased units':>14}{'false biasing':>15}"
    return ["", head, "-" * len(head)] + [f"{name:<14}{_pct(m.b_wer):>8}{_pct(m.u_wer):>8}{m.biased_units:>14}"
                                          f"{m.false_biasing:>15}" for name, m in sets.items()]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}"


def write_reports(report: dict[str, SetMetrics], output: Path, model: str, verifier: Verifier | None = None) -> None:
    output.mkdir(parents=True, exist_ok=True)
    checker = {"verifier": {"file": verifier.path, "pass": verifier.threshold}} if verifier is not None else {}
    atomic_write_text(output / "report.json", json.dumps(
        {"model": model, **checker, "test_sets": {k: v.to_dict() for k, v in report.items()}}, indent=2))
    lines = [f"# Evaluation of `{model}`", "", "| test set | utts | failed | hours | CER % | WER % | S/D/I | "
             "keyword recall % | language acc % | RTF |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in report.items():
        lines.append(f"| {name} | {m.utterances} | {m.failed} | {m.hours:.3f} | {_pct(m.cer)} | {_pct(m.wer)} | "
                     f"{m.substitutions}/{m.deletions}/{m.insertions} | {_pct(m.keyword_recall)} | "
                     f"{_pct(m.language_accuracy)} | {f'{m.rtf:.3f}' if m.rtf is not None else '-'} |")
    lines += ["", "```", *biasing_lines(report)[1:], "```"] if biasing_lines(report) else []
    lines += ["", "```", *failure_lines(report)[1:], "```"]
    atomic_write_text(output / "report.md", "\n".join(lines) + "\n")
