from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import Qwen3ASRForConditionalGeneration

from asr_rl.config import load_config
from asr_rl.trainer.configs.rl import SFTConfig
from asr_rl.trainer.run.metrics import read_metrics
from asr_rl.trainer.recipes.sft import train_sft

FAULT = Path(__file__).resolve().parents[2] / "fault.py"  # SIGKILL at a chosen point, outside the product

def _overrides(tiny_model, tiny_corpus, out, *extra):
    return [f"pretrain={tiny_model}", f"train_manifest={tiny_corpus / 'train.jsonl'}", f"output_dir={out}",
            "train_batch_size=4", "micro_train_batch_size=2", "max_steps=2", "save_steps=1", "eval_steps=0",
            "logging.tensorboard=false", "logging.progress_bar=false", *extra]


def _cfg(tiny_model, tiny_corpus, out, *extra):
    return load_config(SFTConfig, None, _overrides(tiny_model, tiny_corpus, out, *extra))


def _params(path):
    return dict(Qwen3ASRForConditionalGeneration.from_pretrained(path).named_parameters())


def test_sft_step_changes_trainable_and_leaves_frozen_parameters(tiny_model, tiny_corpus, tmp_path):
    final = train_sft(_cfg(tiny_model, tiny_corpus, tmp_path / "run", "model.freeze_encoder=true", "max_steps=1",
                           f"eval_manifest={tiny_corpus / 'dev.jsonl'}"))
    before, after = _params(tiny_model), _params(final)
    encoder = [n for n in before if n.startswith("model.audio_tower.")]
    others = [n for n in before if not n.startswith("model.audio_tower.")]
    assert encoder and all(torch.equal(before[n], after[n]) for n in encoder)
    changed = [n for n in others if not torch.equal(before[n], after[n])]
    assert any("multi_modal_projector" in n for n in changed) and any("language_model.layers" in n for n in changed)
    (row,) = read_metrics(tmp_path / "run")
    assert row["step"] == 1 and row["loss/ce"] > 0 and "eval/cer" in row
    assert "loss/ctc" not in row  # CTC only trains an encoder: off when it is frozen


def test_several_manifests_are_refused_saying_sft_takes_one(tiny_model, tiny_corpus, tmp_path):
    both = f"{tiny_corpus / 'train.jsonl'},{tiny_corpus / 'dev.jsonl'}"
    with pytest.raises(ValueError, match=r"names 2 datasets, and SFT trains on one manifest: join their lines"):
        _cfg(tiny_model, tiny_corpus, tmp_path / "run", f"train_manifest={both}")


def test_ctc_on_a_frozen_encoder_is_refused(tiny_model, tiny_corpus, tmp_path):
    with pytest.raises(ValueError, match="ctc_weight=0.5 trains the audio encoder, which is frozen"):
        train_sft(_cfg(tiny_model, tiny_corpus, tmp_path / "run", "model.freeze_encoder=true", "ctc_weight=0.5"))


def test_sft_on_a_pretrained_encoder_freezes_it_and_encodes_each_variant_once(whisper_model, tiny_corpus, tmp_path,
                                                                              monkeypatch):
    """Eight steps over 8 utterances (four epochs) with 2 augmented variants: the frozen Whisper tower
    runs once per distinct (utterance, variant) drawn; its weights do not move, the projector's do."""
    from transformers import Qwen2AudioForConditionalGeneration

    from tests.models.test_encoder_cache import count_mel_convolutions

    seen = count_mel_convolutions(monkeypatch)
    final = train_sft(_cfg(whisper_model, tiny_corpus, tmp_path / "run", "max_steps=8", "save_steps=0",
                           "augment.noise_prob=1", "augment.variants=2", "logging.logging_steps=1"))
    before = dict(Qwen2AudioForConditionalGeneration.from_pretrained(whisper_model).named_parameters())
    after = dict(Qwen2AudioForConditionalGeneration.from_pretrained(final).named_parameters())
    tower = [n for n in before if n.startswith("model.audio_tower.")]
    assert tower and all(torch.equal(before[n], after[n]) for n in tower)
    assert not torch.equal(before["model.multi_modal_projector.linear.weight"],
                           after["model.multi_modal_projector.linear.weight"])
    rows = read_metrics(tmp_path / "run")
    distinct = rows[-1]["encoder/cached"]  # distinct (utterance, variant) pairs drawn in 32 draws
    assert 8 < distinct <= 24 and sum(seen) == distinct
    assert "loss/ctc" not in rows[-1]


