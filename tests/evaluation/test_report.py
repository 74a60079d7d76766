from __future__ import annotations

import json

import pytest

from asr_rl.cli import main
from asr_rl.evaluation.report import write_report


def _run(path, rows):
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _eval(path, sets):
    path.mkdir(parents=True)
    (path / "report.json").write_text(json.dumps({"model": "m", "test_sets": sets}))
    return path


def test_report_has_the_comparison_table_and_plots(tmp_path, capsys):
    grpo = _run(tmp_path / "grpo", [{"step": s, "reward/mean": 0.5 + s / 10, "reward/cer": 0.6, "kl/loss": 0.01 * s,
                                     "eval/cer": 0.2 - s / 100} for s in range(1, 4)])
    sft = _eval(tmp_path / "sft_eval", {"test_clean": {"cer": 0.20, "wer": 0.3, "keyword_recall": 0.5,
                                                       "language_accuracy": 0.9, "utterances": 10}})
    rl = _eval(tmp_path / "grpo_eval", {"test_clean": {"cer": 0.15, "wer": 0.25, "keyword_recall": 0.6,
                                                       "language_accuracy": 0.95, "utterances": 10}})
    assert main(["report", "--runs", str(grpo), str(sft), str(rl), "--output", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    assert "| test_clean | grpo_eval | 15.00 | 25.00 | 60.00 | 95.00 | 10 |" in md
    assert "| test_clean | sft_eval | 20.00 | 30.00 | 50.00 | 90.00 | 10 |" in md
    for png in ("training_curves.png", "cer_by_set.png"):
        data = (tmp_path / "r" / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert "<table" in (tmp_path / "r" / "report.html").read_text()


def test_report_rejects_a_folder_that_is_neither(tmp_path):
    (tmp_path / "x").mkdir()
    with pytest.raises(FileNotFoundError, match="neither metrics.jsonl"):
        write_report([tmp_path / "x"], tmp_path / "out")


def test_an_rl_run_from_the_sfts_best_is_drawn_from_that_minute_and_the_plateau_is_named(tmp_path):
    import yaml

    from asr_rl.evaluation.report import start_minutes

    # SFT: best dev at step 20 (minute 2.0), then two evaluations without an improvement until minute 5.0
    sft = _run(tmp_path / "sft", [{"step": 10, "eval/cer": 0.3, "eval/best_cer": 0.3, "time/elapsed_min": 1.0},
                                  {"step": 20, "eval/cer": 0.2, "eval/best_cer": 0.2, "time/elapsed_min": 2.0},
                                  {"step": 30, "eval/cer": 0.21, "eval/best_cer": 0.2, "time/elapsed_min": 3.5},
                                  {"step": 40, "eval/cer": 0.2, "eval/best_cer": 0.2, "time/elapsed_min": 5.0}])
    (sft / "best").mkdir()
    (sft / "best" / "best.json").write_text(json.dumps({"metric": "eval/cer", "step": 20, "value": 0.2}))
    grpo = _run(tmp_path / "grpo", [{"step": 1, "eval/cer": 0.18, "time/elapsed_min": 0.5}])
    (grpo / "config.yaml").write_text(yaml.safe_dump({"pretrain": str(sft / "best")}))
    runs = {"sft": [json.loads(x) for x in (sft / "metrics.jsonl").read_text().splitlines()], "grpo": []}
    assert start_minutes({"sft": sft, "grpo": grpo}, runs) == {"sft": 0.0, "grpo": 2.0}
    (grpo / "config.yaml").write_text(yaml.safe_dump({"pretrain": str(sft / "final")}))
    assert start_minutes({"sft": sft, "grpo": grpo}, runs)["grpo"] == 5.0
    write_report([sft, grpo], tmp_path / "r")
    md = (tmp_path / "r" / "report.md").read_text()
    assert ("best dev CER 20.00% at step 20, then 2 evaluations (20 steps, 3.0 minutes) without an improvement"
            in md)


def test_an_rl_runs_step_time_is_split_by_phase_and_drawn(tmp_path):
    from asr_rl.evaluation.report import step_phases

    # the first step (warm-up) is left out; medians of steps 2-4 by hand: rollout 3.0 - reward 1.0,
    # reward 1.0, logprobs 0.5, advantages 0.01, train 2.0, sync 0.1, other 7.0 - 5.61 = 1.39
    rows = [{"step": 1, "time/step": 60.0, "time/rollout": 50.0, "time/reward": 1.0}]
    rows += [{"step": s, "time/step": 7.0, "time/rollout": 3.0, "time/reward": 1.0, "time/logprobs": 0.5,
              "time/advantages": 0.01, "time/train": 2.0, "time/sync": 0.1} for s in (2, 3, 4)]
    phases = step_phases(rows)
    assert phases == pytest.approx({"rollout": 2.0, "reward": 1.0, "logprobs": 0.5, "advantages": 0.01,
                                    "train": 2.0, "sync": 0.1, "other": 1.39})
    assert step_phases([{"step": 1, "loss/total": 1.0}]) is None  # SFT: no phases
    write_report([_run(tmp_path / "grpo", rows)], tmp_path / "r")
    assert "Seconds per step (median): rollout 2.00, reward 1.00" in (tmp_path / "r" / "report.md").read_text()
    assert (tmp_path / "r" / "step_time.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_training_plot_smooths_the_reward_and_leaves_out_a_kl_panel_with_nothing_in_it(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from asr_rl.evaluation.report import plot_training, smoothed

    assert smoothed([1.0, 3.0, 2.0, 6.0, 1.0], 3) == [1.0, 2.0, 2.0, pytest.approx(11 / 3), 3.0]
    drawn = {}
    save = plt.Figure.savefig
    monkeypatch.setattr(plt.Figure, "savefig", lambda fig, *a, **k: drawn.update(
        axes={ax.get_title(): [ln.get_label() for ln in ax.lines] for ax in fig.axes}) or save(fig, *a, **k))
    rows = [{"step": s, "reward/mean": (s % 2) * 1.0, "kl/loss": 0.0, "eval/cer": 0.2, "time/elapsed_min": s / 10}
            for s in range(1, 61)]
    assert plot_training({"grpo": rows}, tmp_path) == tmp_path / "training_curves.png"
    # no KL panel (a KL of 0 throughout: no reference model); the reward's per-step line and its mean
    assert drawn["axes"] == {"reward": ["_child0", "grpo: reward/mean (mean)"],
                             "dev CER (each run's eval_manifest)": ["grpo: eval/cer"]}
    rows[-1]["kl/loss"] = 0.01
    plot_training({"grpo": rows}, tmp_path)
    assert drawn["axes"]["KL to the reference"] == ["grpo: kl/loss"]


def test_each_dev_curve_names_the_set_its_run_evaluated(tmp_path, monkeypatch):
    # the demo: SFT on the home dev set, RL on the target's: two sets, and the legend says which
    import matplotlib.pyplot as plt

    from asr_rl.evaluation.report import dev_set_names, plot_training

    drawn = {}
    save = plt.Figure.savefig
    monkeypatch.setattr(plt.Figure, "savefig", lambda fig, *a, **k: drawn.update(
        axes={ax.get_title(): [ln.get_label() for ln in ax.lines] for ax in fig.axes}) or save(fig, *a, **k))
    dirs = {}
    for name, manifest in (("sft", "/d/corpus/dev.jsonl"), ("grpo", "/d/corpus_target/dev.jsonl"), ("other", None)):
        dirs[name] = tmp_path / name
        dirs[name].mkdir()
        (dirs[name] / "config.yaml").write_text(f"eval_manifest: {manifest}\n" if manifest else "seed: 1\n")
    assert dev_set_names(dirs) == {"sft": "corpus/dev.jsonl", "grpo": "corpus_target/dev.jsonl"}
    rows = [{"step": s, "eval/cer": 0.2, "time/elapsed_min": s / 10} for s in (1, 2)]
    plot_training({"sft": rows, "grpo": rows}, tmp_path, dev_sets=dev_set_names(dirs))
    assert drawn["axes"]["dev CER (each run's eval_manifest)"] == [
        "sft: eval/cer on corpus/dev.jsonl", "grpo: eval/cer on corpus_target/dev.jsonl"]


def test_a_set_without_cer_gets_its_own_panel_never_a_cer_of_zero(tmp_path):
    from asr_rl.evaluation.report import bar_panels, plot_cer_bars

    evals = {"sft": {"test_clean": {"cer": 0.05}, "nonspeech": {"cer": None, "nonspeech_hallucination_rate": 0.9}},
             "grpo": {"test_clean": {"cer": 0.04}, "nonspeech": {"cer": None, "nonspeech_hallucination_rate": 0.6}}}
    assert bar_panels(evals) == [(["test_clean"], "cer", "CER %"),
                                 (["nonspeech"], "nonspeech_hallucination_rate", "non-speech clips with words %")]
    assert bar_panels({"sft": {"nonspeech": {"cer": None}}}) == []  # nothing to draw: no plot
    assert plot_cer_bars({"sft": {"nonspeech": {"cer": None}}}, tmp_path) is None
    assert plot_cer_bars(evals, tmp_path).is_file()
