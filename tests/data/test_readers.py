"""Every reader (data/readers) against the same corpus written as our JSONL manifest: real wav files
of synthesised tones, English and Mandarin lines, written again as a `datasets` folder and parquet
(audio as bytes and as paths), a NeMo manifest and a Kaldi folder. Each must give the same
Utterances (ids, text, language, duration, decoded samples), and `asr-rl data check` must name a
broken row of each format by its row or utterance and its column."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from asr_rl.cli import main
from asr_rl.data.audio import AudioError, audio_info, load_audio
from asr_rl.data.audio_refs import SegmentRef, TableRef, parse_ref, segment_ref
from asr_rl.data.manifest import ManifestError, read_manifest, scan_manifest
from asr_rl.data.readers import READERS, ReadOptions, choose_reader
from tests.conftest import write_manifest, write_tone

# id, seconds, tone (Hz), transcript, language, speaker: a mixed-language set
ROWS = [("u0", 0.5, 220.0, "call anna", "en", "s1"), ("u1", 0.7, 330.0, "打开客厅的灯", "zh", "s2"),
        ("u2", 0.9, 440.0, "turn on the light", "en", "s1"), ("u3", 1.1, 550.0, "关灯", "zh", "s3")]


@pytest.fixture
def corpus(tmp_path) -> Path:
    """wavs/u*.wav and the reference JSONL manifest m.jsonl."""
    for uid, sec, freq, *_ in ROWS:
        write_tone(tmp_path / "wavs" / f"{uid}.wav", sec, freq=freq)
    return write_manifest(tmp_path / "m.jsonl", [
        {"id": uid, "audio": f"wavs/{uid}.wav", "text": text, "language": lang, "speaker": spk}
        for uid, _, _, text, lang, spk in ROWS])


def assert_same(utts, ref) -> None:
    """Same ids, text, language, speaker, duration and decoded samples as the JSONL reference."""
    key = [(u.id, u.text, u.language, u.speaker) for u in utts]
    assert key == [(r.id, r.text, r.language, r.speaker) for r in ref]
    assert [u.duration for u in utts] == pytest.approx([r.duration for r in ref])
    for u, r in zip(utts, ref):
        np.testing.assert_array_equal(load_audio(u.audio), load_audio(r.audio))


def hf_dataset(corpus: Path, as_bytes: bool, text_column: str = "sentence", broken: int | None = None,
               texts: list | None = None):
    """The corpus as a `datasets.Dataset` with the Audio feature; `broken`: that row's bytes are not audio."""
    pytest.importorskip("datasets")
    from datasets import Audio, Dataset

    wavs = [corpus.parent / "wavs" / f"{r[0]}.wav" for r in ROWS]
    audio = [{"bytes": w.read_bytes(), "path": None} if as_bytes else str(w) for w in wavs]
    if broken is not None:
        audio[broken] = {"bytes": b"not a wav file at all" * 20, "path": None}
    ds = Dataset.from_dict({"id": [r[0] for r in ROWS], "audio": audio, text_column: texts or [r[3] for r in ROWS],
                            "language": [r[4] for r in ROWS], "speaker": [r[5] for r in ROWS]})
    return ds.cast_column("audio", Audio())


def write_nemo(corpus: Path, rows=None) -> Path:
    rows = rows if rows is not None else [
        {"audio_filepath": f"wavs/{uid}.wav", "text": text, "duration": sec, "lang": lang, "id": uid,
         "speaker": spk} for uid, sec, _, text, lang, spk in ROWS]
    return write_manifest(corpus.parent / "nemo.json", rows)


def write_kaldi(corpus: Path, text_lines=None) -> Path:
    folder = corpus.parent / "kaldi"
    folder.mkdir(exist_ok=True)
    (folder / "wav.scp").write_text("".join(f"{r[0]} {corpus.parent / 'wavs' / r[0]}.wav\n" for r in ROWS))
    (folder / "text").write_text("".join(text_lines or [f"{r[0]} {r[3]}\n" for r in ROWS]), encoding="utf-8")
    (folder / "utt2spk").write_text("".join(f"{r[0]} {r[5]}\n" for r in ROWS))
    (folder / "utt2lang").write_text("".join(f"{r[0]} {r[4]}\n" for r in ROWS))
    return folder


