from __future__ import annotations

import json

import pytest
import torch

from asr_rl.cli import main
from asr_rl.evaluation.evaluate import resolve_device, run_eval
from tests.conftest import write_manifest, write_tone


def test_eval_writes_reports_and_counts_a_line_whose_audio_fails(tiny_model, tiny_corpus, tmp_path, capsys):
    rows = [json.loads(x) for x in (tiny_corpus / "test_clean.jsonl").read_text(encoding="utf-8").splitlines()]
    for r in rows:
        r["audio"] = str(tiny_corpus / r["audio"])
    broken = dict(rows[0], id="broken", audio=str(tmp_path / "missing.wav"))
    manifest = write_manifest(tmp_path / "set.jsonl", rows + [broken])
    out = tmp_path / "report"
    report = run_eval(tiny_model, {"clean": str(manifest)}, output=out, batch_size=2, max_new_tokens=8,
                      progress=False)
    m = report["clean"]
    assert m.utterances == len(rows) and m.failed == 1 and m.cer is not None and m.rtf > 0
    saved = json.loads((out / "report.json").read_text())
    assert saved["test_sets"]["clean"]["failed"] == 1
    assert "| clean |" in (out / "report.md").read_text()
    hyps = [json.loads(x) for x in (out / "clean.hyps.jsonl").read_text().splitlines()]
    assert [h["id"] for h in hyps][-1] == "broken" and "does not exist" in hyps[-1]["error"]
    assert "clean" in capsys.readouterr().out


def test_eval_cli_bad_inputs(tiny_model, tmp_path, capsys):
    (tmp_path / "t.jsonl").write_text("")
    assert main(["eval", "--model", str(tmp_path / "nomodel"), "--test-set", f"x={tmp_path}/t.jsonl"]) == 2
    assert "nomodel does not exist or has no config.json" in capsys.readouterr().err
    assert main(["eval", "--model", str(tiny_model), "--test-set", f"x={tmp_path}/missing.jsonl"]) == 2
    assert "x=" in capsys.readouterr().err
    (tmp_path / "empty.jsonl").write_text("")
    assert main(["eval", "--model", str(tiny_model), "--test-set", f"e={tmp_path}/empty.jsonl"]) == 2
    assert "is empty" in capsys.readouterr().err
    assert main(["eval", "--model", str(tiny_model), "--test-set", "noequals"]) == 2
    assert "NAME=PATH" in capsys.readouterr().err
    # every utterance failing is not a result: exit 1, naming the set
    lost = write_manifest(tmp_path / "lost.jsonl", [{"id": f"u{i}", "audio": f"gone{i}.wav", "text": "call anna",
                                                     "language": "en"} for i in range(2)])
    assert main(["eval", "--model", str(tiny_model), "--test-set", f"lost={lost}", "--quiet"]) == 1
    assert "every utterance of lost failed" in capsys.readouterr().err


def test_eval_counts_audio_longer_than_the_encoder_window_as_failed_not_cut(whisper_model, tmp_path, capsys):
    """Qwen2-Audio's Whisper encoder takes 30 s: a 31 s utterance is not cut and scored against
    its whole reference, it fails naming its id and duration; the others are scored."""
    write_tone(tmp_path / "short.wav", 1.0)
    write_tone(tmp_path / "long.wav", 31.0)
    manifest = write_manifest(tmp_path / "set.jsonl", [
        {"id": "short1", "audio": "short.wav", "text": "call anna", "language": "en"},
        {"id": "long1", "audio": "long.wav", "text": "call anna", "language": "en"}])
    out = tmp_path / "report"
    assert main(["eval", "--model", str(whisper_model), "--test-set", f"s={manifest}", "--output", str(out),
                 "--max-new-tokens", "4", "--quiet"]) == 0
    saved = json.loads((out / "report.json").read_text())["test_sets"]["s"]
    assert saved["utterances"] == 1 and saved["failed"] == 1
    hyps = {h["id"]: h for h in map(json.loads, (out / "s.hyps.jsonl").read_text().splitlines())}
    assert hyps["long1"]["error"] == ("utterance long1 lasts 31.0 s; qwen2_audio takes at most 30 s per utterance "
                                      "(its encoder's window): split it or leave it out")
    assert hyps["short1"]["error"] is None and hyps["long1"]["hypothesis"] == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cuda_asked_where_there_is_none():
    with pytest.raises(RuntimeError, match="no CUDA device is available"):
        resolve_device("cuda")
    assert resolve_device("auto") == "cpu"


