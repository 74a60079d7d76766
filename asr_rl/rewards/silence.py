"""The `silence` reward term: an empty transcript where nobody speaks, neutral where somebody does.

    no speech in the audio:  r = +1 for an empty transcript, -1 for any words
                             (graded=True: -n / (n + 1) for n words, a Han character a word)
    speech:                  r = 0

A sampler at temperature 1 seldom ends a transcript at its first token, so on a non-speech clip most
groups hold no empty sample, and the flat penalty ties them (no advantage). The graded penalty ranks
a group's shorter transcripts first until the empty one is sampled; measured against the flat one
on target dev (docs/benchmarks/label-free.md, two seeds), it was not better (+4.3% [-0.7, +10.6]
CER, non-speech clips with words 80% either way), so flat is the default.

Whether anybody speaks is the voice-activity detector's call, never the transcript's: silero-vad
(Silero Team, MIT; its model ships inside the `silero-vad` wheel, so nothing is downloaded), the
seconds of speech it finds, against `min_speech` seconds. A model that writes words on every
non-speech clip (room tone, music, beeps, a line's hiss) is what Calm-Whisper (arXiv:2505.12969)
measured in Whisper; a reward that only judges what a transcript looks like cannot see it, and an
empty answer scores worst under a grammar or a speaking-rate term. Within a group every sample has
the same audio, so on a speech clip the term adds nothing to the advantages, and on a non-speech
clip it splits the group into the empty samples and the rest.

Used as a built-in term (`reward.terms: {silence: 1.0}`), from a reward file
(`speech_seconds(audio)`, as recipes/rewards/voice_commands.py does), or by `asr-rl eval`-style
checks. Each distinct audio is read and detected once per process (a run's pool repeats them).
"""
from __future__ import annotations

import functools
import threading

from asr_rl.rewards.base import RewardError, Sample
from asr_rl.rewards.normalize import is_cjk, normalize_text

VAD_SAMPLE_RATE = 16000
MIN_SPEECH = 0.3  # seconds of detected speech below which nobody speaks
_LOCK = threading.Lock()  # the model keeps state between windows: one detection at a time


@functools.lru_cache(maxsize=1)
def _vad():
    from silero_vad import load_silero_vad  # the JIT model in the wheel

    return load_silero_vad()


@functools.lru_cache(maxsize=65536)
def speech_seconds(audio: str, threshold: float = 0.5) -> float:
    """Seconds of speech silero-vad finds in `audio` (a file or an audio reference, data/audio_refs.py),
    at its default 250 ms shortest speech and 100 ms shortest pause."""
    import torch
    from silero_vad import get_speech_timestamps

    from asr_rl.data.audio import load_audio

    wave = torch.from_numpy(load_audio(audio, VAD_SAMPLE_RATE))
    with _LOCK, torch.no_grad():
        spans = get_speech_timestamps(wave, _vad(), threshold=threshold, sampling_rate=VAD_SAMPLE_RATE)
    return sum(s["end"] - s["start"] for s in spans) / VAD_SAMPLE_RATE


def silence_reward(hypothesis: str, graded: bool = False) -> float:
    """The term where nobody speaks: +1 for an empty transcript, -1 for words (`graded`: -n / (n + 1)
    for n words)."""
    # words: a CJK character is one, as CER counts them; the rest of a space-separated token one more
    n = sum(sum(map(is_cjk, w)) + any(not is_cjk(c) for c in w) for w in normalize_text(hypothesis).split())
    return 1.0 if n == 0 else (-n / (n + 1) if graded else -1.0)


def silence_scores(samples: list[Sample], min_speech: float = MIN_SPEECH, threshold: float = 0.5,
                   graded: bool = False) -> list[float]:
    """The term (module docstring) for each sample; `min_speech`: seconds of detected speech below which
    nobody speaks; `threshold`: silero-vad's speech probability threshold; `graded`: the penalty by
    the number of words."""
    missing = [i for i, s in enumerate(samples) if not s.audio]
    if missing:
        raise RewardError(f"the silence term listens to the audio, and sample {missing[0]} "
                          f"({samples[missing[0]].prompt!r}) carries none (Sample.audio): it scores audio lines only")
    out = []
    for s in samples:
        if speech_seconds(s.audio, threshold) >= min_speech:
            out.append(0.0)
        else:
            out.append(silence_reward(s.hypothesis, graded))
    return out
