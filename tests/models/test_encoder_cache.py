"""A frozen encoder runs once per utterance and augmentation variant, and its cached states are
exactly what a fresh pass over the same (augmented) audio gives."""
from __future__ import annotations

import pytest
import torch

from asr_rl.data.batching import BatchLoader
from asr_rl.data.manifest import read_manifest
from asr_rl.models.audio_policy import AudioPolicy
from asr_rl.data.augment import AugmentConfig, VariantAugmenter


def count_encoder_rows(policy) -> list[int]:
    """Utterances the audio tower's first convolution sees, per call."""
    seen: list[int] = []
    tower = policy.spec.audio_tower(policy.model)
    first_conv = next(m for m in tower.modules() if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d)))
    first_conv.register_forward_pre_hook(lambda mod, args: seen.append(args[0].shape[0]))
    return seen


def count_mel_convolutions(monkeypatch, mel_bins: int = 80) -> list[int]:
    """Utterances any Conv1d over `mel_bins` channels (Whisper's first layer) sees, per call, in
    every model this process builds from now on."""
    seen: list[int] = []
    forward = torch.nn.Conv1d.forward

    def counting(self, x):
        if self.in_channels == mel_bins:
            seen.append(x.shape[0])
        return forward(self, x)

    monkeypatch.setattr(torch.nn.Conv1d, "forward", counting)
    return seen


@pytest.fixture
def frozen(whisper_model):
    policy = AudioPolicy.from_pretrained(whisper_model)
    policy.freeze()
    return policy


def test_two_epochs_encode_each_utterance_variant_once(frozen, tiny_corpus):
    utts = read_manifest(tiny_corpus / "train.jsonl")
    seen = count_encoder_rows(frozen)
    augment = AugmentConfig(noise_prob=1.0, variants=2)
    loader = BatchLoader(utts, 4, seed=0, augmenter=VariantAugmenter(augment, seed=0))
    keys = set()
    for _ in range(3 * len(utts) // 4):  # three epochs
        batch = loader.next_batch()
        rows = frozen.encode_batch(batch)
        keys |= set(batch.cache_keys)
        assert len(rows) == 4 and all(r.audio.shape[1] == 384 for r in rows)
    assert sum(seen) == len(keys) == len(frozen.encoder_cache)  # one pass per (utterance, variant)
    assert len(keys) > len(utts)  # augmented variants were drawn and cached apart from the clean audio


def test_cached_states_equal_a_fresh_pass_over_the_same_augmented_audio(frozen, tiny_corpus):
    utts = read_manifest(tiny_corpus / "train.jsonl")[:4]
    augmenter = VariantAugmenter(AugmentConfig(noise_prob=1.0, reverb_prob=1.0, variants=3), seed=1)
    loader = BatchLoader(utts, 4, seed=0, shuffle=False, augmenter=augmenter)
    batch = loader.next_batch()
    cached = frozen.encode_batch(batch)
    noisy = [i for i, v in enumerate(batch.variants) if v]
    assert noisy, batch.variants
    i = noisy[0]
    from asr_rl.data.audio import load_audio

    wav = augmenter.apply(load_audio(utts[i].audio), utts[i], batch.variants[i], 16000)
    (fresh,) = frozen.encode_prompts([wav], [utts[i].language])
    # equal up to float rounding: the cached pass ran in a batch padded to its longest utterance
    assert torch.allclose(fresh.audio, cached[i].audio, atol=1e-4) and torch.equal(fresh.ids, cached[i].ids)
    (clean,) = frozen.encode_prompts([load_audio(utts[i].audio)], [utts[i].language])
    assert not torch.allclose(clean.audio, cached[i].audio)  # the variant is not the clean audio


def test_an_encoder_that_trains_is_never_cached(whisper_model, tiny_corpus):
    policy = AudioPolicy.from_pretrained(whisper_model)  # nothing frozen
    seen = count_encoder_rows(policy)
    loader = BatchLoader(read_manifest(tiny_corpus / "train.jsonl"), 4, seed=0)
    batch = loader.next_batch()
    policy.encode_batch(batch)
    policy.encode_batch(batch)
    assert seen == [4, 4] and not policy.encoder_cache


def test_a_saved_cache_serves_the_next_run_and_another_encoder_ignores_it(frozen, whisper_model, tiny_corpus,
                                                                          tmp_path, caplog):
    utts = read_manifest(tiny_corpus / "train.jsonl")[:4]
    augmenter = VariantAugmenter(AugmentConfig(noise_prob=1.0, variants=1), seed=0)
    batch = BatchLoader(utts, 4, seed=0, shuffle=False, augmenter=augmenter).next_batch()
    first = frozen.encode_batch(batch)
    frozen.save_encoder_cache(tmp_path / "cache.pt")

    again = AudioPolicy.from_pretrained(whisper_model)
    again.freeze()
    again.use_encoder_cache(tmp_path / "cache.pt")
    seen = count_encoder_rows(again)
    rows = again.encode_batch(BatchLoader(utts, 4, seed=0, shuffle=False, augmenter=augmenter).next_batch())
    assert seen == [] and all(torch.equal(a.audio, b.audio) and torch.equal(a.ids, b.ids) for a, b in zip(first, rows))

    other = AudioPolicy.from_pretrained(whisper_model)
    with torch.no_grad():
        other.spec.audio_tower(other.model).layer_norm.bias.add_(0.1)  # another encoder
    other.freeze()
    other.use_encoder_cache(tmp_path / "cache.pt")
    assert len(other.encoder_cache) == 0 and "another encoder or prompt format" in caplog.text
    # another augmenter's variants are other keys; the clean audio is shared
    tags = {k[1] for k in BatchLoader(utts, 4, seed=0, shuffle=False,
                                      augmenter=VariantAugmenter(AugmentConfig(noise_prob=0.5, variants=1),
                                                                 seed=0)).next_batch().cache_keys}
    assert tags - {"clean"} and not (tags - {"clean"}) & {k[1] for k in frozen.encoder_cache}
