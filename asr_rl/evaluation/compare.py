"""`asr-rl eval --compare A B`: does B make fewer errors than A on each test set, and how sure is that.

A and B are each either
- an `asr-rl eval --output` folder (`report.json` and `<set>.hyps.jsonl`): its hypotheses are
  reused and nothing is decoded, so that each model of a demo is evaluated once; or
- a model folder (`config.json`): decoded here on the `--test-set`s, and when `--output` is given its
  eval output goes to `OUTPUT/A` (or `OUTPUT/B`) to be reused next time.
Without `--test-set` the sets are those both eval folders hold; with it, the named sets, whose
manifests also give the speakers (for hypotheses files written before they carried `speaker`).

Per set: the utterances both transcribed (by id; one that failed in either is left out and counted;
different ids are an error), each side's CER/WER and error breakdown (`breakdown.py`), and the
paired bootstrap of B's CER minus A's over utterances and over speakers (`significance.py`; none
on a set of only non-speech lines, which has no reference character), and of each failure metric
both sides have over utterances (`failures.py`). With a verifier (`--verifier`), both sides'
transcripts are checked here, eval folders included, at its threshold; without one, the pass flags
an eval folder holds are compared when both sides hold them.
"""
from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from asr_rl.data.manifest import scan_manifest
from asr_rl.evaluation.biasing import bias_counts
from asr_rl.evaluation.breakdown import error_breakdown
from asr_rl.evaluation.failures import compare_failures
from asr_rl.evaluation.metrics import UtteranceResult, score_set
from asr_rl.evaluation.significance import paired_bootstrap, speaker_blocks
from asr_rl.evaluation.verifier import Verifier, verify
from asr_rl.rewards.normalize import char_errors
from asr_rl.utils import atomic_write_text

_RESULT_FIELDS = {f.name for f in fields(UtteranceResult)}


def is_eval_folder(path: Path) -> bool:
    return (path / "report.json").is_file() and any(path.glob("*.hyps.jsonl"))


def read_hyps(folder: Path, name: str) -> list[UtteranceResult]:
    """The per-utterance results `asr-rl eval --output` wrote for set `name`."""
    path = folder / f"{name}.hyps.jsonl"
    if not path.is_file():
        have = sorted(p.name.removesuffix(".hyps.jsonl") for p in folder.glob("*.hyps.jsonl"))
        raise FileNotFoundError(f"{folder} holds no hypotheses for test set {name!r} ({path.name}); it has: "
                                f"{', '.join(have) or 'none'}")
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    return [UtteranceResult(**{**{k: v for k, v in r.items() if k in _RESULT_FIELDS},
                               "keywords": tuple(r.get("keywords") or ()), "context": tuple(r.get("context") or ()),
                               "metadata": dict(r.get("metadata") or {})})
            for r in rows]


def load_sides(paths: dict[str, Path], test_sets: dict[str, str] | None, output: Path | None,
               eval_kwargs: dict) -> dict[str, dict[str, list[UtteranceResult]]]:
    """label ("A", "B") -> set name -> results, reading eval folders and decoding model folders."""
    kinds = {}
    for label, p in paths.items():
        if is_eval_folder(p):
            kinds[label] = "eval"
        elif (p / "config.json").is_file():
            kinds[label] = "model"
        else:
            raise FileNotFoundError(f"--compare {label}={p}: neither an eval output folder (report.json and "
                                    "*.hyps.jsonl, from `asr-rl eval --output`) nor a model folder (config.json)")
    if test_sets is None:
        if "model" in kinds.values():
            raise ValueError("--compare with a model folder needs --test-set NAME=PATH.jsonl to decode")
        names = [{q.name.removesuffix(".hyps.jsonl") for q in p.glob("*.hyps.jsonl")} for p in paths.values()]
        test_sets = dict.fromkeys(sorted(set.intersection(*names)))
        if not test_sets:
            raise ValueError(f"{' and '.join(map(str, paths.values()))} have no test set in common")
    out = {}
    for label, p in paths.items():
        if kinds[label] == "eval":
            out[label] = {name: read_hyps(p, name) for name in test_sets}
        else:
            from asr_rl.evaluation.evaluate import decode_sets

            decoded = decode_sets(p, test_sets, output / label if output else None, **eval_kwargs)
            out[label] = {name: results for name, (_, results) in decoded.items()}
    return out