# ------------------------------------------------------------------------ same Utterances
@pytest.mark.parametrize("as_bytes", [True, False], ids=["bytes", "paths"])
def test_a_datasets_folder_and_parquet_read_as_the_jsonl_manifest(corpus, as_bytes):
    ref = read_manifest(corpus)
    ds = hf_dataset(corpus, as_bytes)
    ds.save_to_disk(str(corpus.parent / "hf"))
    ds.to_parquet(str(corpus.parent / "hf.parquet"))
    options = ReadOptions(text_column="sentence")
    for path in (corpus.parent / "hf", corpus.parent / "hf.parquet"):
        utts = read_manifest(path, options=options)
        assert_same(utts, ref)
        # bytes stay in the table (a reference to the row); paths stay paths, except that save_to_disk
        # embeds the files it is given by path (`datasets` 5: the Audio feature's path becomes the file name)
        embedded = as_bytes or path.is_dir()
        assert {type(parse_ref(u.audio)) for u in utts} == ({TableRef} if embedded else {type(None)})
        assert utts[1].source == f"{path} row 1 (id u1)"


def test_audio_as_a_plain_path_column_and_a_binary_column_in_parquet_shards(corpus):
    import pyarrow as pa
    import pyarrow.parquet as pq

    ref = read_manifest(corpus)
    wavs = [corpus.parent / "wavs" / f"{r[0]}.wav" for r in ROWS]
    cols = {"id": [r[0] for r in ROWS], "text": [r[3] for r in ROWS], "language": [r[4] for r in ROWS],
            "speaker": [r[5] for r in ROWS]}
    folder = corpus.parent / "shards"
    folder.mkdir()
    # two shards of two rows: row numbers run on across shards, references count within one
    for shard, (lo, hi) in enumerate([(0, 2), (2, 4)]):
        part = {k: v[lo:hi] for k, v in cols.items()}
        pq.write_table(pa.table({**part, "audio": [w.read_bytes() for w in wavs[lo:hi]]}),
                       folder / f"train-{shard:05d}-of-00002.parquet")
    pq.write_table(pa.table({**cols, "wav": [f"wavs/{r[0]}.wav" for r in ROWS]}), corpus.parent / "paths.parquet")
    assert_same(read_manifest(folder), ref)
    assert parse_ref(read_manifest(folder)[3].audio) == TableRef(
        (folder / "train-00001-of-00002.parquet").resolve(), 1, "audio")
    utts = read_manifest(corpus.parent / "paths.parquet", options=ReadOptions(audio_column="wav"))
    assert_same(utts, ref)
    assert utts[0].audio == str(wavs[0].resolve())


def test_a_nemo_manifest_reads_as_the_jsonl_manifest(corpus):
    assert_same(read_manifest(write_nemo(corpus)), read_manifest(corpus))


def test_a_kaldi_folder_reads_as_the_jsonl_manifest(corpus):
    assert_same(read_manifest(write_kaldi(corpus)), read_manifest(corpus))


def test_kaldi_segments_are_cut_from_the_long_file(tmp_path):
    sr = 16000
    rng = np.random.default_rng(0)
    long = (0.1 * rng.standard_normal(3 * sr)).astype(np.float32)
    sf.write(tmp_path / "rec.wav", long, sr, subtype="FLOAT")
    folder = tmp_path / "kaldi"
    folder.mkdir()
    (folder / "wav.scp").write_text("rec1 ../rec.wav\n")  # relative to the data folder
    (folder / "segments").write_text("a rec1 0.25 1.5\nb rec1 1.5 -1\n")
    (folder / "text").write_text("a call anna\nb turn on the light\n")
    utts = read_manifest(folder, options=ReadOptions(language="en"))
    assert [u.id for u in utts] == ["a", "b"] and [u.language for u in utts] == ["en", "en"]
    assert parse_ref(utts[0].audio) == SegmentRef((tmp_path / "rec.wav").resolve(), 0.25, 1.5)
    np.testing.assert_array_equal(load_audio(utts[0].audio, sr), long[4000:24000])
    np.testing.assert_array_equal(load_audio(utts[1].audio, sr), long[24000:])
    assert [u.duration for u in utts] == pytest.approx([1.25, 1.5])


