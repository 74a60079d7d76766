"""DPO and KTO: pair files (bad lines named), N-best pair building, and training that moves the
chosen-vs-rejected log-prob margin on tiny audio and text models."""
import json
import sys
from pathlib import Path

import pytest
import torch

from asr_rl.config import load_config
from asr_rl.data.manifest import ManifestError, read_manifest
from asr_rl.data.pairs import read_pairs, read_unpaired
from asr_rl.trainer.configs.preference import DPOConfig
from asr_rl.trainer.recipes.dpo import batch_indices, load_examples, reference_logps, train_dpo
from asr_rl.trainer.recipes.pairs import select_pairs
from asr_rl.trainer.run.metrics import read_metrics

pytestmark = pytest.mark.slow


def test_select_pairs_by_hand():
    hyps = [("a", 0.9), ("b", 0.1), ("a", 0.5), ("c", 0.4), ("", 1.0)]
    assert select_pairs(hyps, "best_worst", 0.0) == [("a", 0.9, "b", 0.1)]
    # ranked a 0.9, c 0.4, b 0.1; c-b differs by 0.3, under the margin
    assert select_pairs(hyps, "all", 0.35) == [("a", 0.9, "c", 0.4), ("a", 0.9, "b", 0.1)]
    assert select_pairs([("a", 0.5), ("a", 0.7)], "best_worst", 0.0) == []  # one distinct transcript
    assert select_pairs([("a", 0.5), ("b", 0.5)], "best_worst", 0.0) == []  # a tie


def _pair_file(tmp_path, corpus, rows):
    utts = read_manifest(corpus / "train.jsonl")
    lines = []
    for i, extra in enumerate(rows):
        u = utts[i % len(utts)]
        lines.append(json.dumps({"id": f"{u.id}-{i}", "audio": u.audio, "text": u.text, "language": u.language,
                                 **extra}, ensure_ascii=False))
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_bad_pair_lines_are_refused_each_named(tiny_corpus, tmp_path):
    path = _pair_file(tmp_path, tiny_corpus, [{"chosen": "a b", "rejected": "a c"}, {"chosen": "a b"},
                                              {"chosen": "same", "rejected": "same "}, {"chosen": "x", "rejected": 3}])
    with pytest.raises(ManifestError) as e:
        read_pairs(path, audio=True)
    msg = str(e.value)
    assert f"{path}:2: missing or empty `rejected`" in msg
    assert f"{path}:3: `chosen` and `rejected` are the same text" in msg
    assert f"{path}:4: `rejected` must be a string, got int 3" in msg and ":1:" not in msg
    kto = _pair_file(tmp_path, tiny_corpus, [{"completion": "a", "label": "yes"}, {"completion": "b", "label": True}])
    with pytest.raises(ManifestError, match=r":1: `label` must be true"):
        read_unpaired(kto, audio=True)
    text = tmp_path / "text.jsonl"
    text.write_text('{"prompt": "hi", "chosen": "a", "rejected": "b"}\n{"chosen": "a", "rejected": "b"}\nnot json\n')
    with pytest.raises(ManifestError) as e:
        read_pairs(text, audio=False)
    assert f"{text}:2: missing or empty `prompt`" in str(e.value) and f"{text}:3: malformed JSON" in str(e.value)


def test_kto_reads_pairs_as_one_good_and_one_bad_with_a_mismatched_completion(tiny_corpus, tmp_path):
    path = _pair_file(tmp_path, tiny_corpus, [{"chosen": f"good {i}", "rejected": f"bad {i}"} for i in range(3)])
    ex = load_examples(load_config(DPOConfig, None, [f"train_manifest={path}", "loss_type=kto"]), audio=True)
    assert len(ex) == 6 and ex.desirable.count(True) == 3
    for source, (completion, mismatched) in zip(ex.sources, ex.texts):
        # the mismatched completion answers another utterance
        assert mismatched.split()[-1] != completion.split()[-1]


def test_batches_cover_each_epoch_once_and_resume_where_they_left_off():
    steps = [batch_indices(10, 4, s, seed=3) for s in range(5)]
    flat = [i for s in steps for i in s]
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:20]) == list(range(10))
    assert batch_indices(10, 4, 3, seed=3) == steps[3]


def _margin(policy, ex):
    ref = reference_logps(policy, ex, micro=8)
    return float((ref[:, 0] - ref[:, 1]).mean())


def _reference_pairs(tmp_path, corpus):
    """chosen = the reference transcript, rejected = the same with its characters rotated by one (a
    hypothesis with errors, as in an N-best list)."""
    utts = read_manifest(corpus / "train.jsonl")
    rows = [{"chosen": u.text, "rejected": u.text[1:] + u.text[0]} for u in utts]
    return _pair_file(tmp_path, corpus, rows)