def test_sft_trains_the_encoder_by_default_and_loss_falls(tiny_model, tiny_corpus, tmp_path):
    final = train_sft(_cfg(tiny_model, tiny_corpus, tmp_path / "run", "max_steps=12", "save_steps=0",
                           "optim.learning_rate=0.01", "augment.noise_prob=0", "augment.spec_augment=false",
                           "data.shuffle=false", "train_batch_size=8", "micro_train_batch_size=8"))
    before, after = _params(tiny_model), _params(final)
    assert not torch.equal(before["model.audio_tower.conv2d1.weight"], after["model.audio_tower.conv2d1.weight"])
    rows = read_metrics(tmp_path / "run")
    assert rows[-1]["loss/ce"] < 0.7 * rows[0]["loss/ce"]


def test_sft_killed_after_step_2_resumes_to_the_same_result(tiny_model, tiny_corpus, tmp_path):
    straight = tmp_path / "straight"
    train_sft(_cfg(tiny_model, tiny_corpus, straight, "max_steps=3"))
    resumed = tmp_path / "resumed"
    args = [str(a) for a in [sys.executable, FAULT, "after-step", 2, "--", "train", "sft", *_overrides(
        tiny_model, tiny_corpus, resumed, "max_steps=3")]]
    killed = subprocess.run(args, capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not (resumed / "final").exists()
    train_sft(_cfg(tiny_model, tiny_corpus, resumed, "max_steps=3", "resume=auto"))
    a, b = read_metrics(straight), read_metrics(resumed)
    assert [r["step"] for r in b] == [1, 2, 3]
    for key in ("loss/ce", "loss/ctc", "grad_norm", "lr"):
        assert b[2][key] == pytest.approx(a[2][key], rel=1e-5), key
    pa, pb = _params(straight / "final"), _params(resumed / "final")
    worst = max((pa[n] - pb[n]).abs().max().item() for n in pa)
    assert worst < 1e-6, worst
    assert sorted(p.name for p in (resumed / "checkpoints").iterdir()) == ["latest", "step_000002", "step_000003"]
    # the random encoder trained (CTC on): its folder says for how many steps, resumed or not
    from asr_rl.models.builders import read_info

    assert read_info(straight / "final")["encoder_steps"] == read_info(resumed / "final")["encoder_steps"] == 3
    assert read_info(resumed / "checkpoints" / "step_000002")["encoder_steps"] == 2


def test_killed_during_a_checkpoint_save_resumes_from_the_one_before(tiny_model, tiny_corpus, tmp_path):
    # SIGKILL after step 2's weights are written and before its resume state: step 1's checkpoint
    # stays loadable, resume=auto picks it, and the run ends where an uninterrupted one does
    straight = tmp_path / "straight"
    train_sft(_cfg(tiny_model, tiny_corpus, straight, "max_steps=3", "save_steps=1"))
    run = tmp_path / "run"
    args = [str(a) for a in [sys.executable, FAULT, "mid-save", 2, "--", "train", "sft", *_overrides(
        tiny_model, tiny_corpus, run, "max_steps=3", "save_steps=1")]]
    killed = subprocess.run(args, capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    left = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert "step_000001" in left and "step_000002" not in left and any(".tmp" in n for n in left), left
    train_sft(_cfg(tiny_model, tiny_corpus, run, "max_steps=3", "save_steps=1"))
    assert not any(".tmp" in p.name for p in (run / "checkpoints").iterdir())
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]
    pa, pb = _params(straight / "final"), _params(run / "final")
    assert max((pa[n] - pb[n]).abs().max().item() for n in pa) < 1e-6


def test_every_micro_batch_of_every_step_draws_its_own_augmentation(tiny_model, tiny_corpus, tmp_path, monkeypatch):
    # 2 steps x 2 micro-batches: four distinct SpecAugment streams (a seed shared by micro-batches of
    # different steps once made them mask alike)
    import copy

    import asr_rl.trainer.recipes.sft as sft

    draws, real = [], sft.spec_augment
    def recording(features, mask, cfg, rng):
        draws.append(copy.deepcopy(rng).random())  # the stream's first number, not consuming it
        return real(features, mask, cfg, rng)
    monkeypatch.setattr(sft, "spec_augment", recording)
    train_sft(_cfg(tiny_model, tiny_corpus, tmp_path / "r", "save_steps=0"))
    assert len(draws) == 4 and len(set(draws)) == 4


def test_sft_config_errors(tiny_model, tiny_corpus, tmp_path):
    with pytest.raises(ValueError, match="not a multiple of micro_train_batch_size 3"):
        _cfg(tiny_model, tiny_corpus, tmp_path, "micro_train_batch_size=3")
    with pytest.raises(ValueError, match="`train_manifest` is not set"):
        train_sft(_cfg(tiny_model, tiny_corpus, tmp_path / "x", "train_manifest=null"))


def test_noise_and_reverb_augmentation_hits_the_requested_snr():
    import numpy as np

    from asr_rl.data.augment import AugmentConfig, augment_waveforms

    rng = np.random.default_rng(0)
    wav = (0.3 * np.sin(np.arange(16000) / 16000 * 2 * np.pi * 220)).astype(np.float32)
    cfg = AugmentConfig(noise_prob=1.0, noise_snr_min=10.0, noise_snr_max=10.0, reverb_prob=0.0)
    (noisy,) = augment_waveforms([wav], cfg, rng)
    noise = noisy.astype(np.float64) - wav
    assert 10 * np.log10(np.mean(wav.astype(np.float64) ** 2) / np.mean(noise ** 2)) == pytest.approx(10.0, abs=0.05)
    (reverbed,) = augment_waveforms([wav], AugmentConfig(noise_prob=0.0, reverb_prob=1.0), rng)
    assert reverbed.shape == wav.shape and not np.allclose(reverbed, wav)
    assert np.array_equal(augment_waveforms([wav], AugmentConfig(noise_prob=0.0), rng)[0], wav)


def test_transcripts_the_model_cannot_write_are_reported_not_trained_on(tiny_model, tiny_corpus, tmp_path, capsys):
    # the tiny model's character tokenizer was built from en/zh texts: Japanese kana would be
    # dropped from the targets (an empty target trains nothing) if nothing checked
    import json

    from asr_rl.cli import main

    rows = [json.loads(x) for x in (tiny_corpus / "train.jsonl").read_text(encoding="utf-8").splitlines()]
    for r in rows:
        r["audio"] = str(tiny_corpus / r["audio"])
    rows[1]["text"] = "アニメ"
    rows[3]["text"] = rows[3]["text"] + " ✓"
    rows[5]["context"] = ["grace", "アニメ"]  # prompt text: a dropped character would rename the item
    manifest = tmp_path / "ja.jsonl"
    manifest.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert main(["data", "check", "--manifest", str(manifest), "--model", str(tiny_model)]) == 1
    out = capsys.readouterr().out
    assert f"{manifest}:2: characters the model ({tiny_model}) cannot write: ア ニ メ" in out
    assert f"{manifest}:4: characters the model ({tiny_model}) cannot write: ✓" in out
    assert f"{manifest}:6 (context): characters the model ({tiny_model}) cannot write: ア ニ メ" in out
    assert "bad lines:  3" in out
    with pytest.raises(ValueError, match=rf"3 transcripts or context lists hold characters .* e\.g\. "
                                         rf"{manifest}:2: ア ニ メ; {manifest}:4: ✓; {manifest}:6 \(context\): ア ニ メ"):
        train_sft(_cfg(tiny_model, tiny_corpus, tmp_path / "run", f"train_manifest={manifest}"))
    assert main(["data", "check", "--manifest", str(tiny_corpus / "train.jsonl"), "--model", str(tiny_model)]) == 0


def _scripted_dev(monkeypatch, values, fail_at=None):
    """Dev CER of the n-th evaluation in this process is values[n - 1] (one evaluation a step with
    eval_steps=1); the evaluation numbered `fail_at` fails once, uncounted, like a crash in it."""
    import asr_rl.trainer.recipes.sft as sft

    done, failed = [], []

    def evaluate(policy, manifest, eval_cfg, options=None):
        n = len(done) + 1
        if n == fail_at and not failed:
            failed.append(n)
            raise RuntimeError("evaluation failed")
        done.append(n)
        return {"eval/cer": values[n - 1]}
    monkeypatch.setattr(sft, "evaluate_during_training", evaluate)


# best at step 2, then two evaluations without an improvement: patience 2 ends the run at step 4 of 10
EARLY = ["max_steps=10", "eval_steps=1", "save_steps=1", "max_ckpt_num=10", "early_stopping_patience=2",
         "early_stopping_min_delta=0.01"]
DEV_CER = [0.9, 0.6, 0.595, 0.7, 0.5, 0.5]


def test_early_stopping_keeps_the_best_step_as_best_and_ends_the_run(tiny_model, tiny_corpus, tmp_path, monkeypatch):
    import json

    _scripted_dev(monkeypatch, DEV_CER)
    out = tmp_path / "run"
    final = train_sft(_cfg(tiny_model, tiny_corpus, out, *EARLY, f"eval_manifest={tiny_corpus / 'dev.jsonl'}"))
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["eval/best_cer"] for r in rows] == [0.9, 0.6, 0.6, 0.6]  # 0.595 is within min_delta
    assert [r["early_stopping/bad_evals"] for r in rows] == [0, 0, 1, 2]
    assert json.loads((out / "best" / "best.json").read_text()) == {"metric": "eval/cer", "step": 2, "value": 0.6}
    best, at2, at4, last = (_params(p) for p in (out / "best", out / "checkpoints" / "step_000002",
                                                 out / "checkpoints" / "step_000004", final))
    assert all(torch.equal(best[n], at2[n]) for n in best) and not all(torch.equal(best[n], at4[n]) for n in best)
    assert all(torch.equal(last[n], at4[n]) for n in last)  # final/ is the last step's weights
    assert not (out / "checkpoints" / "step_000005").exists()


