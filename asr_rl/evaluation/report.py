"""`asr-rl report`: one Markdown/HTML page comparing checkpoints, with PNG plots.

Inputs are run folders (`metrics.jsonl` from `asr-rl train ...`) and evaluation folders
(`report.json` from `asr-rl eval`; from `asr-rl eval --compare`, its bootstrap intervals get a
table of their own), in any order. Output: `report.md`, `report.html`,
`training_curves.png` (reward mean and per-term rewards and KL over steps, dev CER over minutes) and `cer_by_set.png`.
"""
from __future__ import annotations

import html
import json
from pathlib import Path

import yaml

from asr_rl.evaluation.compare_table import (FAILURES_HEAD, SIGNIFICANCE_HEAD, failure_rows, md_table,
                                             significance_rows)
from asr_rl.utils import atomic_write_text

_TERM_PREFIX = "reward/"
_NOT_TERMS = {"reward/mean", "reward/std"}


def load_inputs(paths: list[str | Path]) -> tuple[dict[str, list[dict]], dict[str, dict], dict[str, dict]]:
    """(training runs: name -> metrics rows, evaluations: name -> test_sets dict, comparisons from
    `asr-rl eval --compare`: name -> its compare section)."""
    runs, evals, compares = {}, {}, {}
    for p in map(Path, paths):
        if (p / "metrics.jsonl").is_file():
            runs[p.name] = [json.loads(x) for x in (p / "metrics.jsonl").read_text().splitlines() if x.strip()]
        elif (p / "report.json").is_file():
            saved = json.loads((p / "report.json").read_text())
            if "compare" in saved:
                compares[p.name] = saved["compare"]
            if "test_sets" in saved:
                evals[p.name] = saved["test_sets"]
        else:
            raise FileNotFoundError(f"{p} holds neither metrics.jsonl (a training run) nor report.json (an eval)")
    return runs, evals, compares


def start_minutes(run_dirs: dict[str, Path], runs: dict[str, list[dict]]) -> dict[str, float]:
    """Where each run begins on a shared time axis: a run whose `pretrain` is another listed run's
    `best/` begins at the minute that run reached its best on dev (`best/best.json`'s step), one from
    its `final/` (or a checkpoint) where that run ended; any other run at 0. So an RL run from an
    SFT's best is drawn beside the SFT's own continuation over the same minutes: the equal-time
    comparison on dev. Runs are taken in the order given (a start before what branches off it)."""
    by_dir = {d.resolve(): name for name, d in run_dirs.items()}
    starts: dict[str, float] = {}
    for name, d in run_dirs.items():
        cfg = d / "config.yaml"
        pretrain = yaml.safe_load(cfg.read_text()).get("pretrain") if cfg.is_file() else None
        parent = by_dir.get(Path(pretrain).resolve().parent) if pretrain else None
        if parent is None or parent == name:
            starts[name] = 0.0
            continue
        best = run_dirs[parent] / "best" / "best.json"
        rows = runs[parent]
        step = (json.loads(best.read_text())["step"] if Path(pretrain).name == "best" and best.is_file()
                else max(r["step"] for r in rows))
        minute = max((r.get("time/elapsed_min", 0.0) for r in rows if r["step"] <= step), default=0.0)
        starts[name] = starts.get(parent, 0.0) + minute
    return starts


def smoothed(values: list[float], window: int) -> list[float]:
    """The trailing mean of the last `window` values at each point (fewer at the start): the trend of
    a per-step reward, whose steps are single batches and mostly noise.

    >>> smoothed([0.0, 1.0, 2.0, 3.0], 2)
    [0.0, 0.5, 1.5, 2.5]
    """
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


_PANELS = (("reward", lambda k: k.startswith(_TERM_PREFIX) and k != "reward/std"),
           ("KL to the reference", lambda k: k in ("kl/loss", "kl/mean")),
           ("dev CER (each run's eval_manifest)", lambda k: k == "eval/cer"))


def dev_set_names(run_dirs: dict[str, Path]) -> dict[str, str]:
    """Each run's dev set as its curve is labelled: the `eval_manifest` of its config.yaml, by its
    folder and file name ("target/dev.jsonl"): an SFT on the home dev set and an RL run on the
    target's are two sets, not one curve."""
    names = {}
    for name, d in run_dirs.items():
        cfg = yaml.safe_load((d / "config.yaml").read_text()) if (d / "config.yaml").is_file() else {}
        if (cfg or {}).get("eval_manifest"):
            path = Path(cfg["eval_manifest"])
            names[name] = f"{path.parent.name}/{path.name}"
    return names


