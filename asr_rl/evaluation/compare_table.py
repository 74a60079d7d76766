"""Tables of an `eval --compare` section (`compare.py`): as text for the console, as Markdown for
`report.md` and `asr-rl report`. Rates are shown in percent; a CER difference in percentage points.
"""
from __future__ import annotations

from asr_rl.evaluation.failures import COMPARED

SIGNIFICANCE_HEAD = ["test set", "utts", "CER A %", "CER B %", "B-A pts [95% CI]", "rel % [95% CI]", "P(B<A)",
                     "speakers", "by speaker [95% CI]", "P(B<A) spk"]
ERRORS_HEAD = ["test set", "model", "S/D/I of ref units", "kw err % names", "kw err % digits", "loops"]


def significance_rows(report: dict) -> list[list[str]]:
    """One row per set: CERs, the utterance bootstrap, and the speaker bootstrap when there is one."""
    rows = []
    for name, s in report["test_sets"].items():
        u, spk = s["utterance"], s.get("speaker")
        n = str(s["utterances"]) + (f" ({s['left_out']} left out)" if s.get("left_out") else "")
        if u is None:  # only non-speech lines: no reference character, no CER
            rows.append([name, n, *["-"] * (len(SIGNIFICANCE_HEAD) - 2)])
            continue
        rel = (f"{_signed(100 * u['relative'], 1)} [{_signed(100 * u['relative_ci'][0], 1)}, "
               f"{_signed(100 * u['relative_ci'][1], 1)}]" if u.get("relative_ci") else "-")
        rows.append([name, n, f"{100 * u['cer_a']:.2f}", f"{100 * u['cer_b']:.2f}", _delta(u), rel,
                     f"{u['p_improvement']:.3f}", str(s.get("speakers") or "-"),
                     _ci(spk["delta_ci"]) if spk else "-", f"{spk['p_improvement']:.3f}" if spk else "-"])
    return rows


def error_rows(report: dict) -> list[list[str]]:
    """Per set and side: edits by unit, keyword error rate by kind, repetition loops."""
    rows = []
    for name, s in report["test_sets"].items():
        for label in ("a", "b"):
            bd = s[label]["breakdown"]
            edits = "; ".join(f"{unit} {e['substitutions']}/{e['deletions']}/{e['insertions']} of {e['reference']}"
                              for unit, e in bd["edits"].items()) or "-"
            kws = [bd["keywords"].get(kind) for kind in ("names", "digits")]
            rows.append([name, label.upper(), edits,
                         *(f"{100 * k['error_rate']:.2f} ({k['missed']}/{k['keywords']})" if k else "-" for k in kws),
                         str(bd["loops"])])
    return rows


FAILURES_HEAD = ["test set", "failure metric", "A %", "B %", "B-A pts [95% CI]", "P(B better)"]


def failure_rows(report: dict) -> list[list[str]]:
    """Per set, each failure metric both sides have (`failures.py`): rates, the bootstrap interval
    of B minus A, and the share of resamples where B is better (lower; higher for a pass rate)."""
    rows = []
    for name, s in report["test_sets"].items():
        for key, label, _ in COMPARED:
            f = (s.get("failures") or {}).get(key)
            if f:
                rows.append([name, label, f"{100 * f['a']:.2f}", f"{100 * f['b']:.2f}", _delta(f),
                             f"{f['p_improvement']:.3f}"])
    return rows


BIASING_HEAD = ["test set", "B-WER A %", "B-WER B %", "B-A pts [95% CI]", "P(B<A)", "U-WER A %", "U-WER B %",
                "B-A pts [95% CI]", "P(B<A)", "false biasing A / B"]


def biasing_rows(report: dict) -> list[list[str]]:
    """Sets evaluated with context lists: the bootstraps of B-WER and U-WER, and false biasing."""
    rows = []
    for name, s in report["test_sets"].items():
        bias = s.get("biasing")
        if not bias:
            continue
        cells = []
        for key in ("b_wer", "u_wer"):
            u = bias.get(key)
            cells += ([f"{100 * u['cer_a']:.2f}", f"{100 * u['cer_b']:.2f}", _delta(u), f"{u['p_improvement']:.3f}"]
                      if u else ["-"] * 4)
        rows.append([name, *cells, f"{bias['false_biasing']['a']} / {bias['false_biasing']['b']}"])
    return rows


def format_compare(report: dict) -> str:
    """Both tables as aligned text, headed by what A and B are and how the bootstrap was drawn."""
    head = (f"A: {report['a']}\nB: {report['b']}\npaired bootstrap of CER(B) - CER(A): {report['resamples']} "
            f"resamples, seed {report['seed']}; P(B<A) = share of resamples where B's CER is lower")
    tables = [head, _text_table(SIGNIFICANCE_HEAD, significance_rows(report)),
              _text_table(ERRORS_HEAD, error_rows(report))]
    if biasing_rows(report):
        tables.append(_text_table(BIASING_HEAD, biasing_rows(report)))
    if failure_rows(report):
        tables.append(_text_table(FAILURES_HEAD, failure_rows(report)))
    return "\n\n".join(tables)


def compare_markdown(report: dict, title: str | None = None) -> str:
    lines = [f"# {title or 'Comparison'}", "", f"A = `{report['a']}`, B = `{report['b']}`; paired bootstrap "
             f"over utterances (and over speakers where the manifest names them), {report['resamples']} "
             f"resamples, seed {report['seed']}; CER difference in percentage points, 95% percentile "
             "intervals; P(B<A) = share of resamples where B's CER is lower.", ""]
    lines += md_table(SIGNIFICANCE_HEAD, significance_rows(report)) + [""]
    lines += ["Errors: S/D/I in words (character-scored languages: characters); keyword error rate by kind "
              "(missed/keywords); loops = hypotheses repeating an n-gram 3+ times in a row or running far "
              "past the reference.", ""]
    lines += md_table(ERRORS_HEAD, error_rows(report))
    if biasing_rows(report):
        lines += ["", "With context lists: B-WER / U-WER = errors on reference units in / not in the list (Le et al. "
                  "2021), paired bootstrap of B minus A; false biasing = listed items output more often than said.",
                  "", *md_table(BIASING_HEAD, biasing_rows(report))]
    if failure_rows(report):
        lines += ["", "Failure modes: insertions over reference units (words; characters for zh), hypotheses in a "
                  "repetition loop, non-speech lines (empty reference) where words were written, reference keywords "
                  "missed, listed entities written where the reference has none, the verifier's pass rate; paired "
                  "bootstrap over utterances of B minus A in points; P(B better) = share of resamples where B's rate "
                  "is better (lower; higher for the pass rate).", "", *md_table(FAILURES_HEAD, failure_rows(report))]
    return "\n".join(lines) + "\n"


def md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]


def _text_table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(c) for c in col) for col in zip(head, *rows)]

    def fmt(row: list[str]) -> str:  # the first column (the set's name) to the left, numbers to the right
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))

    return "\n".join([fmt(head), "-" * len(fmt(head))] + [fmt(r) for r in rows])


def _delta(u: dict) -> str:
    return f"{_signed(100 * u['delta'])} {_ci(u['delta_ci'])}"


def _ci(ci) -> str:
    return f"[{_signed(100 * ci[0])}, {_signed(100 * ci[1])}]"


def _signed(x: float, digits: int = 2) -> str:
    return f"{x:+.{digits}f}"
