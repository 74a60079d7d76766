"""Lazy at any size: what the trainers read at start-up is the index (no audio header a row's
`duration` already gives), held packed, and checked in passes that do not grow per character."""
from __future__ import annotations

import math

import numpy as np
import pytest

from asr_rl.data import manifest as manifest_module
from asr_rl.data.audio import AudioError
from asr_rl.data.batching import BatchLoader, UtteranceSampler, prompt_length, prompt_lengths
from asr_rl.data.manifest import Utterance, read_manifest, scan_manifest
from asr_rl.data.readers import ReadOptions
from asr_rl.data.signal_sampler import SignalSampler
from asr_rl.data.utterance_table import UtteranceTable
from asr_rl.models.tokenizer import require_writable, token_ids, token_lengths
from tests.conftest import write_manifest, write_tone


def _counting_audio_info(monkeypatch) -> list:
    calls = []
    real = manifest_module.audio_info

    def counted(path):
        calls.append(str(path))
        return real(path)

    monkeypatch.setattr(manifest_module, "audio_info", counted)
    return calls


def test_trusted_durations_open_only_the_headers_of_rows_without_one(tmp_path, monkeypatch):
    for name in "abc":
        write_tone(tmp_path / "wavs" / f"{name}.wav", 0.5)
    path = write_manifest(tmp_path / "m.jsonl", [
        {"id": "a", "audio": "wavs/a.wav", "text": "x", "language": "en", "duration": 0.5},
        {"id": "b", "audio": "wavs/b.wav", "text": "y", "language": "en"},
        {"id": "c", "audio": "wavs/c.wav", "text": "z", "language": "en", "duration": 0.7},
    ])
    calls = _counting_audio_info(monkeypatch)
    utts = read_manifest(path, trust_durations=True)
    assert calls == [str(tmp_path / "wavs" / "b.wav")]
    assert [u.duration for u in utts] == [0.5, 0.5, 0.7]  # the given one is kept, the missing one measured
    calls.clear()
    assert [u.duration for u in read_manifest(path)] == [0.5, 0.5, 0.5]  # the validator reads every header
    assert len(calls) == 3


def test_a_missing_file_with_a_duration_fails_when_loaded_naming_its_line(tmp_path):
    write_tone(tmp_path / "wavs" / "a.wav", 0.5)
    path = write_manifest(tmp_path / "m.jsonl", [
        {"id": "a", "audio": "wavs/a.wav", "text": "x", "language": "en", "duration": 0.5},
        {"id": "gone", "audio": "wavs/gone.wav", "text": "y", "language": "en", "duration": 1.0},
    ])
    with pytest.raises(ValueError, match=r"m.jsonl:2: audio file .*gone.wav does not exist"):
        read_manifest(path)  # without trust: refused at start, as before
    utts = read_manifest(path, trust_durations=True)
    batch = BatchLoader(utts, batch_size=2, shuffle=False).next_batch()
    assert len(batch.waveforms[0]) == 8000
    with pytest.raises(AudioError, match=r"m.jsonl:2: audio file .*gone.wav does not exist"):
        batch.waveforms[1]


def test_trusted_durations_still_apply_the_length_limits(tmp_path):
    write_tone(tmp_path / "wavs" / "a.wav", 0.5)
    path = write_manifest(tmp_path / "m.jsonl", [
        {"id": "a", "audio": "wavs/a.wav", "text": "x", "language": "en", "duration": 40.0}])
    with pytest.raises(ValueError, match=r"m.jsonl:1: audio .*a.wav is 40.0s, longer than max_duration 30"):
        read_manifest(path, trust_durations=True, max_duration=30)


UTTERANCES = [
    Utterance("a", "/data/wavs/a.wav", "call anna", "en", ("anna",), 1.25, "s1", (), {"accent": "en-us"},
              "/data/m.jsonl:1"),
    Utterance("b", "/data/wavs/b.wav", None, "zh", (), None, None, ("小明", "Anna Lee"), {}, "/data/m.jsonl:2"),
    Utterance("c", "/data/t.arrow::row=3&column=audio", "", "en", (), 2.0, "s1", (), {},
              "/data/t.arrow row 3 (id c)"),
    Utterance("d", "/rec/long.wav::start=1.5&end=2.5", "打开灯", "zh", ("灯",), 1.0, "s2", (), {"n": [1, 2]},
              "data/train/text:4 (d)"),
    Utterance("e", "rel.wav", "x", "en", source=""),
]


