"""Offline bilingual (English/Mandarin) demo corpus: voice commands spoken by espeak-ng and flite.

No speech data or models can be downloaded on the machines this project targets, so the demo
corpus is synthesised: a small command grammar (devices, rooms, contacts, numbers, times), many
synthetic voices split so that dev/test voices never occur in train, and a noisy test set.
`asr-rl data synth` calls `synthesize_corpus`.
"""
from asr_rl.data.synth.corpus import SUPPORTED_LANGUAGES, synthesize_corpus

__all__ = ["SUPPORTED_LANGUAGES", "synthesize_corpus"]
