"""Corpus-level ASR metrics over (reference, hypothesis) pairs, on the shared normalised text.

CER and WER are corpus-level (total edits / total reference units), as jiwer computes them over a
list. WER covers only languages written with spaces (CER alone is meaningful for zh); keyword recall
is the share of reference keywords found in the normalised hypothesis; language accuracy compares
the language the model wrote (`language <Name>`) with the manifest's. A non-speech line (empty
reference: nobody speaks) adds what was written there as insertions and no reference unit, so a set
of only such lines has no CER or WER (None, shown as "-"); its failure modes (`failures.py`) say how
much the model wrote there.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from asr_rl.data.languages import CHARACTER_SCORED, language_code
from asr_rl.evaluation.biasing import BiasCounts, bias_counts
from asr_rl.evaluation.failures import failure_metrics
from asr_rl.rewards.normalize import char_errors, keyword_hits, word_errors


@dataclass
class UtteranceResult:
    id: str
    reference: str
    hypothesis: str
    language: str
    keywords: tuple[str, ...] = ()
    predicted_language: str | None = None  # a name ("English") or code, as the model wrote it
    duration: float = 0.0
    error: str | None = None  # why the utterance could not be decoded (audio failed to load, ...)
    speaker: str | None = None  # the manifest's optional `speaker` (blocks of `eval --compare`)
    context: tuple[str, ...] = ()  # the context list the prompt named (contextual biasing)
    metadata: dict = field(default_factory=dict)  # the manifest line's other fields (e.g. `entities`)
    verifier_reward: float | None = None  # with `eval --verifier`: its reward, and whether it passed
    verifier_pass: bool | None = None


@dataclass
class SetMetrics:
    utterances: int = 0
    failed: int = 0
    hours: float = 0.0
    cer: float | None = None
    wer: float | None = None
    substitutions: int = 0
    deletions: int = 0
    insertions: int = 0
    ref_chars: int = 0
    ref_words: int = 0
    keyword_recall: float | None = None
    keywords: int = 0
    language_accuracy: float | None = None
    rtf: float | None = None
    per_language: dict = field(default_factory=dict)
    # with context lists (evaluation/biasing.py): error rates on listed and unlisted reference
    # units (Le et al. 2021), listed units, and listed items output more often than said
    b_wer: float | None = None
    u_wer: float | None = None
    biased_units: int = 0
    false_biasing: int = 0
    # failure modes (evaluation/failures.py): edit rates in each line's scoring unit (words;
    # characters for zh, ...), repetition loops, words written where nobody speaks, keywords
    # missed, entities inserted, the verifier's pass rate; None where undefined
    ref_units: int = 0
    insertion_rate: float | None = None
    deletion_rate: float | None = None
    substitution_rate: float | None = None
    loops: int = 0
    loop_rate: float | None = None
    nonspeech_lines: int = 0
    nonspeech_hallucination_rate: float | None = None
    nonspeech_mean_chars: float | None = None
    keyword_error_rate: float | None = None
    entity_lines: int = 0
    entity_insertions: int = 0
    entity_insertion_rate: float | None = None
    verifier_lines: int = 0
    verifier_pass_rate: float | None = None
    verifier_mean_reward: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)



def score_set(results: list[UtteranceResult], decode_seconds: float | None = None) -> SetMetrics:
    """Aggregate metrics of one test set; failed utterances are counted, not scored."""
    ok = [r for r in results if r.error is None]
    m = SetMetrics(utterances=len(ok), failed=len(results) - len(ok), hours=sum(r.duration for r in ok) / 3600)
    if not ok:
        return m
    _add_error_rates(m, ok)
    n_kw = sum(len(r.keywords) for r in ok)
    if n_kw:
        m.keywords = n_kw
        m.keyword_recall = sum(keyword_hits(r.hypothesis, r.keywords) for r in ok) / n_kw
    predicted = [r for r in ok if r.predicted_language is not None]
    if predicted:
        m.language_accuracy = sum(language_code(r.predicted_language) == r.language for r in predicted) / len(ok)
    if any(r.context for r in ok):
        total = sum((bias_counts(r.reference, r.hypothesis, r.context, r.language) for r in ok), BiasCounts())
        m.b_wer, m.u_wer = total.b_wer, total.u_wer
        m.biased_units, m.false_biasing = total.biased_ref, total.false_biasing
    for key, value in failure_metrics(ok).items():
        setattr(m, key, value)
    if decode_seconds is not None and m.hours > 0:
        m.rtf = decode_seconds / (m.hours * 3600)
    for lang in sorted({r.language for r in ok}):
        sub = SetMetrics()
        _add_error_rates(sub, [r for r in ok if r.language == lang])
        m.per_language[lang] = {"utterances": sum(r.language == lang for r in ok), "cer": sub.cer, "wer": sub.wer}
    return m


def _add_error_rates(m: SetMetrics, results: list[UtteranceResult]) -> None:
    s = d = i = n = 0
    ws = wd = wi = wn = 0
    for r in results:
        cs, cd, ci, cn = char_errors(r.reference, r.hypothesis)
        s, d, i, n = s + cs, d + cd, i + ci, n + cn
        if r.language not in CHARACTER_SCORED:
            a, b, c, k = word_errors(r.reference, r.hypothesis)
            ws, wd, wi, wn = ws + a, wd + b, wi + c, wn + k
    m.substitutions, m.deletions, m.insertions, m.ref_chars, m.ref_words = s, d, i, n, wn
    m.cer = (s + d + i) / n if n else None
    m.wer = (ws + wd + wi) / wn if wn else None