def test_nemo_offsets_read_a_span_of_the_file(tmp_path):
    long = (0.1 * np.random.default_rng(1).standard_normal(2 * 16000)).astype(np.float32)
    sf.write(tmp_path / "rec.wav", long, 16000, subtype="FLOAT")
    m = write_manifest(tmp_path / "nemo.json", [
        {"audio_filepath": "rec.wav", "offset": 0.5, "duration": 1.0, "text": "call anna", "lang": "en"},
        {"audio_filepath": "rec.wav", "offset": 1.5, "duration": 0.5, "text": "关灯", "lang": "zh"}])
    a, b = read_manifest(m)
    assert (a.id, b.id) == ("rec-0.5", "rec-1.5") and (a.language, b.language) == ("en", "zh")
    np.testing.assert_array_equal(load_audio(a.audio), long[8000:24000])
    np.testing.assert_array_equal(load_audio(b.audio), long[24000:])


def test_a_segment_past_the_end_of_its_file_is_refused_a_small_overshoot_is_cut(tmp_path):
    write_tone(tmp_path / "r.wav", 1.0)
    with pytest.raises(AudioError, match="ends past the end of the file"):
        audio_info(segment_ref(tmp_path / "r.wav", 0.5, 2.0))
    assert audio_info(segment_ref(tmp_path / "r.wav", 0.5, 1.2)).frames == 8000  # Kaldi's max overshoot


def test_the_mixed_language_set_keeps_each_rows_language_and_a_default_fills_the_rest(corpus):
    ds = hf_dataset(corpus, as_bytes=True).remove_columns("language")
    ds.save_to_disk(str(corpus.parent / "hf"))
    with pytest.raises(ManifestError, match=r"row 0 \(id u0\): missing `language`.*data.language=CODE"):
        read_manifest(corpus.parent / "hf", options=ReadOptions(text_column="sentence"))
    utts = read_manifest(corpus.parent / "hf", options=ReadOptions(text_column="sentence", language="zh"))
    assert {u.language for u in utts} == {"zh"}
    mixed = read_manifest(write_kaldi(corpus))
    assert [u.language for u in mixed] == ["en", "zh", "en", "zh"]


# ------------------------------------------------------------------------ choosing the reader
def test_the_format_is_recognised_from_the_path_and_the_choice_logged(corpus, caplog):
    ds = hf_dataset(corpus, as_bytes=True)
    ds.save_to_disk(str(corpus.parent / "hf"))
    ds.to_parquet(str(corpus.parent / "hf.parquet"))
    expected = {corpus: "jsonl", write_nemo(corpus): "nemo", write_kaldi(corpus): "kaldi",
                corpus.parent / "hf": "datasets", corpus.parent / "hf.parquet": "datasets"}
    for path, name in expected.items():
        assert choose_reader(path)[0] == name
    with caplog.at_level(logging.INFO, logger="asr_rl.data.manifest"):
        scan = scan_manifest(corpus.parent / "hf", options=ReadOptions(text_column="sentence"))
    assert scan.format == "datasets" and not scan.problems
    assert f"{corpus.parent / 'hf'}: read as datasets (recognised: a `datasets` save_to_disk folder" in caplog.text


def test_an_explicit_format_wins_and_an_unknown_one_lists_the_readers(corpus, caplog):
    with caplog.at_level(logging.INFO, logger="asr_rl.data.manifest"):
        scan = scan_manifest(corpus, options=ReadOptions(format="jsonl"))
    assert scan.format_reason == "data.format=jsonl" and "read as jsonl (data.format=jsonl)" in caplog.text
    with pytest.raises(ValueError, match="unknown data.format 'csv'; valid: datasets, jsonl, kaldi, nemo"):
        scan_manifest(corpus, options=ReadOptions(format="csv"))
    assert set(READERS) == {"datasets", "jsonl", "kaldi", "nemo"}


def test_the_reading_options_are_data_keys_of_sft_and_rl_checked_when_the_config_loads():
    from asr_rl.config import ConfigError, load_config
    from asr_rl.trainer.configs.rl import RLConfig, SFTConfig

    cfg = load_config(SFTConfig, None, ["data.format=datasets", "data.text_column=sentence", "data.language=en"])
    assert (cfg.data.format, cfg.data.text_column, cfg.data.language) == ("datasets", "sentence", "en")
    assert load_config(RLConfig, None, ["data.format=kaldi"]).data.format == "kaldi"
    with pytest.raises(ConfigError, match="unknown data.format 'csv'; valid: datasets, jsonl, kaldi, nemo"):
        load_config(SFTConfig, None, ["data.format=csv"])
    with pytest.raises(ConfigError, match="data.language='english' is not a language code"):
        load_config(RLConfig, None, ["data.language=english"])
    with pytest.raises(ConfigError, match="unknown config key `data.txt_column`"):
        load_config(SFTConfig, None, ["data.txt_column=sentence"])


