"""`asr-rl data pseudo-label`: greedy labels are eval's transcripts, best-of-N keeps the reward's
argmax, a killed run resumes to the same file, bad lines are named, the output trains SFT."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from asr_rl.cli import main
from asr_rl.data.manifest import read_manifest, scan_manifest
from asr_rl.trainer.recipes.pseudo_label import choose, dropped_path, resume_ids
from tests.conftest import write_manifest, write_tone
from tests.trainer.recipes.test_sft import _overrides

REWARD = "builtin:cer,fluency=0.2"


# ---------------------------------------------------------------------------------- pure parts
def test_choose_keeps_the_highest_reward_the_first_on_ties_and_no_empty_hypothesis():
    assert choose(["a", "b", "c"], [0.1, 0.5, 0.5], non_speech=False) == 1  # tie 0.5: the first
    assert choose(["", "x"], [1.0, 0.2], non_speech=False) == 1  # empty: never a label of speech
    assert choose(["", "x"], [1.0, 0.2], non_speech=True) == 0  # a non-speech line may stay empty
    assert choose([" ", ""], [0.3, 0.4], non_speech=False) is None


def test_an_empty_label_wins_only_by_scoring_strictly_highest():
    # a reward that cannot tell silence from words (every sample 0) keeps the words, not the empty one
    assert choose(["", "call anna", "call ana"], [0.0, 0.0, 0.0], non_speech=True) == 1
    assert choose(["", "call anna"], [0.5, 0.0], non_speech=True) == 0  # it scored highest: nobody spoke
    assert choose(["", " "], [0.0, 0.0], non_speech=True) == 0  # nothing but empties: the first


def test_a_last_line_without_newline_is_touched_only_when_this_command_wrote_it(tmp_path):
    human = tmp_path / "human.jsonl"
    human.write_bytes(b'{"id": "t1", "audio": "a.wav", "text": "call anna", "language": "en"}')  # no newline
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"remember to relabel the kitchen set")
    for path in (human, notes):
        before = path.read_bytes()
        with pytest.raises(ValueError, match=rf"{path.name}:1 has no newline and is not a line this command wrote"):
            resume_ids(path, "greedy")
        assert path.read_bytes() == before
    own = json.dumps({"id": "a", "text": "x", "pseudo_label": {"method": "greedy"}})
    # through the command: refused before any model loads, the file byte for byte as it was
    write_tone(tmp_path / "a.wav")
    pool = write_manifest(tmp_path / "pool.jsonl", [{"id": "p", "audio": "a.wav", "language": "en"}])
    before = human.read_bytes()
    assert main(["data", "pseudo-label", str(tmp_path / "no-model"), str(pool), "--out", str(human)]) == 2
    assert human.read_bytes() == before
    ours = tmp_path / "ours.jsonl"
    ours.write_text(own)  # a whole line of ours, its newline not yet written: kept, and finished
    assert resume_ids(ours, "greedy") == {"a"} and ours.read_text() == own + "\n"
    ours.write_text(own + "\n" + '{"id": "b", "text": "written by hand"}')  # a whole foreign line after ours
    with pytest.raises(ValueError, match=r"ours\.jsonl:2 has no newline and is not a line this command wrote"):
        resume_ids(ours, "greedy")
    assert ours.read_text().endswith("written by hand\"}")


def test_a_second_run_on_the_same_out_is_refused_naming_the_first(tmp_path, capsys):
    import subprocess
    import sys

    write_tone(tmp_path / "a.wav")
    pool = write_manifest(tmp_path / "pool.jsonl", [{"id": "a", "audio": "a.wav", "language": "en"}])
    out = tmp_path / "labels.jsonl"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from asr_rl.trainer.run.folder import RunLock; "
                               f"RunLock(Path({str(tmp_path)!r}), Path({str(tmp_path / '.labels.jsonl.lock')!r}), "
                               "what='--out x'); print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(["data", "pseudo-label", str(tmp_path / "no-model"), str(pool), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"--out {out} is in use by another run (pid {holder.pid})" in err and "choose another --out" in err
        assert not out.exists()
    finally:
        holder.kill()
        holder.wait()


def test_resume_ids_rewrites_a_half_written_last_line_and_refuses_a_foreign_file(tmp_path):
    out = tmp_path / "o.jsonl"
    line = json.dumps({"id": "a", "text": "x", "pseudo_label": {"method": "greedy"}})
    out.write_text(line + "\n" + line[:17])
    assert resume_ids(out, "greedy") == {"a"}
    assert out.read_text() == line + "\n"
    with pytest.raises(ValueError, match="labelled by greedy, this run by best_of_n"):
        resume_ids(out, "best_of_n")
    out.write_text("not json\n" + line + "\n")
    with pytest.raises(ValueError, match=r"o\.jsonl:1: not a line this command writes"):
        resume_ids(out, "greedy")
    assert resume_ids(tmp_path / "none.jsonl", "greedy") == set()
    assert dropped_path(out) == tmp_path / "o.dropped.jsonl"


def test_a_reward_that_cannot_score_unlabelled_lines_is_refused_before_any_model_loads(tmp_path, capsys):
    write_tone(tmp_path / "a.wav")
    manifest = write_manifest(tmp_path / "m.jsonl", [{"id": "a", "audio": "a.wav", "text": "hi", "language": "en"},
                                                     {"id": "b", "audio": "a.wav", "language": "en"}])
    args = ["data", "pseudo-label", str(tmp_path / "no-model"), str(manifest), "--out", str(tmp_path / "o.jsonl")]
    assert main(args + ["--best-of", "4", "--reward", "builtin:cer"]) == 2
    err = capsys.readouterr().err
    assert "reward term 'cer' needs the transcript" in err and f"{manifest}:2 has none" in err
    assert main(args + ["--best-of", "4"]) == 2 and "needs both --best-of N" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()


# ---------------------------------------------------------------------------------- with a model
@pytest.fixture(scope="module")
def labeller(tiny_model, tiny_corpus, tmp_path_factory) -> Path:
    """The tiny model after 40 SFT steps: its greedy transcripts are neither empty nor all alike."""
    from asr_rl.config import load_config
    from asr_rl.trainer.configs.rl import SFTConfig
    from asr_rl.trainer.recipes.sft import train_sft

    out = tmp_path_factory.mktemp("labeller")
    return train_sft(load_config(SFTConfig, None, _overrides(tiny_model, tiny_corpus, out, "max_steps=40",
                                                             "save_steps=0", "train_batch_size=8",
                                                             "micro_train_batch_size=8", "learning_rate=5e-3")))


@pytest.fixture
def mixed(tiny_corpus, tmp_path) -> Path:
    """The corpus's training lines, every second one without `text`, audio absolute."""
    rows = [json.loads(x) for x in (tiny_corpus / "train.jsonl").read_text(encoding="utf-8").splitlines()]
    for i, r in enumerate(rows):
        r["audio"] = str(tiny_corpus / r["audio"])
        if i % 2:
            del r["text"]
    return write_manifest(tmp_path / "in" / "mixed.jsonl", rows)