# KTO is unpaired: a batch with more undesirable than desirable examples of near-identical texts
# pushes both down (the paper keeps the two balanced); its batch is the whole set, 8 of each
@pytest.mark.parametrize("loss_type,batch", [("sigmoid", 8), ("ipo", 8), ("kto", 16)])
def test_audio_preference_training_grows_the_chosen_margin(tiny_model, tiny_corpus, tmp_path, loss_type, batch):
    from asr_rl.models.audio_policy import AudioPolicy

    pairs = _reference_pairs(tmp_path, tiny_corpus)
    cfg = load_config(DPOConfig, None, [
        f"pretrain={tiny_model}", f"train_manifest={pairs}", f"output_dir={tmp_path / 'run'}", f"loss_type={loss_type}",
        "max_steps=6", "save_steps=3", "eval_steps=0", "optim.learning_rate=0.005", "optim.lr_warmup_ratio=0",
        "beta=0.5",
        f"train_batch_size={batch}", "micro_train_batch_size=8", "logging.tensorboard=false", "logging.progress_bar=false"])
    ex = load_examples(load_config(DPOConfig, None, [f"train_manifest={pairs}"]), audio=True)
    before = _margin(AudioPolicy.from_pretrained(tiny_model), ex)
    final = train_dpo(cfg)
    after = _margin(AudioPolicy.from_pretrained(final), ex)
    if loss_type == "ipo":  # IPO regresses the margin gain over the reference to 1 / (2 beta) = 1, no further
        assert 0.8 < after - before < 1.2, (before, after)
    else:
        assert after > before + 1.0, (before, after)
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 7))
    key = "kto/loss" if loss_type == "kto" else "dpo/loss"
    assert metrics[-1][key] < metrics[0][key]


def test_a_resumed_run_ends_where_the_uninterrupted_one_does(tiny_model, tiny_corpus, tmp_path):
    import subprocess

    pairs = _reference_pairs(tmp_path, tiny_corpus)
    common = [f"pretrain={tiny_model}", f"train_manifest={pairs}", "max_steps=4", "save_steps=2", "eval_steps=0",
              "optim.learning_rate=0.005", "train_batch_size=4", "micro_train_batch_size=2",
              "logging.tensorboard=false", "logging.progress_bar=false"]
    whole = train_dpo(load_config(DPOConfig, None, common + [f"output_dir={tmp_path / 'whole'}"]))
    cut = tmp_path / "cut"
    fault = Path(__file__).resolve().parents[2] / "fault.py"  # SIGKILL after step 3 is logged (after step 2's save)
    res = subprocess.run([sys.executable, str(fault), "after-step", "3", "--", "train", "dpo", *common,
                          f"output_dir={cut}"], capture_output=True, text=True, timeout=600)
    assert res.returncode == -9, res.stderr[-2000:]
    resumed = train_dpo(load_config(DPOConfig, None, common + [f"output_dir={cut}", "resume=auto"]))
    from safetensors.torch import load_file

    # bit for bit: the resumed run encodes its audio in the batches the uninterrupted one did
    a, b = load_file(Path(whole) / "model.safetensors"), load_file(Path(resumed) / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    whole_rows, cut_rows = (read_metrics(tmp_path / "whole"), read_metrics(cut))
    assert [m["step"] for m in cut_rows] == [1, 2, 3, 4]
    assert [m["dpo/loss"] for m in cut_rows] == [m["dpo/loss"] for m in whole_rows]


def test_text_dpo_on_prompt_chosen_rejected_lines(tiny_text_model, text_data, tmp_path):
    from asr_rl.models.text_policy import TextPolicy

    cfg = load_config(DPOConfig, None, [
        f"pretrain={tiny_text_model}", f"prompt_data={text_data['prefs']}", f"output_dir={tmp_path / 'run'}",
        "max_steps=5", "save_steps=0", "optim.learning_rate=0.005", "beta=0.5", "train_batch_size=8",
        "micro_train_batch_size=8", "logging.tensorboard=false", "logging.progress_bar=false"])
    ex = load_examples(cfg, audio=False)
    before = _margin(TextPolicy.from_pretrained(tiny_text_model), ex)
    after = _margin(TextPolicy.from_pretrained(train_dpo(cfg)), ex)
    assert after > before + 1.0, (before, after)


def test_the_cli_builds_pairs_from_n_best_and_trains_on_them(tiny_model, tiny_corpus, tmp_path):
    import subprocess

    cli = str(Path(sys.executable).parent / "asr-rl")
    pairs = tmp_path / "nbest.jsonl"
    res = subprocess.run([cli, "data", "pairs", "--model", str(tiny_model), "--manifest",
                          str(tiny_corpus / "train.jsonl"), "--out", str(pairs), "--n", "4", "--temperature", "1.5",
                          "--max-new-tokens", "8"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"-> {pairs}" in res.stdout
    lines = [json.loads(x) for x in pairs.read_text(encoding="utf-8").splitlines()]
    assert lines and all(p["chosen_score"] > p["rejected_score"] and p["chosen"] != p["rejected"] for p in lines)
    assert len(read_pairs(pairs, audio=True)) == len(lines)
    res = subprocess.run([cli, "train", "dpo", f"pretrain={tiny_model}", f"train_manifest={pairs}",
                          f"output_dir={tmp_path / 'dpo'}", "max_steps=2", "train_batch_size=2",
                          "micro_train_batch_size=2", "logging.progress_bar=false", "logging.tensorboard=false"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "dpo" / "final" / "model.safetensors").is_file()


def test_a_bad_pair_file_is_refused_before_the_model_loads(tiny_model, tiny_corpus, tmp_path, capsys):
    """The model folder's weights are unreadable: had it loaded first, that error would come first."""
    import shutil

    from asr_rl.cli import main

    broken = tmp_path / "model"
    shutil.copytree(tiny_model, broken)
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(b"not weights")
    pairs = _pair_file(tmp_path, tiny_corpus, [{"chosen": "a b", "rejected": 123}])
    for command in ("dpo", "kto"):
        code = main(["train", command, f"pretrain={broken}", f"train_manifest={pairs}",
                     f"output_dir={tmp_path / command}"])
        err = capsys.readouterr().err
        assert code == 2 and f"{pairs}:1:" in err and "safetensors" not in err, err
        assert not (tmp_path / command).exists()  # nothing written either
