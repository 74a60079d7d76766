"""`asr-rl data pseudo-label`: transcripts for audio from a model, written as a manifest `train sft` takes.

Two methods, both through the RL rollout engine (`HFRolloutEngine`):
- greedy (self-training): each line gets the model's greedy transcript (what `asr-rl eval` decodes);
- best-of-N (`best_of=N` with a reward): N hypotheses per utterance, sampled at `temperature` with
  one seed per (utterance id, sample), so a rerun draws the same, or the beam N-best
  (`mode="beam"`), scored by the reward; the best is kept (rejection-sampling fine-tuning:
  RAFT, Dong et al. 2023, arXiv:2304.06767; OpenRLHF's best-of-N). Ties go to the first
  (the top beam, or the first sample).
An empty hypothesis is never a label, except on a non-speech line (`"text": ""`) and, on an
unlabelled line, where best-of-N's reward scores it strictly highest (a reward that hears nobody
speak; on a tie with a transcript that has words, the words are kept).

Each written line is the input line (every field, `audio` absolute) with `text` = the label, the
line's own transcript kept as `reference_text` when it had one (to measure the labels against),
and `pseudo_label`: {"method": "greedy"|"best_of_n", "confidence", "reward" (best-of-N), "n", "model",
"pool" (the absolute paths it was labelled with and from)}.

Confidence: the mean, over the chosen hypothesis's tokens (the language tag and EOS included), of
log p(token | audio, tokens before) under the model at temperature 1, teacher-forced; 0 is
certain, lower is less sure (rounded to 4 decimals). `min_confidence` drops the lines below it to
`<out stem>.dropped.jsonl`, each with its reason, as it does lines whose hypotheses are all empty.

Resumable: lines are appended and flushed one by one; a rerun skips the ids already in the output
and the dropped file, and rewrites a half-written last line (only one its own lines before it, or its
own fields, show this command wrote). Only a file this command wrote for the same model, pool and
method is continued; any other `--out` (a manifest labelled by people) is refused, naming it, and
left byte for byte. The output is locked while a run writes it (`.<out name>.lock` beside it): a
second run on the same `--out` stops, naming the first one's pid. Batches are fixed runs of the
manifest's lines, recomputed whole, so a resumed run writes what an uninterrupted one would.
A line that cannot be decoded (bad manifest line, missing or unreadable audio, too long) is named
with its file:line and skipped; the report lists them.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from asr_rl.data.manifest import Utterance, manifest_row
from asr_rl.trainer.run.folder import RunLock

log = logging.getLogger("asr_rl.pseudo_label")


@dataclass
class PseudoLabelReport:
    written: int = 0
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> lines
    bad: list[str] = field(default_factory=list)  # "file:line: why", for each line that could not be decoded
    already_done: int = 0  # lines a previous run wrote (or dropped)
    seconds: float = 0.0

    def summary(self) -> str:
        why = "; ".join(f"{k}: {v}" for k, v in self.dropped.items())
        return (f"{self.written} written, {sum(self.dropped.values())} dropped{f' ({why})' if why else ''}, "
                f"{len(self.bad)} bad, {self.already_done} done before, {self.seconds:.1f} s")


def dropped_path(out: str | Path) -> Path:
    """Where the dropped lines go: `labels.jsonl` -> `labels.dropped.jsonl`."""
    return Path(out).with_suffix(".dropped.jsonl")


def choose(hypotheses: list[str], rewards: list[float], non_speech: bool) -> int | None:
    """The index of the hypothesis to keep: the highest reward, the first on ties; empty ones only on
    a non-speech line, and there only by scoring strictly highest (a tie with words keeps the words:
    a reward that cannot tell them apart has not heard silence). None when every hypothesis is empty."""
    allowed = [j for j, h in enumerate(hypotheses) if h.strip() or non_speech]
    return max(allowed, key=lambda j: (rewards[j], bool(hypotheses[j].strip()), -j)) if allowed else None


def resume_ids(path: Path, method: str, origin: dict[str, str] | None = None) -> set[str]:
    """Ids a previous run wrote to `path` (empty when there is none). Only a file this command wrote,
    with this method and (`origin`) this model and pool, is continued: a line that is not a JSON
    object, has no `pseudo_label` (a manifest labelled by people), or was labelled otherwise is an
    error naming the file and line, and nothing is touched. A last line without its newline is this
    command's only when the file proves it: a whole line of its own (the newline is added), or a cut
    line after lines of its own (a kill mid-write: removed, and written again); any other is refused."""
    if not path.is_file():
        return set()
    data = path.read_bytes()
    complete, _, partial = data.rpartition(b"\n")
    lines = complete.split(b"\n") if complete else []
    _check_lines(path, lines, method, origin)
    if partial and _is_own_line(partial, method, origin):
        with open(path, "ab") as f:
            f.write(b"\n")
        lines.append(partial)
    elif partial and lines and not _parses(partial):
        log.warning("%s: removing a half-written last line (it is written again)", path)
        with open(path, "r+b") as f:
            f.truncate(len(data) - len(partial))
    elif partial:
        at = f"{path}:{len(lines) + 1}"
        raise ValueError(f"{at} has no newline and is not a line this command wrote, nor one it was writing when "
                         f"stopped: {path} is left as it is; give another --out (or, if a run of this command was "
                         "killed while writing its first line, delete the file)")
    return {str(json.loads(raw)["id"]) for raw in lines}


def _parses(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except ValueError:
        return False
    return True


def _is_own_line(raw: bytes, method: str, origin: dict[str, str] | None) -> bool:
    try:
        _check_lines(Path(), [raw], method, origin)
    except ValueError:
        return False
    return True


def _check_lines(path: Path, lines: list[bytes], method: str, origin: dict[str, str] | None) -> None:
    """`resume_ids`' refusals, all before anything is touched."""
    for lineno, raw in enumerate(lines, start=1):
        try:
            row = json.loads(raw)
            str(row["id"])
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"{path}:{lineno}: not a line this command writes; move {path} away or give "
                             "another --out") from None
        label = row.get("pseudo_label")
        if not isinstance(label, dict):
            raise ValueError(f"{path}:{lineno} has no `pseudo_label`: {path} was not written by `asr-rl data "
                             "pseudo-label` (a manifest with its own transcripts?) and is left as it is; give another "
                             "--out") from None
        if label.get("method", method) != method:
            raise ValueError(f"{path}:{lineno} was labelled by {label['method']}, this run by {method}: give "
                             "another --out, or rerun with the first run's options")
        for key, value in (origin or {}).items():
            if key in label and label[key] != value:  # lines of older versions carry no origin
                raise ValueError(f"{path}:{lineno} was labelled with {key} {label[key]}, this run's {key} is {value}: "
                                 "a file continues only the run that wrote it; give another --out")