def _label(model, manifest, out, *extra) -> int:
    return main(["data", "pseudo-label", str(model), str(manifest), "--out", str(out), "--max-new-tokens", "24",
                 "--quiet", *extra])


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.slow
def test_greedy_labels_are_evals_transcripts_and_the_output_trains_sft(labeller, mixed, tiny_corpus, tmp_path):
    out = tmp_path / "out" / "labels.jsonl"
    # one utterance a batch on both sides: eval batches by length, and a padded batch may round a
    # near-tie of two tokens the other way (equal labels are the claim, not equal padding)
    assert _label(labeller, mixed, out, "--batch-size", "1") == 0
    labelled = tmp_path / "labelled.jsonl"  # eval refuses lines without text: the same audio, with text
    write_manifest(labelled, [{**r, "text": r.get("text", "x")} for r in _rows(mixed)])
    assert main(["eval", "--model", str(labeller), "--test-set", f"s={labelled}", "--output", str(tmp_path / "ev"),
                 "--batch-size", "1", "--max-new-tokens", "24", "--quiet"]) == 0
    greedy = {h["id"]: h["hypothesis"] for h in _rows(tmp_path / "ev" / "s.hyps.jsonl")}
    rows, source = _rows(out), {r["id"]: r for r in _rows(mixed)}
    assert len(rows) == len(source) and all(greedy[r["id"]] for r in rows)  # nothing empty, nothing dropped
    for r in rows:
        assert r["text"] == greedy[r["id"]]
        assert r["pseudo_label"]["method"] == "greedy" and r["pseudo_label"]["confidence"] < 0
        assert r.get("reference_text") == source[r["id"]].get("text")  # only where the line had one
        assert r["keywords"] == source[r["id"]]["keywords"] and Path(r["audio"]).is_file()
    assert scan_manifest(out, text_needed_by="SFT").problems == []
    from asr_rl.config import load_config
    from asr_rl.trainer.configs.rl import SFTConfig
    from asr_rl.trainer.recipes.sft import train_sft

    cfg = load_config(SFTConfig, None, _overrides(labeller, tiny_corpus, tmp_path / "sft", "max_steps=1",
                                                  "save_steps=0", f"train_manifest={out}"))
    assert (train_sft(cfg) / "config.json").is_file()


