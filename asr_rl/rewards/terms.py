"""Built-in reward terms: pure functions from samples to one value per sample (those that read a
sample's whole group, such as `consensus`, are group_terms.py, registered here).

Each term is registered by name; a config combines them with weights (`reward.terms: {cer: 1.0,
keyword: 0.3}`) and passes per-term options (`reward.term_options: {cer: {floor: -1.0}}`).
All text is compared in the normalised form `asr-rl eval` scores (rewards/normalize.py).

Each entry declares whether it needs the reference transcript (`needs_reference`, True unless
registered otherwise). On a line without one (unlabelled audio, `Sample.reference is None`) only the
terms that need none score it, and its reward is their weighted sum (combine.py): every sample of a
group is one utterance, so the group's members are always compared under the same terms.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from asr_rl.data.languages import CHARACTER_SCORED, language_code
from asr_rl.registry import Registry
from asr_rl.rewards.base import RewardError, Sample
from asr_rl.rewards.group_terms import consensus_options, consensus_term
from asr_rl.rewards.groups import group_languages
from asr_rl.rewards.normalize import (cer, char_errors, keyword_hits, normalize_text, repeated_ngram_share,  # noqa: F401
                                      script_share, wer, word_errors)
from asr_rl.rewards.silence import MIN_SPEECH, silence_scores
from asr_rl.rewards.term_options import acoustic_options, plausibility_options, silence_options

TermFn = Callable[..., list[float]]


@dataclass(frozen=True)
class TermSpec:
    needs_reference: bool = True  # False: scores a hypothesis from the audio's facts alone
    needs_audio: bool = False  # True: listens to the sample's audio (`Sample.audio`), e.g. `acoustic`
    # True: a sample's score reads the other samples of its group (`Sample.group_id`), e.g.
    # `consensus`; every caller then hands it whole groups (rewards/groups.py: `group_chunks`)
    needs_group: bool = False
    min_group_size: int = 1  # the fewest samples an utterance it can score (consensus: 2)
    # the bounds of its options (rewards/term_options.py), checked at config load: ValueError if out
    check_options: Callable[[dict], None] | None = None


# A term maps a batch of `Sample`s to one score per sample, from its own sample (and, with
# `needs_group`, the other samples of its group: rewards/group_terms.py).
TERMS: Registry[TermFn] = Registry("reward term", TermSpec)


def register_term(name: str, needs_reference: bool = True, needs_audio: bool = False, needs_group: bool = False,
                  min_group_size: int = 1, check_options: Callable[[dict], None] | None = None
                  ) -> Callable[[TermFn], TermFn]:
    return TERMS.register(name, needs_reference=needs_reference, needs_audio=needs_audio, needs_group=needs_group,
                          min_group_size=min_group_size, check_options=check_options)


def get_term(name: str) -> TermFn:
    return TERMS.get(name)


def check_group_size(terms: Iterable[str], n: int, setting: str) -> None:
    """ValueError when a term in `terms` needs more samples an utterance than the `n` that `setting`
    (e.g. `rollout.n_samples_per_prompt`) gives it."""
    for name in terms:
        need = TERMS.spec(name).min_group_size
        if n < need:
            raise ValueError(f"reward term {name!r} scores each sample against the other samples of its utterance "
                             f"and needs at least {need} of them: {setting} is {n}; set it to {need} or more")


register_term("consensus", needs_reference=False, needs_group=True, min_group_size=2,
              check_options=consensus_options)(consensus_term)


def error_rate(s: Sample) -> float:
    """CER for languages written without spaces (zh, ja, ...), WER otherwise."""
    return cer(s.reference, s.hypothesis) if s.language in CHARACTER_SCORED else wer(s.reference, s.hypothesis)


@register_term("cer")
def cer_term(samples: list[Sample], floor: float = 0.0) -> list[float]:
    """1 - CER on normalised text, floored at `floor` (CER exceeds 1 with many insertions).

    >>> cer_term([Sample("call ana", "call anna")])
    [0.8888888888888888]
    """
    return [max(floor, 1.0 - cer(s.reference, s.hypothesis)) for s in samples]


@register_term("acoustic", needs_reference=False, needs_audio=True, check_options=acoustic_options)
def acoustic_term(samples: list[Sample], scorer: str | None = None, encoder_cache: str | None = None) -> list[float]:
    """exp(log P(hypothesis | audio) / frames) under the acoustic scorer in folder `scorer` (made by
    `asr-rl train scorer`): a term that listens and needs no transcript (rewards/acoustic.py);
    `encoder_cache`: the SFT's encoder-cache folder, whose states it reads instead of encoding."""
    from asr_rl.rewards.acoustic import acoustic_scores  # torch and the scorer's models, only when used

    return acoustic_scores(samples, scorer, encoder_cache)


