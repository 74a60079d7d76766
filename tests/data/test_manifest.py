from __future__ import annotations

import pytest

from asr_rl.data.manifest import ManifestError, read_manifest, scan_manifest
from tests.conftest import write_manifest, write_tone


def test_reads_lines_resolving_relative_audio_against_the_manifest_folder(tone_manifest):
    utts = read_manifest(tone_manifest)
    assert [u.id for u in utts] == ["a", "b"]
    assert utts[0].audio == str((tone_manifest.parent / "wavs" / "a.wav").resolve())
    assert utts[0].keywords == ("anna",) and utts[1].speaker == "s1"
    assert utts[0].duration == pytest.approx(0.5) and utts[1].duration == pytest.approx(1.0)
    assert utts[1].source.endswith("m.jsonl:2")


def test_absolute_audio_path_and_extra_fields_kept_as_metadata(tmp_path):
    wav = write_tone(tmp_path / "x" / "a.wav")
    m = write_manifest(tmp_path / "sub" / "m.jsonl", [
        {"id": "a", "audio": str(wav), "text": "hi", "language": "en", "accent": "en-gb"}])
    (u,) = read_manifest(m)
    assert u.audio == str(wav.resolve()) and u.meta == {"accent": "en-gb"}


def _one_bad(tmp_path, row, **kw):
    write_tone(tmp_path / "ok.wav")
    m = write_manifest(tmp_path / "m.jsonl", [
        {"id": "ok", "audio": "ok.wav", "text": "fine", "language": "en"}, row])
    return scan_manifest(m, **kw)


@pytest.mark.parametrize("row, message", [
    ('{"id": "x", "audio": "ok.wav", "text": ', "malformed JSON"),
    ('[1, 2]', "expected a JSON object"),
    ({"id": "x", "text": "hi", "language": "en"}, "missing `audio`"),
    ({"id": "x", "audio": "ok.wav", "language": "en"}, "missing `text`"),
    ({"id": "x", "audio": "ok.wav", "text": 7, "language": "en"}, "`text` must be a string (the transcript), got int 7"),
    ({"id": "x", "audio": "ok.wav", "text": "hi", "language": "xx"}, "unknown language 'xx'; valid codes: ar,"),
    ({"id": "x", "audio": "ok.wav", "text": "hi"}, "missing `language`"),
    ({"id": "x", "audio": "ok.wav", "text": "hi", "language": "en", "keywords": "anna"}, "`keywords` must be a list"),
    ({"id": "x", "audio": "nope.wav", "text": "hi", "language": "en"}, "nope.wav does not exist"),
    ({"id": "ok", "audio": "ok.wav", "text": "hi", "language": "en"}, "duplicate id 'ok' (first on line 1)"),
    ({"id": "x", "audio": "ok.wav", "text": "hi", "language": "en", "context": "anna, ben"},
     "`context` must be a list of strings (words or phrases), got str"),
    ({"id": "x", "audio": "ok.wav", "text": "hi", "language": "en", "context": ["anna", 7]},
     "`context` item 1 must be a string, got int 7"),
    ({"id": "x", "audio": "ok.wav", "text": "hi", "language": "en", "context": ["anna", " "]},
     "`context` item 1 is an empty string"),
])
def test_each_bad_line_is_reported_with_its_line_number(tmp_path, row, message):
    scan = _one_bad(tmp_path, row)
    assert len(scan.utterances) == 1
    assert [p.line for p in scan.problems] == [2]
    assert message in scan.problems[0].message


def test_unreadable_empty_and_zero_length_audio(tmp_path):
    (tmp_path / "garbage.wav").write_bytes(b"this is not a wav file at all" * 10)
    (tmp_path / "empty.wav").write_bytes(b"")
    write_tone(tmp_path / "zero.wav", seconds=0.0)
    m = write_manifest(tmp_path / "m.jsonl", [
        {"id": "g", "audio": "garbage.wav", "text": "a", "language": "en"},
        {"id": "e", "audio": "empty.wav", "text": "a", "language": "en"},
        {"id": "z", "audio": "zero.wav", "text": "a", "language": "en"},
    ])
    scan = scan_manifest(m)
    msgs = {p.line: p.message for p in scan.problems}
    assert "unreadable" in msgs[1] and "garbage.wav" in msgs[1]
    assert "empty (0 bytes)" in msgs[2]
    assert "zero-length" in msgs[3]


def test_over_long_audio_is_a_problem_and_stereo_or_other_rates_are_notes(tmp_path):
    write_tone(tmp_path / "long.wav", seconds=3.0)
    write_tone(tmp_path / "stereo.wav", channels=2, sr=22050)
    m = write_manifest(tmp_path / "m.jsonl", [
        {"id": "l", "audio": "long.wav", "text": "a", "language": "en"},
        {"id": "s", "audio": "stereo.wav", "text": "a", "language": "en"},
    ])
    scan = scan_manifest(m, max_duration=2.0)
    assert [p.line for p in scan.problems] == [1] and "longer than max_duration 2.0s" in scan.problems[0].message
    notes = " | ".join(n.message for n in scan.notes)
    assert "2 channels: mixed down" in notes and "22050 Hz" in notes
    assert [u.id for u in scan.utterances] == ["s"]


