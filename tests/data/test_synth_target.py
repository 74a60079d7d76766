"""Tests for the target domain of `asr-rl data synth --domain target` (synth/target.py, the
telephone channel in synth/augment.py, the non-speech clips of synth/nonspeech.py).

The channel and clip tests are pure numpy; the voice check and the end-to-end run need espeak-ng.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from asr_rl.cli import main
from asr_rl.data.manifest import scan_manifest
from asr_rl.data.synth import nonspeech
from asr_rl.data.synth.augment import bandpass, mu_law, telephone
from asr_rl.data.synth.contexts import categories
from asr_rl.data.synth.grammar_en import sample_english
from asr_rl.data.synth.sentence import utterance_rng
from asr_rl.data.synth.target import POOL_FIELDS, synthesize_target
from asr_rl.data.synth.voices import (GROUPS, HELD_OUT_ACCENTS, TARGET_GROUPS, VARIANT_GROUPS, all_voice_ids,
                                      sample_voice)

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                  reason="espeak-ng not installed (sudo apt-get install -y espeak-ng)")
FS = 16000
SOURCE_GROUPS = [g for g in GROUPS if g not in TARGET_GROUPS]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def band_db(x: np.ndarray, y: np.ndarray, lo: float, hi: float) -> float:
    """Output over input power, in dB, summed over the FFT bins in [lo, hi) Hz."""
    f = np.fft.rfftfreq(x.size, 1.0 / FS)
    m = (f >= lo) & (f < hi)
    return float(10 * np.log10(np.sum(np.abs(np.fft.rfft(y)[m]) ** 2) / np.sum(np.abs(np.fft.rfft(x)[m]) ** 2)))


# ---------------------------------------------------------------- voices and sentences


def test_target_voice_groups_are_new_speakers_of_the_held_out_accents():
    for i, group in enumerate(TARGET_GROUPS):
        for lang in ("en", "zh"):  # Mandarin target speakers are new timbres too
            ids = all_voice_ids(group, lang)
            assert not any(ids & all_voice_ids(other, lang) for other in [*SOURCE_GROUPS, *TARGET_GROUPS[i + 1:]])
        for other in [*SOURCE_GROUPS, *TARGET_GROUPS[i + 1:]]:
            # not only the ids: no variant (timbre) is shared, whatever the accent, speed or pitch
            assert not set(VARIANT_GROUPS[group]) & set(VARIANT_GROUPS[other]), (group, other)
        assert {sample_voice(group, "en", np.random.default_rng(k)).accent for k in range(200)} == set(HELD_OUT_ACCENTS)


@needs_espeak
def test_every_target_variant_changes_the_audio():
    # espeak-ng falls back to the default voice for an unknown variant, silently: each target variant
    # must give bytes unlike the default's and every other variant's (source and target).
    def render(voice: str) -> bytes:
        return subprocess.run(["espeak-ng", "-v", voice, "-s", "160", "--stdout", "call anna"],
                              capture_output=True, check=True).stdout
    for accent in HELD_OUT_ACCENTS:
        known = {render(accent): "default"}
        for variant in sorted({v for g in GROUPS for v in VARIANT_GROUPS[g]}):
            wav = render(f"{accent}+{variant}")
            assert wav not in known, (accent, variant, known.get(wav))
            known[wav] = variant


def test_target_sentence_streams_are_not_the_source_ones():
    for split in ("dev", "test"):  # the source corpus has splits of these names
        source = [sample_english(utterance_rng(1, split, i)).text for i in range(40)]
        target = [sample_english(utterance_rng(1, f"target/{split}", i)).text for i in range(40)]
        assert sum(s == t for s, t in zip(source, target)) < 5  # a chance match of a short command at most


# ---------------------------------------------------------------- telephone channel


@pytest.mark.parametrize("freq, expected_db", [
    # Butterworth band-pass of order 4, edges 300 and 3400 Hz, bilinear at 16 kHz (edges pre-warped):
    # |H|^2 = 1 / (1 + W^8), W = (w^2 - w_lo w_hi) / (w (w_hi - w_lo)), w = 2 fs tan(pi f / fs), so
    # W = -1 and +1 (-3.0 dB) at the edges. w_lo = 1,887 and w_hi = 25,227 rad/s (3400 Hz acts as
    # 4,015 Hz). 150 Hz: w = 942.8, W = -2.123, -10 log10(1 + 2.123^8) = -26.2 dB (unwarped: W =
    # -2.145, -26.5 dB). 5000 Hz: w = 47,891 (7,622 Hz), W = 2.009, -24.3 dB (unwarped: 1.547, -15.3).
    (150, -26.2), (300, -3.0), (1000, 0.0), (3400, -3.0), (5000, -24.3),
])
def test_bandpass_follows_the_butterworth_response(freq, expected_db):
    x = np.sin(2 * np.pi * freq * np.arange(2 * FS) / FS)
    y = bandpass(x, FS)
    gain_db = 10 * np.log10(np.mean(y[FS:] ** 2) / np.mean(x[FS:] ** 2))  # steady state: the second second
    assert abs(gain_db - expected_db) < 0.2


def test_telephone_keeps_300_to_3400_hz_and_removes_the_rest():
    x = 0.1 * np.random.default_rng(0).standard_normal(4 * FS + 1)  # -20 dBFS white noise, odd length
    y, info = telephone(x, FS, np.random.default_rng(1))
    assert y.shape == x.shape and info["channel"] == "telephone" and -60 <= info["line_noise_dbfs"] <= -48
    # in the band: unity gain (the coding noise, ~38 dB down, adds < 0.1 dB)
    assert abs(band_db(x, y, 600, 3000)) < 0.5
    # at the edges the band-pass runs twice (sender and receiver): -3 dB twice = -6 dB
    assert abs(band_db(x, y, 280, 320) - -6.0) < 1.0
    assert abs(band_db(x, y, 3380, 3420) - -6.0) < 1.0
    # below 150 Hz: the filters give < -52 dB (-26 dB twice); the line's hiss and the coding noise,
    # ~35 dB under the signal and filtered once, hold it near -40 dB
    assert band_db(x, y, 0, 150) < -35
    # above 4.2 kHz: nothing passes an 8 kHz line; what is left is the resampler's stop band
    assert band_db(x, y, 4200, 8000) < -35


def test_telephone_is_deterministic_per_seed():
    x = np.sin(2 * np.pi * 440 * np.arange(FS) / FS)
    a, b = telephone(x, FS, np.random.default_rng(7))[0], telephone(x, FS, np.random.default_rng(7))[0]
    assert np.array_equal(a, b)
    assert not np.array_equal(a, telephone(x, FS, np.random.default_rng(8))[0])


def test_mu_law_keeps_the_ends_and_codes_about_38_db_below_the_signal():
    assert np.allclose(mu_law(np.array([0.0, 1.0, -1.0])), [0.0, 1.0, -1.0], rtol=0, atol=1e-12)
    # 8-bit mu-law's SNR is ~38 dB over a wide range of levels (G.711), unlike linear 8 bits (~50 dB
    # at full scale, falling 1 dB per dB)
    t = np.arange(FS) / FS
    for amplitude in (0.5, 0.1):
        x = amplitude * np.sin(2 * np.pi * 440 * t)
        snr = 10 * np.log10(np.mean(x ** 2) / np.mean((mu_law(x) - x) ** 2))
        assert 36 < snr < 41, (amplitude, snr)


# ---------------------------------------------------------------- non-speech clips


def test_nonspeech_clips_have_the_level_of_their_kind():
    by_kind: dict[tuple[str, str], list[np.ndarray]] = {}
    for i in range(40):  # every kind, clean (rounds 0 and 2) and through the phone (rounds 1 and 3)
        audio, meta = nonspeech.render_clip(i, np.random.default_rng(i), FS)
        assert 1.0 <= audio.size / FS <= 5.0 and np.max(np.abs(audio)) <= 1.0
        by_kind.setdefault((meta["kind"], meta["channel"]), []).append(audio)
    assert len(by_kind) == 2 * len(nonspeech.KINDS)
    rms_db = {k: [20 * np.log10(np.sqrt(np.mean(a ** 2)) + 1e-12) for a in v] for k, v in by_kind.items()}
    assert all(not np.any(a) for a in by_kind["silence", "clean"])  # digital zero
    assert all(-62 < r < -45 for r in rms_db["silence", "telephone"])  # a line's hiss, -60..-48 dBFS
    assert all(-73 < r < -59 for r in rms_db["room_tone", "clean"])
    for kind in ("white_noise", "pink_noise", "brown_noise"):
        assert all(-41 < r < -14 for r in rms_db[kind, "clean"]), kind
    for kind in ("chord", "arpeggio", "tones", "clicks"):
        assert all(0.09 < np.max(np.abs(a)) < 0.61 for a in by_kind[kind, "clean"]), kind
    # a clip that claims a sound holds one: far above room tone, through the phone too
    for (kind, _), levels in rms_db.items():
        if kind not in ("silence", "room_tone"):
            assert min(levels) > -55, kind


# ---------------------------------------------------------------- end to end


@needs_espeak
def test_target_domain_through_the_cli(tmp_path, capsys):
    out = tmp_path / "target"
    argv = ["data", "synth", "--domain", "target", "--out", str(out), "--train", "30", "--test", "4",
            "--nonspeech", "10", "--seed", "3", "--workers", "1", "--quiet"]
    assert main(argv) == 0
    files = {p.name for p in out.iterdir()}
    assert {"pool.jsonl", "pool_transcripts.jsonl", "pool_labelled.jsonl", "dev.jsonl", "test.jsonl",
            "nonspeech.jsonl", "corpus.json"} <= files
    scans = {n: scan_manifest(out / f"{n}.jsonl", text_needed_by=None)
             for n in ("pool", "pool_labelled", "dev", "test", "nonspeech")}
    assert {n: s.problems for n, s in scans.items()} == {n: [] for n in scans}
    assert {n: len(s.utterances) for n, s in scans.items()} == {"pool": 30, "pool_labelled": 30, "dev": 4, "test": 4,
                                                               "nonspeech": 10}
    pool, transcripts = read_jsonl(out / "pool.jsonl"), read_jsonl(out / "pool_transcripts.jsonl")
    labelled = read_jsonl(out / "pool_labelled.jsonl")
    assert all(u.text is None for u in scans["pool"].utterances)
    assert [t["id"] for t in transcripts] == [r["id"] for r in pool] == [r["id"] for r in labelled]
    assert [t["text"] for t in transcripts] == [r["text"] for r in labelled]
    # the pool keeps nothing of a transcript, and its non-speech lines look like the speech ones
    assert [r for r in pool if set(r) != set(POOL_FIELDS)] == []
    assert pool == [{k: r[k] for k in POOL_FIELDS} for r in labelled]
    silent = [r for r in labelled if r["text"] == ""]
    assert 1 <= len(silent) <= 8 and all(r["channel"] == "telephone" and r["kind"] in nonspeech.KINDS for r in silent)
    for name, group in (("pool", "target_pool"), ("dev", "target_dev"), ("test", "target_test")):
        rows = labelled if name == "pool" else read_jsonl(out / f"{name}.jsonl")
        assert [r["language"] for r in rows] == ["en", "zh"] * (len(rows) // 2)  # the languages alternate
        for row in rows:
            lang = row["language"]
            assert row["channel"] == "telephone" and "context" not in row and len(row["entities"]) == 10
            if row["text"]:
                assert row["speaker"] in all_voice_ids(group, lang)
                cats = categories(lang)
                own = [k for k in row["keywords"] if any(k in words for words in cats.values())]
                assert set(own) <= set(row["entities"])  # the app knows the contact/room/device the line names
            audio, rate = sf.read(out / row["audio"])
            assert rate == FS and 0 < np.max(np.abs(audio)) <= 1.0
            spectrum = np.abs(np.fft.rfft(audio)) ** 2
            assert spectrum[np.fft.rfftfreq(audio.size, 1 / FS) > 4200].sum() < 1e-3 * spectrum.sum()
    ns = read_jsonl(out / "nonspeech.jsonl")
    assert all(r["text"] == "" and r["language"] == "en" for r in ns)
    assert [r["kind"] for r in ns] == list(nonspeech.KINDS)
    meta = json.loads((out / "corpus.json").read_text())
    assert meta["params"]["domain"] == "target" and meta["transcripts"] == {"pool": "pool_transcripts.jsonl"}
    assert meta["params"]["langs"] == ["en", "zh"] and meta["pool_nonspeech"] == len(silent)
    capsys.readouterr()
    assert main(argv) == 0  # the same request again: reused, not rewritten
    assert "pool_transcripts" in capsys.readouterr().out
    # the source corpus is never written over a target one
    assert main(["data", "synth", "--out", str(out), "--langs", "en", "--train", "4", "--test", "2",
                 "--seed", "3", "--quiet"]) == 2
    assert "domain: existing 'target', requested 'source'" in capsys.readouterr().err
    # the same bytes whatever the number of workers
    other = tmp_path / "again"
    synthesize_target(other, n_pool=30, n_test=4, n_nonspeech=10, seed=3, workers=2, progress=False)
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        assert path.read_bytes() == (other / path.relative_to(out)).read_bytes(), path


@needs_espeak
def test_an_english_only_target_and_silence_labelled_in_the_source(tmp_path):
    from asr_rl.data.synth import synthesize

    english = synthesize(tmp_path / "en", "target", langs="en", n_train=4, n_test=2, n_nonspeech=0, seed=3, workers=1,
                         progress=False)
    assert {r["language"] for r in read_jsonl(Path(english["pool_labelled"]["manifest"]))} == {"en"}
    plain = synthesize(tmp_path / "src", "source", langs="en,zh", n_train=4, n_test=1, seed=3, workers=1, progress=False)
    quiet = synthesize(tmp_path / "src_ns", "source", langs="en,zh", n_train=4, n_test=1, seed=3, workers=1,
                       progress=False, n_nonspeech=3)
    rows = read_jsonl(Path(quiet["train"]["manifest"]))
    speech, silent = [r for r in rows if r["text"]], [r for r in rows if not r["text"]]
    assert speech == read_jsonl(Path(plain["train"]["manifest"]))  # the speech lines are untouched
    assert [(r["kind"], r["language"]) for r in silent] == [("silence", "en"), ("room_tone", "zh"), ("white_noise", "en")]
    for r in speech:  # and so is their audio
        assert (tmp_path / "src_ns" / r["audio"]).read_bytes() == (tmp_path / "src" / r["audio"]).read_bytes()


@pytest.mark.parametrize("extra, match", [(["--langs", "fr"], "unknown language code"),
                                          (["--context-sizes", "10"], "no context sizes")])
def test_target_domain_refuses_other_languages_and_context_lists(tmp_path, capsys, extra, match):
    assert main(["data", "synth", "--domain", "target", "--out", str(tmp_path / "t"), *extra, "--quiet"]) == 2
    assert match in capsys.readouterr().err and not (tmp_path / "t").exists()


@pytest.mark.parametrize("flag, value, what", [("--train", "0", "source: training lines; target: the pool's lines"),
                                               ("--test", "0", "lines per test set"),
                                               ("--nonspeech", "-1", "non-speech clips")])
def test_a_size_out_of_range_names_its_flag(tmp_path, capsys, flag, value, what):
    with pytest.raises(SystemExit) as e:
        main(["data", "synth", "--domain", "target", "--out", str(tmp_path / "t"), flag, value, "--quiet"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: must be at least" in err and f"({what})" in err and not (tmp_path / "t").exists()