def test_early_stopping_resumed_mid_patience_stops_where_the_uninterrupted_run_does(tiny_model, tiny_corpus, tmp_path,
                                                                                  monkeypatch):
    dev = f"eval_manifest={tiny_corpus / 'dev.jsonl'}"
    _scripted_dev(monkeypatch, DEV_CER)
    straight = tmp_path / "straight"
    train_sft(_cfg(tiny_model, tiny_corpus, straight, *EARLY, dev))
    # the evaluation of step 4 fails: the last checkpoint is step 3's, after one evaluation without an improvement
    _scripted_dev(monkeypatch, DEV_CER, fail_at=4)
    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match="evaluation failed"):
        train_sft(_cfg(tiny_model, tiny_corpus, run, *EARLY, dev))
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000003" and not (run / "final").exists()
    train_sft(_cfg(tiny_model, tiny_corpus, run, *EARLY, dev, "resume=auto"))
    a, b = read_metrics(straight), read_metrics(run)
    assert [r["step"] for r in b] == [1, 2, 3, 4] and b[-1]["early_stopping/bad_evals"] == 2
    assert b[-1]["loss/ce"] == pytest.approx(a[-1]["loss/ce"], rel=1e-5)
    pa, pb = _params(straight / "final"), _params(run / "final")
    assert max((pa[n] - pb[n]).abs().max().item() for n in pa) < 1e-6
    assert (run / "best" / "best.json").read_text() == (straight / "best" / "best.json").read_text()