def pseudo_label(model: str, manifest: str, out: str, *, best_of: int = 1, reward: str | None = None,
                 mode: str = "sample", temperature: float = 1.0, top_p: float = 1.0, max_new_tokens: int = 96,
                 min_confidence: float | None = None, batch_size: int = 8, seed: int = 0, device: str = "auto",
                 dtype: str = "auto", progress: bool = True) -> PseudoLabelReport:
    """Label every line of `manifest` with `model` and append the lines to `out` (module docstring)."""
    from asr_rl.data.manifest import scan_manifest
    from asr_rl.rewards.pipeline import check_reward_coverage, make_reward, reward_spec_config
    from asr_rl.trainer.configs.rl import RolloutConfig

    start, report, method = time.perf_counter(), PseudoLabelReport(), "best_of_n" if best_of > 1 else "greedy"
    if (best_of > 1) != (reward is not None):
        raise ValueError("best-of-N needs both --best-of N (N >= 2) and --reward SPEC; greedy labels take neither")
    # step 1: the lines, and the reward checked against them, before any model loads
    scan = scan_manifest(manifest, text_needed_by=None)
    report.bad += [f"{p.at(manifest)}: {p.message}" for p in scan.problems]
    if not scan.utterances and not scan.problems:
        raise ValueError(f"manifest {manifest} holds no utterances")
    reward_cfg = reward_spec_config(reward) if reward else None
    if reward_cfg:
        check_reward_coverage(reward_cfg, scan.utterances, what=f"--reward {reward} on {manifest}")
    rollout = RolloutConfig(mode=mode if best_of > 1 else "beam", n_samples_per_prompt=best_of, top_p=top_p,
                            temperature=temperature if best_of > 1 and mode == "sample" else 1.0,
                            max_new_tokens=max_new_tokens)
    # step 2: the output, locked (a second run on it stops instead of writing every label twice), and
    # what a previous run did
    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with RunLock(out_path.parent, out_path.with_name(f".{out_path.name}.lock"), what=f"--out {out_path}"):
        origin = {"model": str(Path(model).resolve()), "pool": str(Path(manifest).resolve())}
        done = resume_ids(out_path, method, origin) | resume_ids(dropped_path(out_path), method, origin)
        report.already_done = sum(u.id in done for u in scan.utterances)
        # step 3: the model
        labeller = Labeller(load_policy(model, device, dtype), rollout,
                            make_reward(reward_cfg) if reward_cfg else None, seed)
        labeller.check_prompts(scan.utterances, manifest)
        # step 4: fixed batches of the manifest's lines, each decoded whole, its new lines appended
        _write_labels(labeller, scan.utterances, out_path, done, origin, min_confidence, batch_size, report, progress)
    report.seconds = time.perf_counter() - start
    log.info("pseudo-label %s -> %s: %s", manifest, out, report.summary())
    return report