@pytest.mark.slow
def test_min_confidence_drops_exactly_the_lines_below_it(labeller, mixed, tmp_path):
    assert _label(labeller, mixed, tmp_path / "all.jsonl") == 0
    conf = {r["id"]: r["pseudo_label"]["confidence"] for r in _rows(tmp_path / "all.jsonl")}
    threshold = sorted(conf.values())[len(conf) // 2]  # the median line itself is kept (not below)
    out = tmp_path / "kept.jsonl"
    assert _label(labeller, mixed, out, "--min-confidence", str(threshold)) == 0
    assert {r["id"] for r in _rows(out)} == {i for i, c in conf.items() if c >= threshold}
    dropped = _rows(dropped_path(out))
    assert {d["id"] for d in dropped} == {i for i, c in conf.items() if c < threshold} != set()
    assert all(f"below --min-confidence {threshold:g}" in d["reason"] for d in dropped)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sample", "beam"])
def test_best_of_n_keeps_the_hypothesis_the_reward_scores_best(labeller, mixed, tmp_path, monkeypatch, mode):
    from asr_rl.rewards.pipeline import load_reward_spec
    from asr_rl.trainer.rollout import experience

    seen = []
    make_samples = experience.make_samples
    monkeypatch.setattr(experience, "make_samples", lambda *a: seen.extend(make_samples(*a)) or make_samples(*a))
    out = tmp_path / "best.jsonl"
    assert _label(labeller, mixed, out, "--best-of", "4", "--reward", REWARD, "--temperature", "1.5", "--mode", mode) == 0
    rewards = load_reward_spec(REWARD)(seen).rewards  # scored again, apart from the command
    rows = {r["id"]: r for r in _rows(out)}
    assert len(seen) == 4 * len(rows)
    for g in range(len(rows)):
        group = seen[4 * g:4 * g + 4]
        # an empty hypothesis is a label only of an unlabelled line (where the reward may hear silence)
        best = max((j for j in range(4) if group[j].hypothesis.strip() or group[j].reference is None),
                   key=lambda j: (rewards[4 * g + j], -j))
        row = rows[group[0].prompt]
        assert row["text"] == group[best].hypothesis and row["pseudo_label"]["method"] == "best_of_n"
        assert row["pseudo_label"]["reward"] == pytest.approx(rewards[4 * g + best])
    assert len({s.hypothesis for s in seen}) > len(rows)  # the groups are not all one hypothesis
    assert read_manifest(out, text_needed_by="SFT")


@pytest.mark.slow
def test_a_killed_run_resumes_to_the_file_an_uninterrupted_run_writes(labeller, mixed, tmp_path):
    args = ("--best-of", "3", "--reward", REWARD, "--batch-size", "3")
    straight = tmp_path / "straight.jsonl"
    assert _label(labeller, mixed, straight, *args) == 0
    lines = straight.read_text(encoding="utf-8").splitlines(keepends=True)
    killed = tmp_path / "killed.jsonl"  # 4 lines (mid-batch), then the 5th cut short
    killed.write_text("".join(lines[:4]) + lines[4][:30], encoding="utf-8")
    assert _label(labeller, mixed, killed, *args) == 0
    assert killed.read_bytes() == straight.read_bytes()


@pytest.mark.slow
def test_bad_lines_are_named_and_the_rest_is_labelled(labeller, mixed, tmp_path, capsys):
    rows = _rows(mixed)
    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"RIFF0000WAVE not audio")
    manifest = write_manifest(tmp_path / "bad.jsonl", [rows[0], '{"id": "cut", "audio": ', dict(rows[1], id="gone",
                              audio=str(tmp_path / "gone.wav")), dict(rows[2], id="junk", audio=str(broken)),
                              *rows[3:]])
    out = tmp_path / "o.jsonl"
    assert _label(labeller, manifest, out) == 1
    printed = capsys.readouterr().out
    assert "bad lines:  3" in printed
    assert f"  {manifest}:2: malformed JSON" in printed
    assert f"  {manifest}:3: " in printed and "gone.wav" in printed and f"  {manifest}:4: " in printed
    assert [r["id"] for r in _rows(out)] == [rows[0]["id"], *(r["id"] for r in rows[3:])]


