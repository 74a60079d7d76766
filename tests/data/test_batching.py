from __future__ import annotations

import pytest

from asr_rl.data.batching import BatchLoader, UtteranceSampler, iter_batches
from asr_rl.data.manifest import read_manifest


def test_sampler_is_a_seeded_permutation_per_epoch_dropping_the_tail():
    s = UtteranceSampler(num_items=5, batch_size=2, seed=3)
    first = [s.next_indices() for _ in range(2)]
    epoch1 = s.next_indices()  # only 1 left in epoch 0 -> new epoch
    assert s.position.epoch == 1
    assert len(set(first[0] + first[1])) == 4
    again = UtteranceSampler(num_items=5, batch_size=2, seed=3)
    assert [again.next_indices() for _ in range(3)] == first + [epoch1]
    other = UtteranceSampler(num_items=5, batch_size=2, seed=4)
    assert [other.next_indices() for _ in range(3)] != first + [epoch1]


def test_sampler_resumes_from_its_state():
    a = UtteranceSampler(num_items=7, batch_size=3, seed=1)
    for _ in range(3):
        a.next_indices()
    state = a.state_dict()
    expected = [a.next_indices() for _ in range(4)]
    b = UtteranceSampler(num_items=7, batch_size=3, seed=1)
    b.load_state_dict(state)
    assert [b.next_indices() for _ in range(4)] == expected


def test_sampler_rejects_impossible_sizes():
    with pytest.raises(ValueError, match="empty"):
        UtteranceSampler(0, 1)
    with pytest.raises(ValueError, match="larger than the 2 utterances"):
        UtteranceSampler(2, 3)


def test_loader_yields_audio_with_utterances(tone_manifest):
    utts = read_manifest(tone_manifest)
    loader = BatchLoader(utts, batch_size=2, seed=0, shuffle=False)
    batch = loader.next_batch()
    assert batch.texts == ["call anna", "打开客厅的灯"]
    assert [len(w) for w in batch.waveforms] == [8000, 16000]
    assert batch.durations == [0.5, 1.0]
    assert [len(b) for b in iter_batches(utts, 1)] == [1, 1]


def test_bucketing_groups_similar_lengths_and_still_covers_the_epoch():
    lengths = [float(i % 10) for i in range(40)]
    s = UtteranceSampler(num_items=40, batch_size=4, seed=0, lengths=lengths, bucket_batches=5)
    batches = [s.next_indices() for _ in range(10)]
    assert sorted(i for b in batches for i in b) == list(range(40))  # every item once per epoch
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches) / 10
    plain = UtteranceSampler(num_items=40, batch_size=4, seed=0)
    plain_spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b)
                       for b in (plain.next_indices() for _ in range(10))) / 10
    assert spread < plain_spread / 2
    again = UtteranceSampler(num_items=40, batch_size=4, seed=0, lengths=lengths, bucket_batches=5)
    assert [again.next_indices() for _ in range(10)] == batches


def test_bucketing_counts_a_context_list_as_prompt_length():
    from asr_rl.data.batching import prompt_length
    from asr_rl.data.manifest import Utterance

    plain = Utterance(id="a", audio="a.wav", text="hi", language="en", duration=2.0)
    listed = Utterance(id="b", audio="b.wav", text="hi", language="en", duration=2.0, context=("grace", "ben"))
    assert prompt_length(plain) == 2.0
    # (5 + 2) + (3 + 2) characters at 25 positions per second of audio
    assert prompt_length(listed) == pytest.approx(2.0 + 12 / 25)
    assert prompt_length("a text prompt") == 0.0


def test_a_lazy_batch_decodes_several_waveforms_at_once_on_the_decoding_threads(tiny_corpus, monkeypatch):
    """`load` with decoding threads gives the same arrays as one at a time in the calling thread
    (augmented variants included), and the decoding ran on the pool's threads."""
    import threading

    import numpy as np

    import asr_rl.data.batching as batching
    from asr_rl.data.augment import AugmentConfig, VariantAugmenter

    utts = read_manifest(tiny_corpus / "train.jsonl")
    augmenter = VariantAugmenter(AugmentConfig(noise_prob=1.0, variants=2), seed=3)
    threads = []
    load = batching.load_audio
    monkeypatch.setattr(batching, "load_audio",
                        lambda *a, **k: threads.append(threading.current_thread().name) or load(*a, **k))
    serial = batching.lazy_batch(utts, augmenter=augmenter, epoch=1, workers=0)
    parallel = batching.lazy_batch(utts, augmenter=augmenter, epoch=1, workers=2)
    assert serial.variants == parallel.variants and any(serial.variants)
    want = [serial.waveforms[i] for i in range(len(utts))]
    assert set(threads) == {threading.current_thread().name}
    threads.clear()
    got = parallel.load([5, 0, 5, 2] + list(range(len(utts))))
    assert all(np.array_equal(a, b) for a, b in zip(got[4:], want)) and got[0] is got[2]
    assert len(threads) == len(utts) and all(t.startswith("asr-rl-decode") for t in threads)  # each file once
    sub = parallel.select([1, 3])  # a rank's shard keeps the threads
    assert sub.waveforms.workers == 2 and all(np.array_equal(a, want[i]) for a, i in zip(sub.load([0, 1]), [1, 3]))
