"""`asr-rl eval --vad-filter`: where a voice-activity detector hears nobody speak, the transcript is
empty and the model is not run.

What faster-whisper's `vad_filter` and WhisperX do in front of Whisper, for the failure Calm-Whisper
(arXiv:2505.12969) measured: an ASR model writes words on room tone, music and a line's hiss. The
detector is the silence reward term's (silero-vad, rewards/silence.py: `speech_seconds`, the same
`min_speech`), so the gate at inference and the reward in training agree on what silence is. Its
cost: an utterance the detector misses (a whisper, one short word under `min_speech`) loses its words;
`asr-rl eval` reports the deletions like any other, so the price shows on the speech sets.

It wraps a decode (greedy or beam by default, or `--rerank`'s), and gives it only the utterances
with speech; a line whose audio does not load goes to that decode, which reports it as it always has.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Callable

from asr_rl.data.audio import AudioError
from asr_rl.data.manifest import Utterance
from asr_rl.evaluation.metrics import UtteranceResult
from asr_rl.rewards.silence import MIN_SPEECH, speech_seconds

log = logging.getLogger("asr_rl.eval")

# a decode as `evaluate_manifest` takes it: (policy, utterances, batch_size, max_new_tokens, progress)
Decode = Callable[..., list[UtteranceResult]]


@dataclass(frozen=True)
class VadFilter:
    """`decode`: what the utterances with speech go to (None: `transcribe` with `num_beams`);
    `min_speech`: seconds of detected speech below which nobody speaks."""

    decode: Decode | None = None
    num_beams: int = 1
    min_speech: float = MIN_SPEECH

    def __post_init__(self) -> None:
        # nan would empty every clip (nothing is >= nan), inf too, and a negative value turns the gate off
        if not (isinstance(self.min_speech, (int, float)) and math.isfinite(self.min_speech) and self.min_speech >= 0):
            raise ValueError(f"--vad-min-speech is seconds of detected speech, a finite number >= 0; got "
                             f"{self.min_speech!r}")

    def heard(self, u: Utterance) -> bool:
        try:
            return speech_seconds(u.audio) >= self.min_speech
        except AudioError:  # not the gate's to report: the decode names the line and counts it failed
            return True

    def __call__(self, policy, utterances: list[Utterance], batch_size: int = 16, max_new_tokens: int = 96,
                 progress: bool = False) -> list[UtteranceResult]:
        from asr_rl.evaluation.evaluate import transcribe  # evaluate.py takes this object as its decode

        heard = [self.heard(u) for u in utterances]
        speech = [u for u, h in zip(utterances, heard) if h]
        if self.decode is None:
            decoded = transcribe(policy, speech, batch_size, self.num_beams, max_new_tokens, progress)
        else:
            decoded = self.decode(policy, speech, batch_size, max_new_tokens, progress)
        log.info("--vad-filter: %d of %d utterances with nobody speaking get an empty transcript, not decoded",
                 len(utterances) - len(speech), len(utterances))
        results = iter(decoded)  # in the order of `speech`, as every decode returns them
        return [next(results) if h else _silent(u) for u, h in zip(utterances, heard)]


def _silent(u: Utterance) -> UtteranceResult:
    """The empty transcript of a line where nobody speaks (its duration from the manifest, if given)."""
    return UtteranceResult(u.id, u.text, "", u.language, u.keywords, duration=u.duration or 0.0,
                           speaker=u.speaker, context=u.context, metadata=dict(u.meta))
