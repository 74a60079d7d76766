"""Tests for the offline demo corpus synthesiser (asr_rl.data.synth).

The pure parts (grammars, pinyin, voices, noise mixing, argument checks) run everywhere; the audio
tests synthesise a handful of utterances and need espeak-ng and flite.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from asr_rl.data.synth import corpus as corpus_mod
from asr_rl.data.synth import synthesize_corpus
from asr_rl.data.synth.augment import NOISE_KINDS, corrupt, make_noise, mix_at_snr
from asr_rl.data.synth.grammar_en import number_words, sample_english, time_words
from asr_rl.data.synth.grammar_zh import sample_mandarin, to_pinyin, zh_clock, zh_number
from asr_rl.data.synth.voices import GROUPS, HELD_OUT_ACCENTS, all_voice_ids, sample_voice

MISSING_TOOLS = [t for t in ("espeak-ng", "flite") if shutil.which(t) is None]
needs_tts = pytest.mark.skipif(
    bool(MISSING_TOOLS),
    reason=f"{', '.join(MISSING_TOOLS)} not installed (sudo apt-get install -y espeak-ng flite)")
SMALL = dict(langs=("en", "zh"), n_train=6, n_test=2, seed=1, progress=False)
SPLIT_SIZES = {"train": 6, "dev": 2, "test_clean": 2, "test_noisy": 2, "test_accent": 2}
HAN = re.compile(r"^[\u4e00-\u9fff]+$")


def read_manifest(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


# ---------------------------------------------------------------- grammar and text


def test_grammars_are_deterministic_per_rng_state():
    for sample in (sample_english, sample_mandarin):
        first = [sample(np.random.default_rng([3, i])) for i in range(50)]
        again = [sample(np.random.default_rng([3, i])) for i in range(50)]
        other = [sample(np.random.default_rng([4, i])) for i in range(50)]
        assert first == again
        assert [s.text for s in first] != [s.text for s in other]
        assert len({s.text for s in first}) > 30  # varied, not one template repeated


def test_keywords_are_substrings_and_vocabulary_is_moderate():
    en_words, zh_chars = set(), set()
    for i in range(3000):
        for s in (sample_english(np.random.default_rng(i)), sample_mandarin(np.random.default_rng(i))):
            assert s.keywords and all(k in s.text for k in s.keywords), s
        en_words |= set(sample_english(np.random.default_rng(i)).text.split())
        zh_chars |= set(sample_mandarin(np.random.default_rng(i)).text)
    # A ~5M-param model must learn this from ~3000 utterances.
    assert 60 < len(en_words) < 250
    assert 60 < len(zh_chars) < 250


def test_english_numbers_are_written_as_spoken():
    assert number_words(21) == "twenty one"
    assert number_words(40) == "forty"
    assert time_words(7, 0) == "seven"
    assert time_words(7, 5) == "seven oh five"
    assert time_words(12, 45) == "twelve forty five"
    for i in range(500):
        assert not re.search(r"\d", sample_english(np.random.default_rng(i)).text)


def test_mandarin_text_is_characters_with_one_pinyin_syllable_each():
    assert zh_number(21) == "二十一" and zh_number(10) == "十" and zh_number(2, counting=True) == "两"
    assert zh_clock(7, 30) == "七点半" and zh_clock(2, 5) == "两点零五分"
    assert to_pinyin("定一个七点的闹钟") == "ding4 yi2 ge4 qi1 dian3 de5 nao4 zhong1"
    for i in range(2000):
        s = sample_mandarin(np.random.default_rng(i))
        syllables = s.speak.split()
        assert HAN.match(s.text), s.text
        assert len(syllables) == len(s.text), s
        assert all(re.fullmatch(r"[a-z]+[1-5]", syl) for syl in syllables), s.speak


# ---------------------------------------------------------------- voices


def test_dev_and_test_voices_never_occur_in_train():
    for lang in ("en", "zh"):
        train = all_voice_ids("train", lang)
        for group in GROUPS:
            if group != "train":
                assert not train & all_voice_ids(group, lang), (group, lang)
        assert not all_voice_ids("dev", lang) & all_voice_ids("test", lang)
    assert not any(accent in vid for accent in HELD_OUT_ACCENTS for vid in all_voice_ids("train", "en"))


def test_sampled_voices_stay_in_their_group():
    for group in GROUPS:
        for lang in ("en", "zh"):
            allowed = all_voice_ids(group, lang)
            for i in range(200):
                assert sample_voice(group, lang, np.random.default_rng(i)).id in allowed


# ---------------------------------------------------------------- noise


@pytest.mark.parametrize("kind", NOISE_KINDS)
@pytest.mark.parametrize("snr_db", [5.0, 12.3, 20.0])
def test_mix_at_snr_gives_the_requested_snr(kind, snr_db):
    rng = np.random.default_rng(0)
    t = np.arange(16000) / 16000
    speech = 0.3 * np.sin(2 * np.pi * 220 * t) * (t > 0.2)  # silence at the start, as in TTS output
    noise = make_noise(kind, speech.size, rng, 16000)
    mixed = mix_at_snr(speech, noise, snr_db)
    measured = 10 * np.log10(np.mean(speech ** 2) / np.mean((mixed - speech) ** 2))
    assert abs(measured - snr_db) < 0.5


def test_corrupt_reports_what_it_did():
    audio = np.sin(np.linspace(0, 2000, 24000))
    noisy, info = corrupt(audio, np.random.default_rng(1), 16000)
    assert noisy.shape == audio.shape and not np.allclose(noisy, audio)
    assert 5.0 <= info["noise_snr_db"] <= 20.0 and info["noise_type"] in NOISE_KINDS
    assert info["reverb_rt60"] > 0


# ---------------------------------------------------------------- arguments and folders


def test_unknown_language_lists_supported_ones(tmp_path):
    with pytest.raises(ValueError, match=r"fr.*supported: en, zh"):
        synthesize_corpus(tmp_path / "c", langs=("en", "fr"), progress=False)
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("bad", [dict(n_train=0), dict(n_test=-1), dict(seed="1"), dict(workers=0),
                                 dict(langs="")])
def test_bad_arguments_raise_value_error(tmp_path, bad):
    with pytest.raises(ValueError):
        synthesize_corpus(tmp_path / "c", **{**SMALL, **bad})


def test_language_order_does_not_matter():
    assert corpus_mod.parse_languages("zh, EN") == ("en", "zh")
    assert corpus_mod.corpus_params(["zh", "en"], 6, 2, 1) == corpus_mod.corpus_params("en,zh", 6, 2, 1)


def test_missing_espeak_names_the_tool_and_apt_command(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(RuntimeError, match=r"espeak-ng.*apt-get install -y espeak-ng"):
        synthesize_corpus(tmp_path / "c", **SMALL)
    assert list(tmp_path.iterdir()) == []


def test_foreign_non_empty_folder_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=re.escape(str(tmp_path))):
        synthesize_corpus(tmp_path, **SMALL)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_crash_leaves_no_partial_corpus(tmp_path, monkeypatch):
    def boom(job):
        raise RuntimeError("synthetic failure")

    monkeypatch.setattr(corpus_mod.tts, "check_tools", lambda langs: None)
    monkeypatch.setattr(corpus_mod, "render_utterance", boom)
    with pytest.raises(RuntimeError, match="synthetic failure"):
        synthesize_corpus(tmp_path / "c", **SMALL, workers=1)
    assert list(tmp_path.iterdir()) == []  # neither out_dir nor the temp folder beside it


# ---------------------------------------------------------------- real audio


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "corpus"
    return out, synthesize_corpus(out, **SMALL, workers=2)


@needs_tts
def test_manifests_have_the_right_counts(corpus):
    out, summary = corpus
    assert {k: v["utterances"] for k, v in summary.items()} == SPLIT_SIZES
    for split, info in summary.items():
        assert Path(info["manifest"]) == out / f"{split}.jsonl"
        assert len(read_manifest(info["manifest"])) == SPLIT_SIZES[split]
        assert info["hours"] > 0
    assert json.loads((out / "corpus.json").read_text())["params"]["n_train"] == 6


@needs_tts
def test_audio_is_16k_mono_speech_matching_the_manifest(corpus):
    out, summary = corpus
    for info in summary.values():
        for row in read_manifest(info["manifest"]):
            assert not Path(row["audio"]).is_absolute()
            audio, rate = sf.read(out / row["audio"], dtype="float32")
            meta = sf.info(out / row["audio"])
            assert (rate, meta.channels, meta.subtype) == (16000, 1, "PCM_16")
            assert abs(audio.size / rate - row["duration"]) < 1e-3
            assert 0.5 < row["duration"] < 10.0
            assert np.sqrt(np.mean(audio ** 2)) > 0.01  # speech, not silence
            assert set(row) >= {"id", "audio", "text", "language", "keywords", "duration",
                                "speaker", "accent"}
            assert all(k in row["text"] for k in row["keywords"])


@needs_tts
def test_both_languages_with_chinese_character_references(corpus):
    _, summary = corpus
    for split in ("train", "dev", "test_clean", "test_noisy"):
        rows = read_manifest(summary[split]["manifest"])
        assert {r["language"] for r in rows} == {"en", "zh"}
        for r in rows:
            if r["language"] == "zh":
                assert HAN.match(r["text"]) and r["speaker"].startswith("espeak:cmn-latn-pinyin+")
            else:
                assert re.fullmatch(r"[a-z ]+", r["text"])
    assert {r["accent"] for r in read_manifest(summary["test_accent"]["manifest"])} <= set(HELD_OUT_ACCENTS)


@needs_tts
def test_held_out_speakers_never_in_train(corpus):
    _, summary = corpus
    train = {r["speaker"] for r in read_manifest(summary["train"]["manifest"])}
    for split in ("dev", "test_clean", "test_noisy", "test_accent"):
        assert not train & {r["speaker"] for r in read_manifest(summary[split]["manifest"])}


@needs_tts
def test_noisy_set_is_corrupted_within_the_snr_range(corpus):
    _, summary = corpus
    noisy = read_manifest(summary["test_noisy"]["manifest"])
    clean = read_manifest(summary["test_clean"]["manifest"])
    assert all(5.0 <= r["noise_snr_db"] <= 20.0 for r in noisy)
    assert not any("noise_snr_db" in r for r in clean)
    assert [r["id"] for r in noisy] != [r["id"] for r in clean]


@needs_tts
def test_same_seed_gives_identical_bytes_whatever_the_worker_count(corpus, tmp_path):
    out, summary = corpus
    again = synthesize_corpus(tmp_path / "again", **SMALL, workers=1)
    for split, info in summary.items():
        assert Path(again[split]["manifest"]).read_bytes() == Path(info["manifest"]).read_bytes()
        for row in read_manifest(info["manifest"]):
            assert (tmp_path / "again" / row["audio"]).read_bytes() == (out / row["audio"]).read_bytes()


@needs_tts
def test_other_seed_gives_other_texts(corpus, tmp_path):
    _, summary = corpus
    other = synthesize_corpus(tmp_path / "other", **{**SMALL, "seed": 2, "n_test": 1}, workers=1)
    texts = [r["text"] for r in read_manifest(other["train"]["manifest"])]
    assert texts != [r["text"] for r in read_manifest(summary["train"]["manifest"])]


@needs_tts
def test_rerun_with_same_params_is_a_no_op(corpus):
    out, summary = corpus
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    assert synthesize_corpus(out, **SMALL) == summary
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before


@needs_tts
def test_different_params_in_the_same_folder_are_refused(corpus):
    out, _ = corpus
    with pytest.raises(FileExistsError, match=re.escape(str(out)) + r".*n_train: existing 6, requested 7"):
        synthesize_corpus(out, **{**SMALL, "n_train": 7})