def paired(a: list[UtteranceResult], b: list[UtteranceResult], name: str) -> tuple[list, list, int]:
    """(A's results, B's results, left out): the utterances scored in both, in A's order."""
    by_id = [{r.id: r for r in side} for side in (a, b)]
    for side, label in zip((a, b), "AB"):
        if len({r.id for r in side}) != len(side):
            raise ValueError(f"test set {name}: {label}'s hypotheses repeat an utterance id; ids must be unique")
    only_a, only_b = by_id[0].keys() - by_id[1].keys(), by_id[1].keys() - by_id[0].keys()
    if only_a or only_b:
        raise ValueError(f"test set {name}: A and B transcribed different utterances ({len(only_a)} only in A, "
                         f"e.g. {sorted(only_a)[:3]}; {len(only_b)} only in B, e.g. {sorted(only_b)[:3]}); "
                         "evaluate both on the same manifest")
    for r in a:  # the same id must be the same utterance: a reference or language that differs is not
        other = by_id[1][r.id]
        if (r.reference, r.language) != (other.reference, other.language):
            raise ValueError(f"test set {name}: utterance {r.id!r} is not the same in A and B (reference "
                             f"{r.reference!r}, language {r.language} in A; {other.reference!r}, {other.language} in "
                             "B): compare evaluations of the same manifest")
    keep = [r.id for r in a if r.error is None and by_id[1][r.id].error is None]
    if not keep:
        raise ValueError(f"test set {name}: no utterance was transcribed by both A and B")
    return [by_id[0][i] for i in keep], [by_id[1][i] for i in keep], len(a) - len(keep)


def compare_set(a: list[UtteranceResult], b: list[UtteranceResult], speakers: list[str | None],
                n_resamples: int, seed: int) -> dict:
    """Both sides' metrics and breakdown, and the bootstrap of B's CER minus A's (module docstring).
    `a` and `b` are paired (same utterances, same order); `speakers` their speakers."""
    errs = [[char_errors(r.reference, r.hypothesis) for r in side] for side in (a, b)]
    units = [e[3] for e in errs[0]]
    ea, eb = ([s + d + i for s, d, i, _ in side] for side in errs)
    blocks = speaker_blocks(speakers)
    out = {"utterances": len(a), "speakers": len({s for s in speakers if s is not None})}
    for label, side in (("a", a), ("b", b)):
        m = score_set(side)
        out[label] = {"cer": m.cer, "wer": m.wer, "keyword_recall": m.keyword_recall,
                      "breakdown": error_breakdown(side)}
    has_units = sum(units) > 0  # a set of only non-speech lines has no CER to compare
    out["utterance"] = paired_bootstrap(ea, eb, units, n_resamples, seed).to_dict() if has_units else None
    out["speaker"] = (paired_bootstrap(ea, eb, units, n_resamples, seed, blocks).to_dict()
                      if has_units and blocks is not None else None)
    out["failures"] = compare_failures(a, b, n_resamples, seed)
    if any(r.context for r in a) or any(r.context for r in b):
        out["biasing"] = compare_biasing(a, b, n_resamples, seed)
    return out


def compare_biasing(a: list[UtteranceResult], b: list[UtteranceResult], n_resamples: int, seed: int) -> dict:
    """With context lists: the paired bootstrap of B-WER and of U-WER (B minus A, over utterances),
    and each side's false biasing. Both sides must have had the same lists (their references'
    biased units are then the same)."""
    if any(tuple(ra.context) != tuple(rb.context) for ra, rb in zip(a, b)):
        raise ValueError("A and B were evaluated with different context lists on the same utterances: compare "
                         "evaluations made with the same manifest and --context-file")
    counts = [[bias_counts(r.reference, r.hypothesis, r.context, r.language) for r in side] for side in (a, b)]
    out = {"false_biasing": {label: sum(c.false_biasing for c in side) for label, side in zip("ab", counts)}}
    for name, errors, units in (("b_wer", "biased_errors", "biased_ref"), ("u_wer", "unbiased_errors", "unbiased_ref")):
        ref = [getattr(c, units) for c in counts[0]]
        if sum(ref):
            ea, eb = ([getattr(c, errors) for c in side] for side in counts)
            out[name] = paired_bootstrap(ea, eb, ref, n_resamples, seed).to_dict()
    return out


