"""Offline bilingual (English/Mandarin) demo corpus: voice commands spoken by espeak-ng and flite.

No speech data or models can be downloaded on the machines this project targets, so the demo
corpus is synthesised: a small command grammar (devices, rooms, contacts, numbers, times), many
synthetic voices split so that dev/test voices never occur in train, and a noisy test set.
`asr-rl data synth` calls `synthesize`: `synthesize_corpus` for the source corpus, or the target
domain of synth/target.py (held-out accents over a telephone line, an unlabelled pool, non-speech).
"""
from __future__ import annotations

from asr_rl.data.synth.corpus import SUPPORTED_LANGUAGES, parse_languages, synthesize_corpus

__all__ = ["SUPPORTED_LANGUAGES", "synthesize", "synthesize_corpus"]


def synthesize(out_dir, domain: str = "source", *, langs=None, n_train: int = 200, n_test: int = 40,
               seed: int = 1, workers: int | None = None, progress: bool = True, context_sizes=(),
               n_nonspeech: int | None = None) -> dict[str, dict]:
    """`asr-rl data synth`: the source corpus (`synthesize_corpus`; `langs` None is en,zh) or the
    target domain (`synth.target.synthesize_target`: `langs` None is en,zh, `n_train` is the pool's
    size). `n_nonspeech`: the target's non-speech test clips; for the source, clips where nobody
    speaks labelled `""` added to its training set (the supervised control for silence; default 0)."""
    if domain == "source":
        return synthesize_corpus(out_dir, langs=("en", "zh") if langs is None else langs, n_train=n_train,
                                 n_test=n_test, seed=seed, workers=workers, progress=progress,
                                 context_sizes=context_sizes, n_nonspeech=n_nonspeech or 0)
    if domain != "target":
        raise ValueError(f"unknown domain {domain!r}; valid: source, target")
    from asr_rl.data.synth.target import synthesize_target

    if any(context_sizes):
        raise ValueError("the target domain takes no context sizes (its lines carry `entities`, the app's entity "
                         "list, outside the prompt)")
    return synthesize_target(out_dir, n_pool=n_train, n_test=n_test, n_nonspeech=150 if n_nonspeech is None else n_nonspeech,
                             seed=seed, workers=workers, progress=progress,
                             langs=("en", "zh") if langs is None else parse_languages(langs))