def _series(runs: dict[str, list[dict]], want, by_time: bool, starts: dict[str, float],
            dev_sets: dict[str, str] | None = None):
    """(label, xs, ys) of every key `want` takes, per run (the dev CER labelled with its set, when
    `dev_sets` names it); a KL that is 0 throughout (no reference model) is no curve."""
    dev_sets = dev_sets or {}
    for name, rows in runs.items():
        for key in sorted({k for r in rows for k in r if want(k)}):
            pts = [(starts.get(name, 0.0) + r.get("time/elapsed_min", 0.0) if by_time else r["step"], r[key])
                   for r in rows if isinstance(r.get(key), (int, float))]
            if pts and (not key.startswith("kl/") or any(y for _, y in pts)):
                xs, ys = zip(*pts)
                on = f" on {dev_sets[name]}" if key == "eval/cer" and name in dev_sets else ""
                yield f"{name}: {key}{on}", list(xs), list(ys)


def plot_training(runs: dict[str, list[dict]], out: Path, starts: dict[str, float] | None = None,
                  dev_sets: dict[str, str] | None = None) -> Path | None:
    """Reward terms (the per-step values faint, their trailing mean over ~5% of the steps bold) and
    KL over steps; dev CER over minutes, each run from `starts` (start_minutes), on the set
    `dev_sets` names (dev_set_names). A panel with nothing to draw (no reference model: no KL) is
    left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    starts = starts or {}
    panels = [(title, list(_series(runs, want, title.startswith("dev"), starts, dev_sets))) for title, want in _PANELS]
    panels = [(title, series) for title, series in panels if series]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    for ax, (title, series) in zip(axes[0], panels):
        by_time = title.startswith("dev")
        for label, xs, ys in series:
            marker = "o" if len(xs) < 30 else None
            if title == "reward" and len(xs) >= 30:
                line, = ax.plot(xs, ys, alpha=0.25, lw=0.8)
                ax.plot(xs, smoothed(ys, max(5, len(ys) // 20)), color=line.get_color(), lw=1.8, label=f"{label} (mean)")
            else:
                ax.plot(xs, ys, marker=marker, ms=3, label=label)
        ax.set_title(title)
        ax.set_xlabel("minutes (a run from another's best/ or final/ starts there)" if by_time else "step")
        if by_time:
            ax.set_yscale("log")  # a plateau at 5% is as visible as the first minutes at 60%
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "training_curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def bar_panels(evals: dict[str, dict]) -> list[tuple[list[str], str, str]]:
    """(sets, metric, axis label) of `plot_cer_bars`' panels: the sets some run has a CER for, then
    those with none but a share of non-speech clips with words."""
    sets = sorted({s for e in evals.values() for s in e})

    def has(s: str, key: str) -> bool:
        return any(report.get(s, {}).get(key) is not None for report in evals.values())

    return [(p, key, label) for p, key, label in (
        ([s for s in sets if has(s, "cer")], "cer", "CER %"),
        ([s for s in sets if not has(s, "cer") and has(s, "nonspeech_hallucination_rate")],
         "nonspeech_hallucination_rate", "non-speech clips with words %")) if p]


def plot_cer_bars(evals: dict[str, dict], out: Path) -> Path | None:
    """CER per test set, one bar per run; a set with no CER (non-speech clips: no reference words)
    gets its own panel, the share of its clips each run wrote words on, never a CER bar of 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = bar_panels(evals)
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(1.6 + 1.4 * sum(len(p) for p, _, _ in panels), 3.6),
                             gridspec_kw={"width_ratios": [len(p) for p, _, _ in panels]}, squeeze=False)
    width = 0.8 / max(len(evals), 1)
    for ax, (shown, key, label) in zip(axes[0], panels):
        for i, (name, report) in enumerate(evals.items()):
            xs = [j + i * width for j in range(len(shown))]
            ys = [100 * v if (v := report.get(s, {}).get(key)) is not None else float("nan") for s in shown]
            bars = ax.bar(xs, ys, width, label=name)
            ax.bar_label(bars, labels=["" if y != y else f"{y:.1f}" for y in ys], fontsize=7)
        ax.set_xticks([j + width * (len(evals) - 1) / 2 for j in range(len(shown))], shown)
        ax.set_ylabel(label)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    path = out / "cer_by_set.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# an RL step's phases as the loop times them (`time/rollout` includes the reward's round trip)
PHASES = ("rollout", "reward", "logprobs", "advantages", "train", "sync")


def step_phases(rows: list[dict]) -> dict[str, float] | None:
    """Median seconds a step spends in each phase over the steps after the first (whose encoder
    cache and engines warm up): generation (rollout less the reward), the reward round trip, the
    old/reference log-probs, the advantages, the update, the weight sync, and the rest of the step
    (data, Ray and logging); None for a run that logs no RL phases."""
    import statistics

    timed = [r for r in rows if "time/rollout" in r and "time/step" in r][1:] or \
        [r for r in rows if "time/rollout" in r and "time/step" in r]
    if not timed:
        return None
    out = {name: statistics.median(r.get(f"time/{name}", 0.0) for r in timed) for name in PHASES}
    out["rollout"] = max(0.0, out["rollout"] - out["reward"])
    out["other"] = max(0.0, statistics.median(r["time/step"] for r in timed) - sum(out.values()))
    return out