@register_term("plausibility", needs_reference=False, check_options=plausibility_options)
def plausibility_term(samples: list[Sample], model: str | None = None) -> list[float]:
    """How plausible a judge finds each transcript given its context list, no reference
    (rewards/judge.py: a reward model from `asr-rl train rm` on `asr-rl data judge-pairs`, in folder
    `model`), squashed to (0, 1); as a term it adds to the listening terms (`reward.judge=DIR` is
    the judge alone)."""
    from asr_rl.rewards.judge import judge_scores  # torch and the judge's model, only when used

    return judge_scores(samples, model)


@register_term("silence", needs_reference=False, needs_audio=True, check_options=silence_options)
def silence_term(samples: list[Sample], min_speech: float = MIN_SPEECH, threshold: float = 0.5,
                 graded: bool = False) -> list[float]:
    """Where a voice-activity detector (silero-vad) hears under `min_speech` seconds of speech: +1 for
    an empty transcript, -1 for words (`graded`: -n / (n + 1) for n words); 0 where somebody speaks
    (rewards/silence.py)."""
    return silence_scores(samples, min_speech, threshold, graded)


@register_term("wer")
def wer_term(samples: list[Sample], floor: float = 0.0) -> list[float]:
    """1 - WER on normalised text, floored at `floor`.

    >>> wer_term([Sample("call ana now", "call anna now")])
    [0.6666666666666667]
    """
    return [max(floor, 1.0 - wer(s.reference, s.hypothesis)) for s in samples]


@register_term("wer_gated")
def wer_gated_term(samples: list[Sample], gate: float = 0.5, above_gate: float = -1.0) -> list[float]:
    """Token-level reward below an error-rate gate, sentence-level above it.

    With error rate e (CER for zh, WER otherwise): r = 1 - e when e <= gate, else `above_gate`.
    A plain 1 - WER barely separates a hallucinated sample (e = 1.4) from a poor one (e = 0.9);
    gating makes every sample past the gate equally bad and concentrates the signal where the
    transcript is nearly right (Mega-ASR reports this mattered where 1 - WER moved little).

    >>> wer_gated_term([Sample("call anna now", "call anna now"), Sample("x y z", "call anna now")])
    [1.0, -1.0]
    """
    out = []
    for s in samples:
        e = error_rate(s)
        out.append(1.0 - e if e <= gate else above_gate)
    return out