def _write_labels(labeller: "Labeller", utterances: list[Utterance], out_path: Path, done: set[str],
                  origin: dict[str, str], min_confidence: float | None, batch_size: int, report: PseudoLabelReport,
                  progress: bool) -> None:
    from tqdm import tqdm

    bar = tqdm(total=len(utterances) - report.already_done, desc="pseudo-label", disable=not progress)
    with open(out_path, "a", encoding="utf-8") as f, _LazyAppend(dropped_path(out_path)) as dropped:
        for b in range(0, len(utterances), batch_size):
            chunk = utterances[b:b + batch_size]
            if all(u.id in done for u in chunk):
                continue
            for u, label in labeller.label(chunk, report.bad):
                if u.id in done:
                    continue
                label["pseudo_label"].update(origin)
                kind, why = _drop_reason(label, min_confidence)
                if kind:
                    report.dropped[kind] = report.dropped.get(kind, 0) + 1
                    dropped.write({"id": u.id, "source": u.source, "reason": why, "hypothesis": label["text"],
                                   "pseudo_label": label["pseudo_label"]})
                else:
                    _append(f, _labelled(u, label))
                    report.written += 1
            bar.update(sum(u.id not in done for u in chunk))
    bar.close()


def _drop_reason(label: dict, min_confidence: float | None) -> tuple[str | None, str | None]:
    """(kind, reason) of a label that is not written, (None, None) for one that is."""
    if label["text"] is None:
        return "empty", "every hypothesis is empty" if label["pseudo_label"].get("n", 1) > 1 else "empty hypothesis"
    conf = label["pseudo_label"]["confidence"]
    if min_confidence is not None and conf < min_confidence:
        return "low confidence", f"confidence {conf:g} is below --min-confidence {min_confidence:g}"
    return None, None


def _labelled(u: Utterance, label: dict) -> dict:
    row = manifest_row(u)
    # a line labelled before keeps the transcript it had then: its `text` is a label, not a reference
    reference = row.pop("reference_text", None) if "pseudo_label" in row else u.text
    return {**row, "text": label["text"], **({"reference_text": reference} if reference is not None else {}),
            "pseudo_label": label["pseudo_label"]}


def _append(f, row: dict) -> None:
    f.write(json.dumps(row, ensure_ascii=False) + "\n")
    f.flush()  # a kill loses at most the line being written (resume_ids rewrites it)


class _LazyAppend:
    """A JSONL file opened for appending on its first row (no empty dropped file when none is dropped)."""

    def __init__(self, path: Path):
        self.path, self.f = path, None

    def __enter__(self):
        return self

    def write(self, row: dict) -> None:
        if self.f is None:
            self.f = open(self.path, "a", encoding="utf-8")
        _append(self.f, row)

    def __exit__(self, *exc) -> None:
        if self.f is not None:
            self.f.close()


def load_policy(model: str, device: str = "auto", dtype: str = "auto"):
    """The audio-LLM in `model`, for decoding only (eval mode, no gradients)."""
    from asr_rl.evaluation.evaluate import resolve_device, resolve_dtype
    from asr_rl.models.audio_policy import AudioPolicy

    policy = AudioPolicy.from_pretrained(model, device=resolve_device(device), dtype=resolve_dtype(model, dtype)).eval()
    policy.requires_grad_(False)
    return policy


