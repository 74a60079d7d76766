"""Benchmark: models on conditions that no training data or augmentation of the demo has:

    python scripts/bench_heldout.py --models sft=exp/demo_full_qwen2_audio/sft/final \\
        grpo=exp/demo_full_qwen2_audio/grpo/final

builds (once, under --work) from the demo corpus' test_clean sentences:
  festival     the English sentences spoken by another speech engine (Debian `festival`, voices
               kal_diphone and ked_diphone; skipped with a note when festival is not installed)
  phone_mulaw  test_clean through an 8 kHz mu-law telephone codec (sox), 300-3400 Hz
  speech_babble test_clean mixed at 5 dB SNR with three other test_clean utterances (real speech
               babble, unlike the synthetic babble of the noisy test set)
and prints CER per model and condition.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf

from bench_common import evaluate

FESTIVAL_VOICES = ("kal_diphone", "ked_diphone")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", nargs="+", required=True, help="NAME=MODEL_DIR")
    p.add_argument("--corpus", default="data/demo_corpus_3000")
    p.add_argument("--work", default="exp/heldout")
    args = p.parse_args()
    corpus, work = Path(args.corpus), Path(args.work)
    rows = [json.loads(x) for x in (corpus / "test_clean.jsonl").read_text().splitlines()]
    sets = {"phone_mulaw": build(work / "phone_mulaw", rows, corpus, phone),
            "speech_babble": build(work / "speech_babble", rows, corpus, babble_with(rows, corpus))}
    if shutil.which("text2wave"):
        sets["festival"] = build_festival(work / "festival", [r for r in rows if r["language"] == "en"])
    else:
        print("note: festival is not installed (apt-get install festival festvox-kallpc16k festvox-kdlpc16k): "
              "the other-engine set is skipped")
    names = list(sets)
    results = {}
    for spec in args.models:
        name, model = spec.split("=", 1)
        results[name] = evaluate(Path(model), work, work / "eval" / name, names)
    print(f"\n{'model':<10}" + "".join(f"{n + ' CER%':>20}" for n in names))
    for name, res in results.items():
        print(f"{name:<10}" + "".join(f"{100 * res[n]['cer']:>20.2f}" for n in names))


def build(out: Path, rows: list[dict], corpus: Path, transform) -> Path:
    """`<out>.jsonl` of `rows` with their audio replaced by `transform(wav, sr, i)` (kept once made)."""
    def make(row: dict, i: int, path: Path) -> dict:
        wav, sr = sf.read(corpus / row["audio"], dtype="float64")
        sf.write(path, transform(wav, sr, i), sr, subtype="PCM_16")
        return row
    return write_set(out, rows, make)


def write_set(out: Path, rows: list[dict], make) -> Path:
    manifest = out.parent / f"{out.name}.jsonl"
    if manifest.is_file():
        return manifest
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, row in enumerate(rows):
        path = out / f"{row['id']}.wav"
        lines.append(json.dumps({**make(row, i, path), "audio": str(path.resolve())}, ensure_ascii=False))
    manifest.write_text("\n".join(lines) + "\n")
    return manifest


def phone(wav: np.ndarray, sr: int, i: int) -> np.ndarray:
    """8 kHz mu-law, band-limited 300-3400 Hz, back to the original rate (sox)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, mid, dst = (str(Path(tmp) / n) for n in ("a.wav", "b.wav", "c.wav"))
        sf.write(src, wav, sr, subtype="PCM_16")
        subprocess.run(["sox", src, "-r", "8000", "-e", "mu-law", mid, "sinc", "300-3400"], check=True)
        subprocess.run(["sox", mid, "-r", str(sr), "-e", "signed-integer", "-b", "16", dst], check=True)
        out, _ = sf.read(dst, dtype="float64")
    return np.pad(out, (0, max(0, wav.size - out.size)))[: wav.size]


def babble_with(rows: list[dict], corpus: Path):
    def mix(wav: np.ndarray, sr: int, i: int) -> np.ndarray:
        noise = np.zeros_like(wav)
        for k in (1, 2, 3):
            other, _ = sf.read(corpus / rows[(i + 37 * k) % len(rows)]["audio"], dtype="float64")
            noise += np.resize(other, wav.size)
        scale = np.sqrt(np.mean(wav ** 2) / (np.mean(noise ** 2) * 10 ** (5 / 10)))
        out = wav + scale * noise
        return out / max(1.0, np.abs(out).max() / 0.95)
    return mix


def build_festival(out: Path, rows: list[dict]) -> Path:
    def make(row: dict, i: int, path: Path) -> dict:
        voice = FESTIVAL_VOICES[i % len(FESTIVAL_VOICES)]
        raw = path.with_suffix(".raw.wav")
        subprocess.run(["text2wave", "-eval", f"(voice_{voice})", "-o", str(raw)], input=row["text"], text=True,
                       check=True, capture_output=True)
        subprocess.run(["sox", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(path)], check=True)
        raw.unlink()
        return {**row, "speaker": f"festival:{voice}"}
    return write_set(out, rows, make)


if __name__ == "__main__":
    main()