def test_a_named_column_that_is_not_there_is_an_error_listing_the_columns(corpus):
    hf_dataset(corpus, as_bytes=True).save_to_disk(str(corpus.parent / "hf"))
    with pytest.raises(ValueError, match=r"no column `transcript` \(data.text_column\); its columns: id, audio, "
                                         r"sentence, language, speaker"):
        scan_manifest(corpus.parent / "hf", options=ReadOptions(text_column="transcript"))


def test_a_datasetdict_folder_asks_for_one_split(corpus):
    DatasetDict = pytest.importorskip("datasets").DatasetDict

    DatasetDict({"train": hf_dataset(corpus, True), "test": hf_dataset(corpus, True)}).save_to_disk(
        str(corpus.parent / "dd"))
    with pytest.raises(ValueError, match="DatasetDict with the splits test, train: give one split's folder"):
        scan_manifest(corpus.parent / "dd")


# ------------------------------------------------------------------------ `data check` on each format
def _check(capsys, path, *flags) -> tuple[int, str]:
    code = main(["data", "check", "--manifest", str(path), *flags])
    return code, capsys.readouterr().out


@pytest.mark.parametrize("layout", ["folder", "parquet"])
def test_data_check_names_a_broken_row_of_a_datasets_table(corpus, capsys, layout):
    ds = hf_dataset(corpus, as_bytes=True, broken=2)
    path = corpus.parent / ("hf" if layout == "folder" else "hf.parquet")
    ds.save_to_disk(str(path)) if layout == "folder" else ds.to_parquet(str(path))
    code, out = _check(capsys, path, "--text-column", "sentence")
    assert code == 1 and "format:     datasets (recognised:" in out
    assert "utterances: 3" in out and "languages:  en 1, zh 2" in out and "bad lines:  1" in out
    assert f"  {path} row 2 (id u2): audio bytes in column `audio` of " in out and "is unreadable" in out


def test_data_check_names_a_row_without_its_transcript_column(corpus, capsys):
    ds = hf_dataset(corpus, as_bytes=False, texts=[r[3] if i != 1 else None for i, r in enumerate(ROWS)])
    ds.to_parquet(str(corpus.parent / "hf.parquet"))
    code, out = _check(capsys, corpus.parent / "hf.parquet", "--text-column", "sentence")
    assert code == 1 and f"{corpus.parent / 'hf.parquet'} row 1 (id u1): missing `sentence` (the transcript)" in out
    code, out = _check(capsys, corpus.parent / "hf.parquet", "--text-column", "sentence", "--unlabelled")
    assert code == 0 and "unlabelled: 1" in out


def test_data_check_names_a_broken_line_of_a_nemo_manifest(corpus, capsys):
    rows = [{"audio_filepath": f"wavs/{uid}.wav", "text": text, "duration": sec, "lang": lang}
            for uid, sec, _, text, lang, _ in ROWS]
    rows[2] = {"text": "no audio here", "duration": 1.0, "lang": "en"}
    rows[3]["lang"] = "xx"
    code, out = _check(capsys, write_nemo(corpus, rows))
    assert code == 1 and "format:     nemo (recognised: a NeMo manifest" in out and "bad lines:  2" in out
    assert f"{corpus.parent / 'nemo.json'}:3: missing `audio_filepath`" in out
    assert f"{corpus.parent / 'nemo.json'}:4: unknown language 'xx'" in out and "(from `lang`)" in out


def test_data_check_reads_with_the_format_it_is_given(corpus, capsys):
    code, out = _check(capsys, corpus, "--format", "nemo")  # our manifest read as NeMo: no `audio_filepath`
    assert code == 1 and "format:     nemo (data.format=nemo)" in out
    assert f"{corpus}:1: missing `audio_filepath`" in out and "bad lines:  4" in out
    assert _check(capsys, corpus, "--format", "jsonl")[0] == 0