def test_a_table_gives_back_the_utterances_it_was_given():
    table = UtteranceTable(UTTERANCES)
    assert len(table) == 5 and table == UTTERANCES and list(table) == UTTERANCES
    assert [u.meta for u in table] == [u.meta for u in UTTERANCES]  # not compared by ==, kept all the same
    assert table[-1] == UTTERANCES[-1] and table[1:3] == UTTERANCES[1:3]
    with pytest.raises(IndexError):
        table[5]
    durations = table.durations
    assert durations[0] == 1.25 and math.isnan(durations[1])
    np.testing.assert_allclose(prompt_lengths(table), [prompt_length(u) for u in UTTERANCES])


def test_read_manifest_packs_what_it_reads(tone_manifest):
    utts = read_manifest(tone_manifest)
    assert isinstance(utts, UtteranceTable)
    assert [u.id for u in utts] == ["a", "b"] and utts[1].text == "打开客厅的灯" and utts[0].keywords == ("anna",)
    assert utts[0].audio == str((tone_manifest.parent / "wavs" / "a.wav").resolve())


def test_the_epoch_order_is_drawn_once_and_stays_the_same():
    lengths = list(np.random.default_rng(0).random(50))
    s = UtteranceSampler(50, 4, seed=2, lengths=lengths, bucket_batches=3)
    drawn = [s.next_indices() for _ in range(30)]  # more than an epoch (12 batches)
    expected = [list(s._order(e)[i * 4:(i + 1) * 4]) for e in range(3) for i in range(12)][:30]
    assert drawn == expected


def test_feedback_finds_the_items_a_table_loader_drew():
    table = UtteranceTable(UTTERANCES[:4])
    loader = BatchLoader(table, batch_size=2, seed=1, sampler=SignalSampler(4, 2, seed=1))
    for _ in range(3):
        batch = loader.next_batch()
        loader.feedback(batch.utterances, [[1.0, 1.0]] * 2)  # saturated: their scores fall
    assert (loader.sampler.scores < 1).any()
    with pytest.raises(ValueError, match="did not draw"):
        loader.feedback([table[0]], [[1.0, 1.0]])  # equal to a drawn one, but not the object drawn


class CharTokenizer:
    """Every character its own token, except `refused` (what a character vocabulary lacks)."""

    def __init__(self, refused: str = ""):
        self.refused = refused

    def __call__(self, text, add_special_tokens=False):
        if isinstance(text, list):
            return {"input_ids": [self(t)["input_ids"] for t in text]}
        return {"input_ids": [ord(c) for c in text if c not in self.refused]}

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_token_lengths_are_those_of_one_call_a_text():
    texts = ["call anna", "", "打开客厅的灯", "call anna"]
    assert token_lengths(CharTokenizer(), texts) == {"call anna": 9, "": 0, "打开客厅的灯": 6}
    assert token_ids(CharTokenizer(), texts, batch=1)["打开客厅的灯"] == [ord(c) for c in "打开客厅的灯"]


def test_require_writable_names_the_lines_as_before():
    table = UtteranceTable(UTTERANCES)
    require_writable(table, CharTokenizer())
    with pytest.raises(ValueError, match=r"2 transcripts or context lists .*/data/m.jsonl:2 \(context\): 小"):
        require_writable(table, CharTokenizer(refused="小灯"))


def test_a_kaldi_folder_names_the_first_line_of_a_duplicated_key(tmp_path):
    """The per-utterance files keep no line numbers (memory); messages still name the lines."""
    write_tone(tmp_path / "wavs" / "u0.wav", 0.5)
    write_tone(tmp_path / "wavs" / "u1.wav", 0.5)
    folder = tmp_path / "kaldi"
    folder.mkdir()
    (folder / "wav.scp").write_text(f"u0 {tmp_path}/wavs/u0.wav\nu1 {tmp_path}/wavs/u1.wav\nu0 x.wav\n")
    (folder / "text").write_text("u0 call anna\n\nu1 turn on\nu1 again\nghost words\n")
    (folder / "utt2spk").write_text("u0 s1\nu1 s1\n")
    scan = scan_manifest(folder, options=ReadOptions(language="en"))
    found = sorted(f"{p.at(folder)}: {p.message}" for p in scan.problems)
    assert found == [f"{folder / 'text'}:4 (u1): duplicate key 'u1' (first on line 3)",
                     f"{folder / 'text'}:5 (ghost): utterance 'ghost' is not in `wav.scp`",
                     f"{folder / 'wav.scp'}:3 (u0): duplicate key 'u0' (first on line 1)"]
    assert [(u.id, u.text, u.speaker) for u in scan.utterances] == [("u0", "call anna", "s1"), ("u1", "turn on", "s1")]


def test_a_column_is_each_utterances_field():
    table = UtteranceTable(UTTERANCES)
    for name in ("id", "text", "keywords", "context"):
        assert list(table.column(name)) == [getattr(u, name) for u in UTTERANCES]
