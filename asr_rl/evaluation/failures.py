"""How a model fails on a test set, beyond its error rate: per set in `asr-rl eval`, and with paired
bootstrap intervals in `eval --compare`.

Units are those each line is scored in (`breakdown.scoring_unit`: characters for the languages
written without spaces, words otherwise), on the shared normalised text, aligned by jiwer; a set
that mixes such languages sums both kinds of units.

- Insertion / deletion / substitution rate: edits of that kind over reference units; what is
  written on a non-speech line counts as inserted (as in CER/WER), over no reference unit.
- Loop rate: share of hypotheses in a repetition loop, as the compare breakdown counts them
  (`breakdown.is_loop`: an n-gram repeated 3+ times in a row, more than the reference does, or a
  hypothesis running far past its reference).
- Non-speech hallucination rate: on the lines whose reference is empty (nobody speaks, `"text": ""`),
  the share where the hypothesis holds any word; and the mean number of (normalised) characters
  written on them. Undefined (None) on a set without such lines.
- Keyword error rate: the reference keywords (the manifest's `keywords`) missing from the
  hypothesis, over the keywords of the lines that have some (`keyword_hits`: whole words).
- Entity insertion rate: on lines whose metadata lists `entities` (words or phrases), the listed
  entities the hypothesis holds and the reference does not, over the listed entities the reference
  does not hold (a false-alarm rate: how often an entity is written where nobody said it).
- Verifier pass rate (`verifier.py`): share of scored lines whose verifier reward reached its
  threshold, and the mean reward.
"""
from __future__ import annotations

from dataclasses import dataclass

from asr_rl.evaluation.breakdown import is_loop, scoring_unit
from asr_rl.evaluation.significance import paired_bootstrap
from asr_rl.rewards.normalize import char_errors, keyword_hits, normalize_text, word_errors


@dataclass(frozen=True)
class LineFailures:
    """The failure counts of one scored line (module docstring)."""

    substitutions: int
    deletions: int
    insertions: int
    ref_units: int
    loop: bool
    nonspeech: bool  # the reference is empty: nobody speaks
    nonspeech_chars: int  # normalised characters written on a non-speech line (0 on speech lines)
    keywords: int
    keyword_misses: int
    entity_candidates: int  # listed entities the reference does not hold
    entity_insertions: int  # ... of which the hypothesis holds

    @property
    def hallucinated(self) -> bool:
        return self.nonspeech and self.nonspeech_chars > 0


def entities_of(result) -> tuple[str, ...]:
    """The line's `entities` metadata list (() without one); ValueError naming the line otherwise."""
    entities = (getattr(result, "metadata", None) or {}).get("entities") or []
    if not isinstance(entities, list) or not all(isinstance(e, str) for e in entities):
        raise ValueError(f"utterance {result.id}: `entities` must be a list of strings (words or phrases), "
                         f"got {entities!r}")
    return tuple(entities)


def line_failures(result) -> LineFailures:
    """Failure counts of one `UtteranceResult`.

    >>> f = line_failures(_Line("call anna", "call anna anna anna", keywords=("anna", "bob")))
    >>> (f.insertions, f.ref_units, f.loop, f.keyword_misses), line_failures(_Line("", "uh hi")).nonspeech_chars
    ((2, 2, True, 1), 5)
    """
    unit = scoring_unit(result.language)
    s, d, i, n = (char_errors if unit == "char" else word_errors)(result.reference, result.hypothesis)
    nonspeech = not normalize_text(result.reference)
    entities = entities_of(result)
    candidates = [e for e in entities if not keyword_hits(result.reference, (e,))]
    return LineFailures(
        substitutions=s, deletions=d, insertions=i, ref_units=n,
        loop=is_loop(result.reference, result.hypothesis, unit),
        nonspeech=nonspeech, nonspeech_chars=len(normalize_text(result.hypothesis)) if nonspeech else 0,
        keywords=len(result.keywords), keyword_misses=len(result.keywords) - keyword_hits(result.hypothesis,
                                                                                           result.keywords),
        entity_candidates=len(candidates), entity_insertions=keyword_hits(result.hypothesis, candidates))


@dataclass(frozen=True)
class _Line:  # a stand-in UtteranceResult for the doctests
    reference: str
    hypothesis: str
    language: str = "en"
    keywords: tuple[str, ...] = ()
    id: str = "u1"