def test_data_check_names_broken_utterances_of_a_kaldi_folder(corpus, capsys):
    lines = [f"{r[0]} {r[3]}\n" for r in ROWS[:3]] + ["ghost some words\n"]  # u3 has no text; ghost no audio
    folder = write_kaldi(corpus, lines)
    code, out = _check(capsys, folder)
    assert code == 1 and "format:     kaldi (recognised: a Kaldi/WeNet data folder" in out and "bad lines:  2" in out
    assert f"{folder / 'wav.scp'}:4 (u3): missing `text` (the transcript)" in out
    assert f"{folder / 'text'}:4 (ghost): utterance 'ghost' is not in `wav.scp`" in out
    code, out = _check(capsys, folder, "--unlabelled")
    assert "unlabelled: 1" in out and "bad lines:  1" in out


def test_a_kaldi_command_entry_is_refused_naming_its_line(corpus, capsys):
    folder = write_kaldi(corpus)
    scp = (folder / "wav.scp").read_text().splitlines()
    scp[1] = "u1 sox wavs/u1.flac -t wav - |"
    (folder / "wav.scp").write_text("\n".join(scp) + "\n")
    code, out = _check(capsys, folder)
    assert code == 1 and f"{folder / 'wav.scp'}:2 (u1): `wav.scp` gives a command" in out


def test_a_manifest_of_references_written_back_reads_again(corpus, tmp_path):
    """`manifest_row` writes a row's reference as its `audio`: a JSONL manifest of a parquet's rows
    opens the same bytes without a copy of the audio."""
    from asr_rl.data.manifest import manifest_row

    hf_dataset(corpus, as_bytes=True).to_parquet(str(corpus.parent / "hf.parquet"))
    utts = read_manifest(corpus.parent / "hf.parquet", options=ReadOptions(text_column="sentence"))
    back = write_manifest(tmp_path / "out" / "back.jsonl", [manifest_row(u) for u in utts])
    assert_same(read_manifest(back), read_manifest(corpus))
    assert json.loads(back.read_text().splitlines()[0])["audio"] == utts[0].audio


# ------------------------------------------------------------------------ files that cannot be read (issue 47)
def test_a_truncated_or_misnamed_file_names_itself_the_format_and_the_one_that_reads_it(corpus, capsys):
    ds = hf_dataset(corpus, as_bytes=True)
    parquet = corpus.parent / "train.parquet"
    ds.to_parquet(str(parquet))
    data = parquet.read_bytes()
    cut = corpus.parent / "cut.parquet"
    cut.write_bytes(data[: len(data) // 2])  # a copy that stopped half way
    with pytest.raises(ValueError, match=rf"{cut} could not be read as datasets .*cut short or damaged"):
        read_manifest(cut)
    # a format that is not the file's: the message says which would read it
    with pytest.raises(ValueError, match=rf"{parquet} could not be read as jsonl .*It looks like datasets .*"
                                         r"set data.format=datasets"):
        read_manifest(parquet, options=ReadOptions(format="jsonl"))
    with pytest.raises(ValueError, match=rf"{corpus} could not be read as datasets .*It looks like jsonl"):
        read_manifest(corpus, options=ReadOptions(format="datasets"))
    assert main(["data", "check", "--manifest", str(parquet), "--format", "jsonl"]) == 2
    assert "set data.format=datasets" in capsys.readouterr().err


def test_a_negative_nemo_duration_is_named_the_same_by_data_check_and_training(corpus, capsys):
    rows = [{"audio_filepath": f"wavs/{uid}.wav", "text": text, "duration": -1 if uid == "u1" else sec, "id": uid,
             "lang": lang} for uid, sec, _, text, lang, _ in ROWS]
    nemo = write_nemo(corpus, rows)
    assert main(["data", "check", "--manifest", str(nemo)]) == 1
    out = capsys.readouterr().out
    assert f"{nemo}:2: `duration` is -1: a duration is a positive number of seconds" in out
    with pytest.raises(ManifestError, match="`duration` is -1"):  # training trusts the field: the same words
        read_manifest(nemo, trust_durations=True)


def test_a_column_setting_on_a_kaldi_folder_is_refused_not_ignored(corpus):
    folder = write_kaldi(corpus)
    with pytest.raises(ValueError, match=r"data.text_column=sentence does not apply to the Kaldi folder .*drop the "
                                         "setting"):
        read_manifest(folder, options=ReadOptions(text_column="sentence"))