def test_out_of_patience_sft_anneals_the_rate_over_the_decay_steps_then_ends(tiny_model, tiny_corpus, tmp_path,
                                                                             monkeypatch):
    # WSD at 1e-3 (floor 0.1, linear, no warmup); patience 1 runs out at step 2: steps 3 and 4 train at
    # 1e-3 * (0.1 + 0.9 * (1 - j / 2)) for j = 1, 2 = 5.5e-4, 1e-4, and the run ends at 4 of 10
    from asr_rl.trainer.run.checkpoint import load_state

    _scripted_dev(monkeypatch, [0.9, 0.95, 0.8, 0.85])
    out = tmp_path / "run"
    train_sft(_cfg(tiny_model, tiny_corpus, out, "max_steps=10", "eval_steps=1", "save_steps=1", "max_ckpt_num=10",
                   f"eval_manifest={tiny_corpus / 'dev.jsonl'}", "early_stopping_patience=1",
                   "early_stopping_decay_steps=2", "optim.lr_scheduler=warmup_stable_decay", "optim.lr_warmup_ratio=0",
                   "optim.learning_rate=1e-3", "optim.min_lr_ratio=0.1", "optim.lr_decay_style=linear"))
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and [r["early_stopping/bad_evals"] for r in rows] == [0, 1, 0, 1]
    state = load_state(out / "checkpoints" / "step_000002")  # written after the evaluation that began the decay
    assert state["lr_decay"] == (2, 2, 1.0) and state["early_stopping"]["decay_end"] == 4
    assert state["optimizer"]["param_groups"][0]["lr"] == pytest.approx(5.5e-4)
    assert rows[2]["lr"] == pytest.approx(1e-4)  # "lr" is the next step's rate: step 4's, the floor
    assert '"step": 3' in (out / "best" / "best.json").read_text()  # the decay found the best