def test_read_manifest_raises_listing_every_bad_line(tmp_path):
    m = write_manifest(tmp_path / "m.jsonl", ["{bad", {"audio": "x.wav", "text": ["a"], "language": "en"}])
    with pytest.raises(ManifestError) as err:
        read_manifest(m)
    text = str(err.value)
    assert f"{m}:1: malformed JSON" in text and f"{m}:2: `text` must be a string" in text
    assert len(err.value.problems) == 2


def test_empty_manifest_and_missing_manifest(tmp_path):
    m = tmp_path / "empty.jsonl"
    m.write_text("\n")
    with pytest.raises(ManifestError, match="holds no utterances"):
        read_manifest(m)
    with pytest.raises(FileNotFoundError, match="nope.jsonl does not exist"):
        read_manifest(tmp_path / "nope.jsonl")


def test_a_context_list_is_read_with_the_line_and_a_context_file_one_item_a_line(tmp_path):
    from asr_rl.data.manifest import read_context_file

    write_tone(tmp_path / "a.wav")
    m = write_manifest(tmp_path / "m.jsonl", [
        {"id": "a", "audio": "a.wav", "text": "call grace", "language": "en", "context": ["grace", " living room"]},
        {"id": "b", "audio": "a.wav", "text": "call ben", "language": "en"}])
    a, b = read_manifest(m)
    assert a.context == ("grace", "living room") and b.context == () and "context" not in a.meta
    (tmp_path / "words.txt").write_text("grace\n\n  张伟 \nliving room\n", encoding="utf-8")
    assert read_context_file(tmp_path / "words.txt") == ("grace", "张伟", "living room")
    (tmp_path / "blank.txt").write_text("\n  \n")
    with pytest.raises(ValueError, match="blank.txt holds no words or phrases"):
        read_context_file(tmp_path / "blank.txt")


def test_a_context_file_that_is_a_folder_binary_or_a_json_array(tmp_path):
    from asr_rl.data.manifest import read_context_file

    with pytest.raises(ValueError, match=f"context file {tmp_path} is a folder"):
        read_context_file(tmp_path)
    (tmp_path / "bin.txt").write_bytes(b"grace\n\xff\xfe\x00\x01")
    with pytest.raises(ValueError, match=r"bin\.txt is not UTF-8 text \(byte 6"):
        read_context_file(tmp_path / "bin.txt")
    (tmp_path / "nul.txt").write_bytes(b"grace\x00ben\n")
    with pytest.raises(ValueError, match=r"nul\.txt holds NUL bytes"):
        read_context_file(tmp_path / "nul.txt")
    (tmp_path / "list.json").write_text('["grace", " living room ", "张伟"]\n', encoding="utf-8")
    assert read_context_file(tmp_path / "list.json") == ("grace", "living room", "张伟")
    (tmp_path / "bad.json").write_text('["grace", 3]')
    with pytest.raises(ValueError, match=r"bad\.json: a JSON context list must be an array of strings"):
        read_context_file(tmp_path / "bad.json")
    (tmp_path / "broken.json").write_text('["grace", ')
    with pytest.raises(ValueError, match=r"broken\.json starts like a JSON array but is not one"):
        read_context_file(tmp_path / "broken.json")


def test_a_line_without_text_is_unlabelled_for_rl_and_refused_naming_what_needs_it(tmp_path):
    write_tone(tmp_path / "a.wav")
    m = write_manifest(tmp_path / "m.jsonl", [
        {"id": "l", "audio": "a.wav", "text": "call anna", "language": "en"},
        {"id": "u", "audio": "a.wav", "language": "en"},
        {"id": "n", "audio": "a.wav", "text": None, "language": "en"},
        {"id": "s", "audio": "a.wav", "text": " ", "language": "en"}])
    with pytest.raises(ManifestError) as err:
        read_manifest(m, text_needed_by="SFT")
    assert [p.line for p in err.value.problems] == [2, 3]
    assert f"{m}:2: missing `text` (the transcript): SFT needs one" in str(err.value)
    scan = scan_manifest(m, text_needed_by=None)
    assert not scan.problems and [u.id for u in scan.unlabelled] == ["u", "n"]
    texts = {u.id: u.text for u in scan.utterances}
    assert texts == {"l": "call anna", "u": None, "n": None, "s": ""}  # "": nobody speaks, a labelled line
    assert [(n.line, "non-speech line" in n.message) for n in scan.notes] == [(4, True)]


def test_manifest_row_writes_a_line_that_reads_back_as_the_same_utterance_from_another_folder(tone_manifest, tmp_path):
    from asr_rl.data.manifest import manifest_row

    utts = read_manifest(write_manifest(tmp_path / "in" / "m.jsonl", [
        {"id": "a", "audio": str(tone_manifest.parent / "wavs" / "a.wav"), "language": "en", "speaker": "s1",
         "context": ["anna"], "keywords": ["anna"], "accent": "en-gb"},
        {"id": "b", "audio": str(tone_manifest.parent / "wavs" / "b.wav"), "text": "", "language": "zh"}]),
        text_needed_by=None)
    again = read_manifest(write_manifest(tmp_path / "elsewhere" / "out.jsonl", [manifest_row(u) for u in utts]),
                          text_needed_by=None)
    from dataclasses import replace

    assert [replace(u, source="") for u in again] == [replace(u, source="") for u in utts]
    assert again[0].meta == {"accent": "en-gb"} and again[1].text == "" and again[0].text is None