def plot_step_time(runs: dict[str, list[dict]], out: Path) -> Path | None:
    """Where an RL step's time goes, one stacked bar per run (`step_phases`)."""
    phases = {name: p for name, rows in runs.items() if (p := step_phases(rows)) is not None}
    if not phases:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 1.6 + 0.5 * len(phases)))
    names = list(phases)
    left = [0.0] * len(names)
    for phase in (*PHASES, "other"):
        widths = [phases[n][phase] for n in names]
        ax.barh(names, widths, left=left, label=phase)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_xlabel("seconds per step (median)")
    ax.legend(fontsize=7, ncol=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.tight_layout()
    path = out / "step_time.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def comparison_rows(evals: dict[str, dict]) -> list[list[str]]:
    rows = []
    for name, report in evals.items():
        for test_set, m in report.items():
            rows.append([test_set, name, _pct(m.get("cer")), _pct(m.get("wer")), _pct(m.get("keyword_recall")),
                         _pct(m.get("language_accuracy")), str(m.get("utterances", ""))])
    return sorted(rows, key=lambda r: (r[0], r[1]))


def write_report(paths: list[str | Path], output: str | Path) -> Path:
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    runs, evals, compares = load_inputs(paths)
    run_dirs = {Path(p).name: Path(p) for p in paths if (Path(p) / "metrics.jsonl").is_file()}
    curves = plot_training(runs, out, start_minutes(run_dirs, runs), dev_set_names(run_dirs))
    bars = plot_cer_bars(evals, out)
    step_time = plot_step_time(runs, out)
    head = ["test set", "checkpoint", "CER %", "WER %", "keyword recall %", "language acc %", "utts"]
    rows = comparison_rows(evals)
    md = ["# asr-rl report", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    md += ["| " + " | ".join(r) + " |" for r in rows]
    for name, rows_ in runs.items():
        last = rows_[-1] if rows_ else {}
        steps = max((r["step"] for r in rows_), default=0)  # a step-0 row holds the start's dev eval only
        md.append(f"\nRun `{name}`: {steps} steps; last: " + ", ".join(
            f"{k} {last[k]:.4g}" for k in ("reward/mean", "eval/cer", "kl/loss", "loss/total") if k in last)
            + plateau_note(rows_))
        phases = step_phases(rows_)
        if phases is not None:
            md.append("Seconds per step (median): " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()))
    for name, section in compares.items():  # the paired bootstrap intervals (`eval --compare`)
        md += ["", f"## Comparison `{name}`", "", f"A = `{section['a']}`, B = `{section['b']}`; CER(B) - CER(A) "
               f"in points, 95% intervals over {section['resamples']} resamples; P(B<A) = share where B is lower", ""]
        md += md_table(SIGNIFICANCE_HEAD, significance_rows(section))
        if failure_rows(section):  # failure modes: rates, B - A in points, P(B better)
            md += ["", *md_table(FAILURES_HEAD, failure_rows(section))]
    md += [f"\n![{p.stem}]({p.name})" for p in (curves, bars, step_time) if p is not None]
    atomic_write_text(out / "report.md", "\n".join(md) + "\n")
    tables = _html_table(head, rows) + "".join(f"<h2>Comparison {html.escape(name)}</h2>"
                                               + _html_table(SIGNIFICANCE_HEAD, significance_rows(section))
                                               for name, section in compares.items())
    imgs = "".join(f'<p><img src="{p.name}"></p>' for p in (curves, bars, step_time) if p is not None)
    atomic_write_text(out / "report.html", f"<html><body><h1>asr-rl report</h1>{tables}{imgs}</body></html>\n")
    return out / "report.md"


def plateau_note(rows: list[dict]) -> str:
    """For a run with early stopping: where dev was best, and how long it stayed without an
    improvement after that (the flat window: what more of the same training bought on dev)."""
    key = next((k for r in rows for k in r if k.startswith("eval/best_")), None)  # eval/best_cer, _wer
    if key is None:
        return ""
    evals = [r for r in rows if key in r]
    best = evals[-1][key]
    at = next(r for r in evals if r[key] == best)
    after = [r for r in evals if r["step"] > at["step"]]
    flat = evals[-1].get("time/elapsed_min", 0.0) - at.get("time/elapsed_min", 0.0)
    name = key.removeprefix("eval/best_").upper()
    return (f"; best dev {name} {100 * best:.2f}% at step {at['step']}, then {len(after)} evaluations "
            f"({evals[-1]['step'] - at['step']} steps, {flat:.1f} minutes) without an improvement")


def _html_table(head: list[str], rows: list[list[str]]) -> str:
    cells = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return "<table border=1><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + f"</tr>{cells}</table>"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.2f}"