def test_a_context_file_reaches_the_prompt_of_lines_without_their_own_and_b_wer_is_reported(whisper_model, tiny_corpus,
                                                                                             tmp_path, capsys):
    rows = [json.loads(x) for x in (tiny_corpus / "test_clean.jsonl").read_text(encoding="utf-8").splitlines()]
    for r in rows:
        r["audio"] = str(tiny_corpus / r["audio"])
    rows[0]["context"] = ["its own"]
    manifest = write_manifest(tmp_path / "set.jsonl", rows)
    (tmp_path / "words.txt").write_text("grace\nliving room\n")
    out = tmp_path / "report"
    assert main(["eval", "--model", str(whisper_model), "--test-set", f"clean={manifest}", "--context-file",
                 f"clean={tmp_path / 'words.txt'}", "--output", str(out), "--max-new-tokens", "6", "--quiet"]) == 0
    hyps = [json.loads(x) for x in (out / "clean.hyps.jsonl").read_text().splitlines()]
    assert hyps[0]["context"] == ["its own"] and all(h["context"] == ["grace", "living room"] for h in hyps[1:])
    saved = json.loads((out / "report.json").read_text())["test_sets"]["clean"]
    assert "b_wer" in saved and saved["u_wer"] is not None and "B-WER%" in capsys.readouterr().out
    # a context file for a set not given, or an empty one, is refused naming it
    assert main(["eval", "--model", str(whisper_model), "--test-set", f"clean={manifest}", "--context-file",
                 f"noisy={tmp_path / 'words.txt'}"]) == 2
    assert "--context-file 'noisy=" in capsys.readouterr().err
    (tmp_path / "none.txt").write_text("\n")
    assert main(["eval", "--model", str(whisper_model), "--test-set", f"clean={manifest}", "--context-file",
                 f"clean={tmp_path / 'none.txt'}"]) == 2
    assert "none.txt holds no words or phrases" in capsys.readouterr().err


def test_eval_refuses_context_lists_the_prompt_cannot_hold_and_beams_wider_than_the_vocabulary(tiny_model,
                                                                                                 tiny_corpus, tmp_path,
                                                                                                 capsys):
    rows = [json.loads(x) for x in (tiny_corpus / "test_clean.jsonl").read_text(encoding="utf-8").splitlines()][:2]
    for r in rows:
        r["audio"] = str(tiny_corpus / r["audio"])
    manifest = write_manifest(tmp_path / "set.jsonl", rows)
    train = [json.loads(x)["text"] for x in (tiny_corpus / "train.jsonl").read_text(encoding="utf-8").splitlines()]
    words = sorted({w for t in train for w in t.split() if w.isascii()})  # the tokenizer's own characters
    huge = tmp_path / "huge.txt"
    huge.write_text("\n".join(words[i % len(words)] for i in range(10_000)))
    assert main(["eval", "--model", str(tiny_model), "--test-set", f"clean={manifest}", "--context-file",
                 f"clean={huge}"]) == 2
    err = capsys.readouterr().err
    assert "--context-file: context file for clean: the context list of 10000 items is" in err
    assert "exceed the model's" in err and "can't allocate" not in err
    odd = tmp_path / "odd.txt"
    odd.write_text("grace\nΩmega\n", encoding="utf-8")
    assert main(["eval", "--model", str(tiny_model), "--test-set", f"clean={manifest}", "--context-file",
                 f"clean={odd}"]) == 2
    assert "cannot write: Ω" in capsys.readouterr().err
    long_line = write_manifest(tmp_path / "long.jsonl", [dict(rows[0], context=[words[0]] * 10_000), rows[1]])
    assert main(["eval", "--model", str(tiny_model), "--test-set", f"clean={long_line}"]) == 2
    assert f"{long_line}:1 (context): the context list of 10000 items" in capsys.readouterr().err
    assert main(["eval", "--model", str(tiny_model), "--test-set", f"clean={manifest}", "--num-beams",
                 "100000"]) == 2
    assert "--num-beams 100000 is wider than the model's vocabulary" in capsys.readouterr().err
