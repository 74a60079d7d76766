"""Users' data as they have it (issue 40): a `datasets` save_to_disk folder, parquet shards, a NeMo
manifest and a Kaldi folder each train SFT (evaluating the dev set in the same format during
training) and GRPO, and `asr-rl eval` scores them, with no conversion step."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from asr_rl.cli import main
from asr_rl.config import load_config
from asr_rl.data.manifest import read_manifest
from asr_rl.trainer.configs.rl import SFTConfig
from asr_rl.trainer.recipes.rl import load_rl_config, run_audio_rl
from asr_rl.trainer.recipes.sft import train_sft
from asr_rl.trainer.run.metrics import read_metrics
from tests.trainer.driver.test_grpo_e2e import _overrides
from tests.trainer.recipes.test_sft import _overrides as _sft_overrides

pytestmark = pytest.mark.slow


def _datasets(utts, out: Path, parquet: bool) -> Path:
    """Audio as the file's bytes in the `datasets` Audio feature, the transcript in `sentence`."""
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({
        "id": [u.id for u in utts], "audio": [{"bytes": Path(u.audio).read_bytes(), "path": None} for u in utts],
        "sentence": [u.text for u in utts], "language": [u.language for u in utts]})
    ds = ds.cast_column("audio", datasets.Audio())
    if not parquet:
        ds.save_to_disk(str(out))
        return out
    out.mkdir(parents=True)
    half = len(ds) // 2  # two shards, as the hub ships them
    ds.select(range(half)).to_parquet(str(out / "train-00000-of-00002.parquet"))
    ds.select(range(half, len(ds))).to_parquet(str(out / "train-00001-of-00002.parquet"))
    return out


def _nemo(utts, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps({"audio_filepath": u.audio, "text": u.text, "duration": u.duration,
                                       "lang": u.language}, ensure_ascii=False) + "\n" for u in utts),
                   encoding="utf-8")
    return out


def _kaldi(utts, out: Path) -> Path:
    out.mkdir(parents=True)
    for name, values in (("wav.scp", [u.audio for u in utts]), ("text", [u.text for u in utts]),
                         ("utt2lang", [u.language for u in utts])):
        (out / name).write_text("".join(f"{u.id} {v}\n" for u, v in zip(utts, values)), encoding="utf-8")
    return out


FORMATS = {"datasets": (lambda u, o: _datasets(u, o / "hf", False), ["data.text_column=sentence"]),
           "parquet": (lambda u, o: _datasets(u, o / "pq", True), ["data.text_column=sentence"]),
           "nemo": (lambda u, o: _nemo(u, o / "nemo" / "manifest.json"), []),
           "kaldi": (lambda u, o: _kaldi(u, o / "kaldi"), [])}


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_each_format_trains_sft_and_grpo_and_evaluates_without_conversion(fmt, tiny_model, tiny_corpus, tmp_path,
                                                                         capsys):
    write, options = FORMATS[fmt]
    train = write(read_manifest(tiny_corpus / "train.jsonl"), tmp_path / "train")
    dev = write(read_manifest(tiny_corpus / "dev.jsonl"), tmp_path / "dev")
    common = [f"train_manifest={train}", f"eval_manifest={dev}", "eval_steps=1", *options]

    train_sft(load_config(SFTConfig, None, _sft_overrides(tiny_model, tiny_corpus, tmp_path / "sft", "max_steps=1",
                                                          "save_steps=0", *common)))
    (row,) = read_metrics(tmp_path / "sft")
    assert row["loss/ce"] > 0 and row["eval/cer"] >= 0
    run_audio_rl(load_rl_config("grpo", None, _overrides(tiny_model, tiny_corpus, tmp_path / "grpo", "max_steps=1",
                                                         *common)))
    rows = read_metrics(tmp_path / "grpo")  # the start's dev CER, then the step's
    assert "reward/mean" in rows[-1] and all(r["eval/cer"] >= 0 for r in rows if "eval/cer" in r)
    assert sum("eval/cer" in r for r in rows) >= 1

    flags = ["--text-column", "sentence"] if "data.text_column=sentence" in options else []
    assert main(["eval", "--model", str(tiny_model), "--test-set", f"dev={dev}", "--quiet",
                 "--output", str(tmp_path / "eval"), *flags]) == 0
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    dev_lines = len(read_manifest(tiny_corpus / "dev.jsonl"))
    assert report["test_sets"]["dev"]["utterances"] == dev_lines and report["test_sets"]["dev"]["failed"] == 0