def run_compare(a: str | Path, b: str | Path, test_sets: dict[str, str] | None = None,
                output: str | Path | None = None, n_resamples: int = 1000, seed: int = 0,
                eval_kwargs: dict | None = None, verifier: Verifier | None = None) -> dict:
    """The `compare` section (also written to OUTPUT/report.json and report.md, and printed);
    `verifier` checks both sides' transcripts (module docstring)."""
    from asr_rl.evaluation.compare_table import compare_markdown, format_compare

    output = Path(output) if output is not None else None
    for label, side in (("A", a), ("B", b)):
        if output is not None and output.resolve() == Path(side).resolve():
            raise ValueError(f"--output {output} is {label} itself: the comparison would overwrite {label}'s own "
                             "report.json and report.md; write it to a folder of its own")
    sides = load_sides({"A": Path(a), "B": Path(b)}, test_sets, output, eval_kwargs or {})
    report = {"a": str(a), "b": str(b), "resamples": n_resamples, "seed": seed, "test_sets": {}}
    if verifier is not None:
        report["verifier"] = {"file": verifier.path, "pass": verifier.threshold}
    for name in sides["A"]:
        ra, rb, left_out = paired(sides["A"][name], sides["B"][name], name)
        if verifier is not None:
            ra, rb = verify(ra, verifier), verify(rb, verifier)
        speakers = _speakers(ra, rb, (test_sets or {}).get(name), (eval_kwargs or {}).get("options"))
        report["test_sets"][name] = {**compare_set(ra, rb, speakers, n_resamples, seed), "left_out": left_out}
    if output is not None:
        output.mkdir(parents=True, exist_ok=True)
        atomic_write_text(output / "report.json", json.dumps({"compare": report}, indent=2, ensure_ascii=False))
        atomic_write_text(output / "report.md", compare_markdown(report))
    print(format_compare(report))
    return report


def pooled_compare(pairs: list[tuple[Path, Path]], n_resamples: int = 1000, seed: int = 0) -> dict[str, dict]:
    """B against A over several runs of each (e.g. two training seeds): `pairs` of eval folders (A_k,
    B_k), every test set they all hold. Each set's paired bootstrap draws utterances with all their
    runs' errors together (the utterance is the block, so its copies are not counted as independent);
    the interval holds the utterance and the seed variation both runs show. Returns set -> {"utterance":
    the pooled bootstrap (`PairedBootstrap.to_dict`), "runs": each pair's own relative change}."""
    names = set.intersection(*[{q.name.removesuffix(".hyps.jsonl") for q in Path(f).glob("*.hyps.jsonl")}
                               for pair in pairs for f in pair])
    out = {}
    for name in sorted(names):
        ea, eb, units, blocks, ids, runs = [], [], [], [], {}, []
        for a, b in pairs:
            ra, rb, _ = paired(read_hyps(Path(a), name), read_hyps(Path(b), name), name)
            errs = [[char_errors(r.reference, r.hypothesis) for r in side] for side in (ra, rb)]
            ea += [sum(e[:3]) for e in errs[0]]
            eb += [sum(e[:3]) for e in errs[1]]
            units += [e[3] for e in errs[0]]
            blocks += [ids.setdefault(r.id, len(ids)) for r in ra]
            n = sum(e[3] for e in errs[0])
            runs.append((sum(sum(e[:3]) for e in errs[1]) / n) / (sum(sum(e[:3]) for e in errs[0]) / n) - 1
                        if n and any(sum(e[:3]) for e in errs[0]) else None)
        if sum(units) > 0:  # a set of only non-speech lines has no CER to compare
            out[name] = {"utterance": paired_bootstrap(ea, eb, units, n_resamples, seed, blocks).to_dict(),
                         "runs": runs}
    return out


def _speakers(a: list[UtteranceResult], b: list[UtteranceResult], manifest: str | None,
              options=None) -> list[str | None]:
    """Each utterance's speaker: from the manifest when given (read with `options`), else from
    either hypotheses file."""
    if manifest is not None:
        by_id = {u.id: u.speaker for u in scan_manifest(manifest, check_audio=False, options=options).utterances}
        return [by_id.get(r.id) for r in a]
    return [ra.speaker if ra.speaker is not None else rb.speaker for ra, rb in zip(a, b)]