# ---------------------------------------------------------------------------------- bad input, round four
def _rows(tiny_corpus):
    import json

    rows = [json.loads(x) for x in (tiny_corpus / "train.jsonl").read_text(encoding="utf-8").splitlines()]
    for r in rows:
        r["audio"] = str(tiny_corpus / r["audio"])
    return rows


def test_sft_on_non_finite_audio_stops_naming_the_line_and_writes_no_nan_model(tiny_model, tiny_corpus, tmp_path,
                                                                                capsys):
    import json

    import numpy as np
    import soundfile as sf

    from asr_rl.cli import main

    rows = _rows(tiny_corpus)
    wav, sr = sf.read(rows[2]["audio"], dtype="float32")
    wav[len(wav) // 2] = np.nan
    sf.write(str(tmp_path / "nan.wav"), wav, sr, subtype="FLOAT")
    rows[2]["audio"] = str(tmp_path / "nan.wav")
    manifest = tmp_path / "nan.jsonl"
    manifest.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "run"
    over = _overrides(tiny_model, tiny_corpus, out, "max_steps=6", "data.shuffle=false")
    over = [o for o in over if not o.startswith("train_manifest=")] + [f"train_manifest={manifest}"]
    assert main(["train", "sft", *over]) == 2
    err = capsys.readouterr().err
    assert f"{manifest}:3: audio file {tmp_path / 'nan.wav'} has 1 non-finite samples" in err
    assert "Traceback" not in err and not (out / "final").exists()


def test_sft_stops_before_the_update_on_a_non_finite_loss(tiny_model, tiny_corpus, tmp_path, capsys):
    from asr_rl.cli import main

    out = tmp_path / "run"
    # a rate of 1e30 makes the weights enormous after one step: the next loss is not finite
    assert main(["train", "sft", *_overrides(tiny_model, tiny_corpus, out, "max_steps=6",
                                             "optim.learning_rate=1e30", "optim.lr_warmup_ratio=0")]) == 2
    err = capsys.readouterr().err
    assert "SFT loss is" in err and "stopping before the update, the last checkpoint is intact" in err
    assert "train.jsonl:" in err and "Traceback" not in err
    assert not (out / "final").exists()
    saved = sorted((out / "checkpoints").glob("step_*"))
    assert saved and all(torch.isfinite(p).all() for p in _params(saved[-1]).values())


def test_a_context_list_longer_than_the_model_takes_is_refused_naming_its_line_before_loading(tiny_model,
                                                                                               tiny_corpus, tmp_path,
                                                                                               capsys):
    import json

    from asr_rl.cli import main

    rows = _rows(tiny_corpus)
    rows[4]["context"] = [rows[0]["text"].split()[0]] * 10_000
    manifest = tmp_path / "long.jsonl"
    manifest.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    common = [f"pretrain={tiny_model}", f"train_manifest={manifest}", "max_steps=1", "logging.progress_bar=false"]
    for command in ("sft", "grpo"):
        assert main(["train", command, *common, f"output_dir={tmp_path / command}"]) == 2
        err = capsys.readouterr().err
        assert f"train_manifest: {manifest}:5 (context): the context list of 10000 items is" in err
        assert "exceed the model's" in err and "allocate" not in err


def test_sft_runs_from_a_datasets_folder_with_a_mapped_text_column(tiny_model, tiny_corpus, tmp_path):
    """The training set as a `datasets` save_to_disk folder (audio as bytes, the transcript in
    `sentence`): `train_manifest=` takes the folder, `data.text_column=` maps the column."""
    datasets = pytest.importorskip("datasets")
    from asr_rl.data.manifest import read_manifest

    utts = read_manifest(tiny_corpus / "train.jsonl")
    ds = datasets.Dataset.from_dict({
        "id": [u.id for u in utts], "audio": [{"bytes": Path(u.audio).read_bytes(), "path": None} for u in utts],
        "sentence": [u.text for u in utts], "language": [u.language for u in utts]})
    ds.cast_column("audio", datasets.Audio()).save_to_disk(str(tmp_path / "hf"))
    train_sft(_cfg(tiny_model, tiny_corpus, tmp_path / "run", f"train_manifest={tmp_path / 'hf'}",
                   "data.text_column=sentence", "max_steps=1"))
    (row,) = read_metrics(tmp_path / "run")
    assert row["step"] == 1 and row["loss/ce"] > 0