def failure_metrics(results: list) -> dict:
    """The set-level failure metrics of scored `UtteranceResult`s (those without `error`); rates
    are None where they are undefined (no reference unit, no non-speech line, ...)."""
    ok = [r for r in results if r.error is None]
    lines = [line_failures(r) for r in ok]
    units = sum(f.ref_units for f in lines)
    nonspeech = [f for f in lines if f.nonspeech]
    keywords, candidates = sum(f.keywords for f in lines), sum(f.entity_candidates for f in lines)
    verified = [r for r in ok if getattr(r, "verifier_pass", None) is not None]
    return {
        "ref_units": units,
        **{f"{kind}_rate": _ratio(sum(getattr(f, f"{kind}s") for f in lines), units)
           for kind in ("insertion", "deletion", "substitution")},
        "loops": sum(f.loop for f in lines), "loop_rate": _ratio(sum(f.loop for f in lines), len(lines)),
        "nonspeech_lines": len(nonspeech),
        "nonspeech_hallucination_rate": _ratio(sum(f.hallucinated for f in nonspeech), len(nonspeech)),
        "nonspeech_mean_chars": _ratio(sum(f.nonspeech_chars for f in nonspeech), len(nonspeech)),
        "keyword_error_rate": _ratio(sum(f.keyword_misses for f in lines), keywords),
        "entity_lines": sum(bool(entities_of(r)) for r in ok),
        "entity_insertions": sum(f.entity_insertions for f in lines),
        "entity_insertion_rate": _ratio(sum(f.entity_insertions for f in lines), candidates),
        "verifier_lines": len(verified),
        "verifier_pass_rate": _ratio(sum(bool(r.verifier_pass) for r in verified), len(verified)),
        "verifier_mean_reward": _ratio(sum(r.verifier_reward for r in verified), len(verified)),
    }


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


# (name in the JSON, label in the tables, higher is better)
COMPARED = (("insertion_rate", "insertions / ref units", False), ("loop_rate", "loops / lines", False),
            ("nonspeech_hallucination_rate", "non-speech lines with words", False),
            ("keyword_error_rate", "keywords missed", False), ("entity_insertion_rate", "entities inserted", False),
            ("verifier_pass_rate", "verifier pass", True))


def compare_failures(a: list, b: list, n_resamples: int, seed: int) -> dict:
    """Paired bootstrap (over utterances) of each failure metric, B against A: `{name: {"a", "b",
    "delta", "delta_ci", "p_improvement" (share of resamples where B is better), "resamples",
    "higher_is_better"}}`, for the metrics both sides have (a set without non-speech lines has no
    non-speech rate; a verifier pass rate needs both sides verified). `a` and `b` are paired."""
    fa, fb = [line_failures(r) for r in a], [line_failures(r) for r in b]
    # per metric: (errors of a line, its units); units come from A's line (the same reference in B)
    per_line = {
        "insertion_rate": (lambda f: f.insertions, lambda f: f.ref_units),
        "loop_rate": (lambda f: int(f.loop), lambda f: 1),
        "nonspeech_hallucination_rate": (lambda f: int(f.hallucinated), lambda f: int(f.nonspeech)),
        "keyword_error_rate": (lambda f: f.keyword_misses, lambda f: f.keywords),
        "entity_insertion_rate": (lambda f: f.entity_insertions, lambda f: f.entity_candidates)}
    out = {}
    for name, (errors, units) in per_line.items():
        n = [units(f) for f in fa]
        if sum(n):
            out[name] = _interval([errors(f) for f in fa], [errors(f) for f in fb], n, n_resamples, seed)
    if all(r.verifier_pass is not None for r in (*a, *b)):
        fails = [[int(not r.verifier_pass) for r in side] for side in (a, b)]
        out["verifier_pass_rate"] = _interval(*fails, [1] * len(a), n_resamples, seed, higher_is_better=True)
    return out


def _interval(errors_a: list, errors_b: list, units: list, n_resamples: int, seed: int,
              higher_is_better: bool = False) -> dict:
    """`paired_bootstrap` of a rate; with `higher_is_better` the errors are failures (1 - pass) and
    the result is turned back into the pass rate (its delta and interval negated)."""
    p = paired_bootstrap(errors_a, errors_b, units, n_resamples, seed)
    sign, base = (-1, 1) if higher_is_better else (1, 0)
    lo, hi = sorted(sign * x for x in p.delta_ci)
    return {"a": base + sign * p.cer_a, "b": base + sign * p.cer_b, "delta": sign * p.delta, "delta_ci": [lo, hi],
            "p_improvement": p.p_improvement, "resamples": p.resamples, "higher_is_better": higher_is_better}


def failure_lines(report: dict) -> list[str]:
    """The failure-modes block of `asr-rl eval`'s table, one row per set (`report`: name -> SetMetrics)."""
    head = (f"{'failure modes':<14}{'ins%':>7}{'del%':>7}{'sub%':>7}{'loops%':>8}{'non-speech':>11}{'halluc%':>9}"
            f"{'chars':>7}{'kw err%':>9}{'entity ins%':>12}{'verifier pass%':>16}{'mean reward':>13}")
    rows = ["", head, "-" * len(head)]
    for name, m in report.items():
        rows.append(f"{name:<14}{_pct(m.insertion_rate):>7}{_pct(m.deletion_rate):>7}{_pct(m.substitution_rate):>7}"
                    f"{_pct(m.loop_rate):>8}{m.nonspeech_lines:>11}{_pct(m.nonspeech_hallucination_rate):>9}"
                    f"{_num(m.nonspeech_mean_chars):>7}{_pct(m.keyword_error_rate):>9}"
                    f"{_pct(m.entity_insertion_rate):>12}{_pct(m.verifier_pass_rate):>16}"
                    f"{_num(m.verifier_mean_reward):>13}")
    return rows


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"