@register_term("keyword")
def keyword_term(samples: list[Sample], insertion_penalty: float = 0.5) -> list[float]:
    """Recall of the reference's keywords in the hypothesis, minus a penalty per inserted hotword.

    An inserted hotword is an entry of the sample's own hotword list (its context list,
    `Sample.context`, and the manifest's older `hotwords` field, `Sample.metadata["hotwords"]`: the
    user's contact names or rooms) that appears in the hypothesis but not in its reference: a hallucinated contact or room is worse than a missed one.
    r = hits / n_keywords - insertion_penalty * insertions / max(n_keywords, 1); a reference without
    keywords scores 1 minus the insertion penalty. A sample's score depends on that sample alone, so
    a batch scored whole or in chunks (the Ray reward pool, the remote client) scores the same.

    >>> s = [Sample("call anna in the kitchen", "call anna", keywords=("anna",),
    ...             metadata={"hotwords": ["anna", "kitchen", "bob"]}),
    ...      Sample("call bob", "call bob", keywords=("bob", "kitchen"))]
    >>> keyword_term(s)
    [0.5, 0.5]
    >>> keyword_term([Sample("call bob", "call anna", keywords=("anna",), context=("anna", "bob"))])
    [-0.5]
    """
    out = []
    for s in samples:
        hits = keyword_hits(s.hypothesis, s.keywords) if s.keywords else 0
        recall = hits / len(s.keywords) if s.keywords else 1.0
        ref = normalize_text(s.reference)
        hotwords = _hotwords(s)
        foreign = [k for k in hotwords if k not in s.keywords and normalize_text(k) not in ref]
        insertions = keyword_hits(s.hypothesis, foreign)
        out.append(recall - insertion_penalty * insertions / max(len(s.keywords), 1))
    return out


@register_term("biasing")
def biasing_term(samples: list[Sample], false_penalty: float = 1.0) -> list[float]:
    """Contextual biasing (the sample's context list, `Sample.context`): credit for listed items the
    reference holds and the hypothesis says, a penalty for listed items the hypothesis holds that the
    reference does not (a listed name forced in for another word). RLBR (arXiv:2601.13409) rewards
    biasing words this way. With L the listed items in the reference, h of them in the hypothesis,
    and f listed items in the hypothesis but not the reference:
    r = h / |L| - false_penalty * f / max(|L|, 1); with no listed item in the reference r = 1 - the
    penalty term (a sample without a list scores 1: the term is silent there).

    >>> ctx = ("grace", "ben", "kitchen")
    >>> biasing_term([Sample("call grace", "call grace", context=ctx), Sample("call ben", "call grace", context=ctx),
    ...               Sample("call mom", "call mom", context=ctx), Sample("call mom", "call grace")])
    [1.0, -1.0, 1.0, 1.0]
    """
    out = []
    for s in samples:
        ref = normalize_text(s.reference)
        listed = [c for c in dict.fromkeys(s.context) if normalize_text(c)]
        said = [c for c in listed if normalize_text(c) in ref]
        false = keyword_hits(s.hypothesis, [c for c in listed if c not in said])
        recall = keyword_hits(s.hypothesis, said) / len(said) if said else 1.0
        out.append(recall - false_penalty * false / max(len(said), 1))
    return out


def _hotwords(s: Sample) -> list[str]:
    words = (s.metadata or {}).get("hotwords") or []
    if isinstance(words, str) or not all(isinstance(w, str) for w in words):
        raise RewardError(f"sample {s.prompt!r}: metadata 'hotwords' must be a list of strings, got {words!r}")
    return sorted(set(words) | set(s.context))


@register_term("language", needs_reference=False, needs_group=True)
def language_term(samples: list[Sample]) -> list[float]:
    """The hypothesis is in its line's language: script share x tag agreement.

    The line's language is its manifest `language` (logged by the deployment on unlabelled audio);
    where there is none, the majority of its group's predicted language tags (rewards/groups.py), so
    that a Mandarin utterance whose samples mostly come out Mandarin penalises the one in English.
    The tag factor is 0 when the model wrote a language tag (`language Chinese<asr_text>`) that
    disagrees with that language, 1 when it agrees or there is no tag.

    >>> language_term([Sample("打开灯", "打开灯", "zh", predicted_language="Chinese"),
    ...                Sample("打开 light", "打开灯", "zh"), Sample("call anna", "call anna", "en",
    ...                predicted_language="Chinese")])
    [1.0, 0.2857142857142857, 0.0]
    >>> language_term([Sample(h, None, predicted_language=t) for h, t in
    ...                (("打开灯", "Chinese"), ("打开灯", "Chinese"), ("open the light", "English"))])
    [1.0, 1.0, 0.0]
    """
    out = []
    for s, lang in zip(samples, group_languages(samples)):
        tag_ok = s.predicted_language is None or lang is None or language_code(s.predicted_language) == lang
        out.append(script_share(s.hypothesis, lang, s.reference or "") * float(tag_ok))
    return out