class Labeller:
    """A policy, its rollout engine and a reward: hypotheses for a batch, the chosen one's label
    (what `pseudo_label` writes, and what `asr-rl eval --rerank` scores)."""

    def __init__(self, policy, rollout, reward, seed: int):
        from asr_rl.trainer.rollout.engines import HFRolloutEngine

        self.policy = policy
        self.engine, self.rollout, self.reward, self.seed = HFRolloutEngine(self.policy), rollout, reward, seed

    def check_prompts(self, utterances: list[Utterance], manifest: str) -> None:
        from asr_rl.models.tokenizer import require_prompts_fit

        require_prompts_fit([u for u in utterances if u.context], self.policy.tokenizer,
                            getattr(self.policy.llm_config(), "max_position_embeddings", None),
                            self.rollout.max_new_tokens, f"manifest {manifest}")

    def label(self, chunk: list[Utterance], bad: list[str]) -> list[tuple[Utterance, dict]]:
        """(utterance, {"text": label or None when every hypothesis is empty, "pseudo_label": {...}})
        for the lines of `chunk` that decode; the others are appended to `bad`."""
        from asr_rl.data.batching import AudioBatch
        from asr_rl.evaluation.evaluate import DECODE_ERRORS, load_decodable
        from asr_rl.models.sampling import sequence_seed
        from asr_rl.rewards.base import check_output
        from asr_rl.trainer.rollout.experience import Group, make_samples

        loaded = []
        for u in chunk:
            try:
                loaded.append((u, load_decodable(self.policy, u)))
            except DECODE_ERRORS as e:
                log.warning("%s: %s (skipped)", u.source, e)
                bad.append(f"{u.source}: {e}")
        if not loaded:
            return []
        utts, n = [u for u, _ in loaded], self.rollout.n_samples_per_prompt
        rows = self.policy.encode_batch(AudioBatch(utts, [w for _, w in loaded], self.policy.sample_rate))
        seeds = [sequence_seed(self.seed, u.id, j) for u in utts for j in range(n)]
        sampled = self.engine.generate(rows, n, self.rollout, seeds)
        groups = [Group(u, r, s.ids, self.policy.pad_responses(s.ids).texts) for u, r, s in zip(utts, rows, sampled)]
        samples = make_samples(groups, self.policy.parse)
        rewards = check_output("reward", self.reward(samples), len(samples)).rewards if self.reward else [0.0] * len(samples)
        # an unlabelled line under a reward: the reward may know nobody speaks (the silence term)
        picks = [choose([s.hypothesis for s in samples[i * n:(i + 1) * n]], rewards[i * n:(i + 1) * n],
                        u.text == "" or (u.text is None and self.reward is not None))
                 for i, u in enumerate(utts)]
        confidence = self._confidence(rows, sampled, picks)
        out = []
        for i, (u, j) in enumerate(zip(utts, picks)):
            label = {"method": "best_of_n" if n > 1 else "greedy", "confidence": confidence[i]}
            if n > 1:
                label.update(reward=None if j is None else rewards[i * n + j], n=n)
            out.append((u, {"text": None if j is None else samples[i * n + j].hypothesis, "pseudo_label": label}))
        return out

    def _confidence(self, rows: list, sampled: list, picks: list[int | None]) -> list[float]:
        """Mean token log-prob of each chosen hypothesis at temperature 1 (module docstring): the
        beam N-best (greedy included) was scored so by the engine; samples are scored again
        (the sampler's log-probs are those of its temperature and top-p)."""
        import torch

        picks = [j or 0 for j in picks]  # every hypothesis empty: the first one's (the dropped file shows it)
        chosen = [s.ids[j] for s, j in zip(sampled, picks)]
        if self.rollout.mode == "beam":
            logps = [s.logps[j] for s, j in zip(sampled, picks)]
        else:
            with torch.no_grad():
                embeds, mask = self.policy.embed_rows(rows)
                resp = self.policy.pad_responses(chosen)
                lp = self.policy.logprobs(embeds, mask, resp, temperature=1.0).masked_fill(resp.mask == 0, 0.0)
            logps = [row[: len(ids)].tolist() for row, ids in zip(lp.cpu(), chosen)]
        return [round(sum(lp) / max(len(lp), 1), 4) for lp in logps]


__all__ = ["pseudo_label", "PseudoLabelReport", "Labeller", "load_policy", "choose", "resume_ids", "dropped_path"]