# ---------------------------------------------------------------------------------- eval --rerank
@pytest.mark.slow
def test_eval_rerank_answers_what_best_of_n_labels_and_never_shows_the_reward_the_transcript(labeller, tiny_corpus,
                                                                                            tmp_path, capsys):
    rows = [dict(r, audio=str(tiny_corpus / r["audio"])) for r in _rows(tiny_corpus / "train.jsonl")]
    test = write_manifest(tmp_path / "test.jsonl", rows)
    pool = write_manifest(tmp_path / "pool.jsonl", [{k: v for k, v in r.items() if k != "text"} for r in rows])
    reward = "builtin:fluency,repetition=0.5"
    assert _label(labeller, pool, tmp_path / "best.jsonl", "--best-of", "4", "--reward", reward, "--batch-size", "1",
                  "--seed", "3") == 0
    assert main(["eval", "--model", str(labeller), "--test-set", f"t={test}", "--rerank", "4", "--reward", reward,
                 "--seed", "3", "--batch-size", "1", "--max-new-tokens", "24", "--output", str(tmp_path / "ev"),
                 "--quiet"]) == 0
    reranked = {h["id"]: h["hypothesis"] for h in _rows(tmp_path / "ev" / "t.hyps.jsonl")}
    best = {r["id"]: r["text"] for r in _rows(tmp_path / "best.jsonl")}
    assert reranked == {i: best.get(i, "") for i in reranked} and len(reranked) == len(rows)
    greedy = tmp_path / "greedy"
    assert main(["eval", "--model", str(labeller), "--test-set", f"t={test}", "--batch-size", "1",
                 "--max-new-tokens", "24", "--output", str(greedy), "--quiet"]) == 0
    assert {h["id"]: h["hypothesis"] for h in _rows(greedy / "t.hyps.jsonl")} != reranked  # it is not greedy
    capsys.readouterr()
    # a reward that reads the transcript has nothing to read: every line is unlabelled to it
    reads_labels = Path(__file__).resolve().parents[3] / "recipes/rewards/openrlhf_style.py"
    assert main(["eval", "--model", str(labeller), "--test-set", f"t={test}", "--rerank", "4", "--reward",
                 str(reads_labels), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"--reward {reads_labels}: reward 'openrlhf_style.py" in err and "reranking passes the reward no reference" in err
    assert main(["eval", "--model", str(labeller), "--test-set", f"t={test}", "--rerank", "4", "--quiet"]) == 2
    assert "--rerank N and --reward SPEC go together" in capsys.readouterr().err


def test_a_reward_that_needs_the_transcript_cannot_rerank_and_is_refused_before_any_model_loads(tmp_path, capsys):
    write_tone(tmp_path / "a.wav")
    test = write_manifest(tmp_path / "t.jsonl", [{"id": "a", "audio": "a.wav", "text": "hi", "language": "en"}])
    for reward in ("builtin:cer", "builtin:fluency,keyword"):
        assert main(["eval", "--model", str(tmp_path / "no-model"), "--test-set", f"t={test}", "--rerank", "4",
                     "--reward", reward, "--quiet"]) == 2
        err = capsys.readouterr().err
        assert f"--reward {reward}: reranking passes the reward no reference" in err and "needs it" in err
        assert "no-model" not in err  # refused before the model folder was looked at


def test_a_file_another_run_or_a_person_wrote_is_refused_and_left_as_it_was(tmp_path, capsys):
    write_tone(tmp_path / "a.wav")
    pool = write_manifest(tmp_path / "pool.jsonl", [{"id": "a", "audio": "a.wav", "language": "en"}])
    human = write_manifest(tmp_path / "test.jsonl", [{"id": "t1", "audio": "a.wav", "text": "call anna",
                                                      "language": "en"}])
    before = human.read_bytes()
    assert main(["data", "pseudo-label", str(tmp_path / "no-model"), str(pool), "--out", str(human)]) == 2
    err = capsys.readouterr().err
    assert f"{human}:1 has no `pseudo_label`" in err and "give another --out" in err
    assert human.read_bytes() == before
    # a file this command wrote, for another model or pool
    origin = {"model": "/m1", "pool": str(pool.resolve())}
    out = tmp_path / "labels.jsonl"
    out.write_text(json.dumps({"id": "a", "text": "x", "pseudo_label": {"method": "greedy", **origin}}) + "\n")
    assert resume_ids(out, "greedy", origin) == {"a"}
    with pytest.raises(ValueError, match=r"labels\.jsonl:1 was labelled with model /m1, this run's model is /m2"):
        resume_ids(out, "greedy", {**origin, "model": "/m2"})