@register_term("fluency", needs_reference=False)
def fluency_term(samples: list[Sample], ngram: int = 3, max_length_ratio: float = 1.5,
                 max_chars_per_second: float = 25.0, repetition_weight: float = 1.0, length_weight: float = 1.0,
                 empty_penalty: float = 1.0, malformed_penalty: float = 1.0) -> list[float]:
    """1 minus penalties for the failure modes RL on ASR drifts into (hallucination loops):

    repeated n-grams (share of repeated `ngram`-grams), runaway length (characters beyond
    `max_length_ratio` x the reference, or beyond `max_chars_per_second` x the audio duration, as
    a share of the allowed length, capped at 1; without a reference, the duration alone), empty
    output, and malformed output (no `<asr_text>` section). Clipped to [-1, 1].

    >>> fluency_term([Sample("call anna", "call anna"), Sample("", "call anna"),
    ...               Sample("call anna", "call anna", well_formed=False)])
    [1.0, 0.0, 0.0]
    """
    out = []
    for s in samples:
        hyp = normalize_text(s.hypothesis)
        penalty = repetition_weight * repeated_ngram_share(s.hypothesis, ngram)
        allowed = max_length_ratio * max(len(normalize_text(s.reference)), 1) if s.reference is not None else None
        if s.duration:
            allowed = min(allowed, max_chars_per_second * s.duration) if s.reference else max_chars_per_second * s.duration
        if allowed:
            penalty += length_weight * min(1.0, max(0.0, len(hyp) - allowed) / allowed)
        penalty += empty_penalty * (not hyp) + malformed_penalty * (not s.well_formed)
        out.append(max(-1.0, min(1.0, 1.0 - penalty)))
    return out


# --- how a transcript fails (Mega-ASR, Xie et al. 2026, arXiv:2605.19833) ----------------------
# Past ~30% error a transcript stops being a near miss and breaks down as a whole: it is empty,
# leaves most of the utterance out, or is fluent text the audio does not hold (a hallucination or a
# repetition loop). A plain 1 - error rate gives all of these about the same low reward, so the
# group's advantages cannot tell them apart; these terms can.
def _edits(s: Sample, unit: str) -> tuple[int, int, int, int]:
    """(substitutions, deletions, insertions, reference length) in `unit`: char | word | auto
    (characters for languages written without spaces, words otherwise)."""
    if unit not in ("auto", "char", "word"):
        raise ValueError(f"unit must be auto, char or word, got {unit!r}")
    chars = unit == "char" or (unit == "auto" and s.language in CHARACTER_SCORED)
    return char_errors(s.reference, s.hypothesis) if chars else word_errors(s.reference, s.hypothesis)


@register_term("omission")
def omission_term(samples: list[Sample], unit: str = "auto") -> list[float]:
    """-(deleted reference units / reference units): what the transcript leaves out; -1 when empty.

    >>> omission_term([Sample("call anna", "call anna now"), Sample("", "call anna")])
    [-0.3333333333333333, -1.0]
    """
    out = []
    for s in samples:
        _, d, _, n = _edits(s, unit)
        out.append(-d / max(n, 1))
    return out


@register_term("hallucination")
def hallucination_term(samples: list[Sample], unit: str = "auto", ngram: int = 3) -> list[float]:
    """-(inserted units / reference units + share of repeated `ngram`-grams), clipped to [-1, 0]:
    text the audio does not hold, and repetition loops.

    >>> hallucination_term([Sample("call anna now please", "call anna"), Sample("call anna", "call anna")])
    [-1.0, 0.0]
    """
    out = []
    for s in samples:
        _, _, ins, n = _edits(s, unit)
        out.append(max(-1.0, -(ins / max(n, 1) + repeated_ngram_share(s.hypothesis, ngram))) + 0.0)  # no -0.0
    return out


