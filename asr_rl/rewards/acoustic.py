"""The `acoustic` reward term: how well each hypothesis fits its audio, needing no transcript.

    score = exp(log P(hypothesis | audio) / frames)

from the acoustic scorer (rewards/acoustic_scorer.py: a CTC model over characters on the frozen
encoder's states, trained on source transcripts, apart from the policy's decoder): the per-frame
geometric mean of the forced-alignment likelihood, in (0, 1]. Within a group every sample has the
same audio, so the group-normalised advantage ranks the samples by log P(hypothesis | audio); the
per-frame scale keeps the term comparable across utterances when it is weighed with others. A
hypothesis that names the wrong entity or digit, drops a word or adds one loses probability;
an empty hypothesis is the all-blank path, likely only where nobody speaks. A hypothesis with a
character the scorer has no label for scores 0.

Batched: each distinct audio of a call is read and encoded once (a group's n samples share it),
and all hypotheses are scored in one CTC pass. Its states are kept (the encoder cache, in RAM, and
read from the SFT's cache folder with `encoder_cache=DIR`): a pool's utterance is encoded once a run. Usable as a built-in term (`reward.terms:
{acoustic: 1.0}`, `reward.term_options: {acoustic: {scorer: DIR}}`), served by `asr-rl reward
serve --reward acoustic:DIR`, or called from a reward file (`AcousticTerm(DIR)(samples)`).
"""
from __future__ import annotations

import functools
import math
from pathlib import Path

import torch

from asr_rl.rewards.base import RewardError, RewardOutput, Sample


class AcousticTerm:
    """The scorer in `folder` (with the encoder it reads, `folder/encoder`), as a function of samples."""

    name = "acoustic"

    def __init__(self, folder: str | Path, batch_size: int = 16, encoder_cache: str | Path | None = None,
                 cache_gib: float = 1.0):
        from asr_rl.rewards.acoustic_scorer import AcousticScorer
        from asr_rl.models.audio_policy import AudioPolicy

        self.folder, self.batch_size = Path(folder), batch_size
        self.scorer = AcousticScorer.load(self.folder)
        if not (self.folder / "encoder" / "config.json").is_file():
            raise FileNotFoundError(f"{self.folder}/encoder holds no audio model: the scorer folder is incomplete; "
                                    "make it again with `asr-rl train scorer`")
        self.encoder = AudioPolicy.from_pretrained(self.folder / "encoder")
        self.encoder.freeze()
        # the states of a pool's utterances are wanted again every time one is drawn: kept in RAM (up
        # to `cache_gib`), and read from the SFT's cache folder when given (the same frozen encoder
        # filled it: its fingerprint says so, and a folder of another encoder is ignored)
        self.encoder.use_encoder_cache(encoder_cache, cache_gib)

    @torch.no_grad()
    def states(self, audios: list[str]) -> list[torch.Tensor]:
        """Encoder states `(L_i, d_audio)` of each audio reference (its clean audio), `batch_size` at a
        time, through the encoder's cache: only what it lacks is read and encoded."""
        from asr_rl.data.batching import lazy_batch
        from asr_rl.data.manifest import Utterance

        out = []
        for start in range(0, len(audios), self.batch_size):
            refs = audios[start:start + self.batch_size]
            batch = lazy_batch([Utterance(id=a, audio=a, text=None, language=None) for a in refs],
                               self.encoder.sample_rate)
            out += [r.audio.float() for r in self.encoder.encode_batch(batch)]
        return out

    def scores(self, samples: list[Sample]) -> list[float]:
        missing = [i for i, s in enumerate(samples) if not s.audio]
        if missing:
            raise RewardError(f"the acoustic term listens to the audio, and sample {missing[0]} ({samples[missing[0]].prompt!r}) "
                              "carries none (Sample.audio): it scores audio lines only")
        audios = list(dict.fromkeys(s.audio for s in samples))
        where = {a: i for i, a in enumerate(audios)}
        states = self.states(audios)
        ll = self.scorer.log_likelihood(states, [s.hypothesis for s in samples], [where[s.audio] for s in samples])
        frames = [states[where[s.audio]].shape[0] for s in samples]
        return [math.exp(float(v) / n) if math.isfinite(float(v)) else 0.0 for v, n in zip(ll, frames)]

    def __call__(self, samples: list[Sample]) -> RewardOutput:
        values = self.scores(samples)
        return RewardOutput(rewards=values, terms={self.name: values})


@functools.lru_cache(maxsize=4)
def _term(folder: str, encoder_cache: str | None = None) -> AcousticTerm:
    return AcousticTerm(folder, encoder_cache=encoder_cache)


def acoustic_scores(samples: list[Sample], scorer: str | None, encoder_cache: str | None = None) -> list[float]:
    """The `acoustic` term (registered in terms.py): `AcousticTerm(scorer, encoder_cache=...).scores`, one
    term per folder."""
    if scorer is None:
        raise RewardError("the acoustic term needs its scorer folder: reward.term_options={acoustic: {scorer: DIR}} "
                          "(made by `asr-rl train scorer`)")
    return _term(str(Path(scorer).resolve()), encoder_cache and str(Path(encoder_cache).resolve())).scores(samples)