@register_term("empty")
def empty_term(samples: list[Sample]) -> list[float]:
    """-1 for an empty transcript of a non-empty reference, else 0.

    >>> empty_term([Sample("", "call anna"), Sample("x", "call anna")])
    [-1.0, 0.0]
    """
    return [-1.0 if not normalize_text(s.hypothesis) and normalize_text(s.reference) else 0.0 for s in samples]


@register_term("repetition", needs_reference=False)
def repetition_term(samples: list[Sample], ngram: int = 3) -> list[float]:
    """-(share of repeated `ngram`-grams): a repetition loop, seen without a reference.

    >>> repetition_term([Sample("call bob call bob call bob", None), Sample("call anna now", None)])
    [-0.5, 0.0]
    """
    return [-repeated_ngram_share(s.hypothesis, ngram) + 0.0 for s in samples]


@register_term("speaking_rate", needs_reference=False)
def speaking_rate_term(samples: list[Sample], low: float = 2.0, high: float = 25.0) -> list[float]:
    """How far the transcript's characters per second of audio fall outside [`low`, `high`], as a
    share of the bound, in [-1, 0]: an empty or cut-short transcript of speech below, a run-on or a
    hallucinated tail above. Needs the duration, not the reference (0 when the duration is unknown).

    >>> speaking_rate_term([Sample("call anna", None, duration=1.0), Sample("", None, duration=1.0),
    ...                     Sample("c", None, duration=1.0), Sample("x" * 50, None, duration=1.0)])
    [0.0, -1.0, -0.5, -1.0]
    """
    out = []
    for s in samples:
        if not s.duration:
            out.append(0.0)
            continue
        rate = len(normalize_text(s.hypothesis).replace(" ", "")) / s.duration
        below, above = max(0.0, low - rate) / low, max(0.0, rate - high) / high
        out.append(-min(1.0, below + above) + 0.0)
    return out


@register_term("dg_wer")
def dual_granularity_term(samples: list[Sample], gate: float = 0.3, unit: str = "auto", empty: float = -0.5,
                          ngram: int = 3) -> list[float]:
    """Dual-granularity error-gated reward (after Mega-ASR's DG-WGPO): token level below the gate,
    sentence level above it, where transcripts fail as a whole.

    With error rate e = (S + D + I) / N in `unit`:
      e <= gate:  r = 1 - e                                   (a near miss: grade the words)
      e >  gate:  r = (1 - gate) * H / N - I / N - rep        (H = N - S - D reference units recognised,
                                                               rep = share of repeated n-grams), >= -1
      empty:      r = `empty`
    so a partial transcript that is right as far as it goes keeps credit for what it holds, a wrong
    attempt scores about 0, an empty one `empty`, and a hallucination or loop below that.

    >>> dual_granularity_term([Sample("call anna", "call anna"), Sample("call", "call anna now please"),
    ...                        Sample("", "call anna"), Sample("call bob call bob call bob", "call anna")])
    [1.0, 0.175, -0.5, -1.0]
    """
    out = []
    for s in samples:
        sub, d, ins, n = _edits(s, unit)
        n = max(n, 1)
        e = (sub + d + ins) / n
        if not normalize_text(s.hypothesis):
            out.append(empty)
        elif e <= gate:
            out.append(1.0 - e)
        else:
            hits = n - sub - d
            out.append(max(-1.0, (1.0 - gate) * hits / n - ins / n - repeated_ngram_share(s.hypothesis, ngram)))
    return out


# The default multi-term ASR reward (`builtin:asr`): accuracy first, then what users notice.
DEFAULT_ASR_TERMS = {"cer": 1.0, "keyword": 0.3, "language": 0.2, "fluency": 0.2}
