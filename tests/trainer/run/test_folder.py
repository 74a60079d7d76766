"""A run folder holds one run: paths checked first, a lock against a second run, resume only by the
same run, overwrite only when asked, and the folder's config.yaml never rewritten by a refused run."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from asr_rl.config import ConfigError, load_config
from asr_rl.trainer.run.checkpoint import list_checkpoints, save_checkpoint
from asr_rl.trainer.run.setup import setup_run
from asr_rl.trainer.configs.rl import RLConfig, SFTConfig


def _cfg(cls, tmp_path, *extra):
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "train.jsonl").touch()
    return load_config(cls, None, [f"pretrain={tmp_path / 'model'}", f"train_manifest={tmp_path / 'train.jsonl'}",
                                   f"output_dir={tmp_path / 'run'}", *extra])


def _with_checkpoint(cfg) -> None:
    with setup_run(cfg) as ctx:
        ctx.start()
        save_checkpoint(ctx.output_dir, 1, lambda folder: (folder / "model.safetensors").write_bytes(b"w"), {"step": 1})


def test_a_different_run_is_refused_and_the_folder_keeps_its_config(tmp_path):
    _with_checkpoint(_cfg(SFTConfig, tmp_path, "optim.learning_rate=0.002"))
    saved = (tmp_path / "run" / "config.yaml").read_text()
    with pytest.raises(ConfigError, match=r"holds the checkpoints of a different run "
                                          r"\(optim\.learning_rate: 0\.002 -> 0\.01\).*resume=none overwrite_output_dir=true"):
        setup_run(_cfg(SFTConfig, tmp_path, "optim.learning_rate=0.01"))
    assert (tmp_path / "run" / "config.yaml").read_text() == saved
    # settings that do not define the run may change on resume
    with setup_run(_cfg(SFTConfig, tmp_path, "optim.learning_rate=0.002", "max_steps=500", "save_steps=7")) as ctx:
        assert ctx.resume_from == list_checkpoints(tmp_path / "run")[-1]


def test_overwrite_with_resume_auto_is_refused_as_the_contradiction_it_is(tmp_path):
    _with_checkpoint(_cfg(SFTConfig, tmp_path))
    with pytest.raises(ConfigError, match=r"overwrite_output_dir=true \(start over\) meets resume=auto \(continue that "
                                          r"run; the default\): add resume=none"):
        setup_run(_cfg(SFTConfig, tmp_path, "overwrite_output_dir=true"))
    assert list_checkpoints(tmp_path / "run")  # nothing was deleted


def test_a_moved_run_folder_resumes_and_one_whose_inputs_moved_is_told_of_resume_path(tmp_path):
    import shutil

    _with_checkpoint(_cfg(SFTConfig, tmp_path))
    shutil.move(tmp_path / "run", tmp_path / "moved")  # `mv run moved`: the same run, somewhere else
    moved = _cfg(SFTConfig, tmp_path, f"output_dir={tmp_path / 'moved'}")
    with setup_run(moved) as ctx:
        assert ctx.resume_from == list_checkpoints(tmp_path / "moved")[-1]
    shutil.move(tmp_path / "model", tmp_path / "model2")  # its inputs moved too: another pretrain path
    ckpt = list_checkpoints(tmp_path / "moved")[-1]
    again = load_config(SFTConfig, None, [f"pretrain={tmp_path / 'model2'}", f"train_manifest={tmp_path / 'train.jsonl'}",
                                          f"output_dir={tmp_path / 'moved'}"])
    with pytest.raises(ConfigError, match=rf"if its files moved \(paths differ\), resume={ckpt} continues"):
        setup_run(again)
    with setup_run(load_config(SFTConfig, None, [f"pretrain={tmp_path / 'model2'}",
                                                  f"train_manifest={tmp_path / 'train.jsonl'}",
                                                  f"output_dir={tmp_path / 'moved'}", f"resume={ckpt}"])) as ctx:
        assert ctx.resume_from == ckpt  # what the message says works


def test_sft_into_an_rl_folder_is_refused(tmp_path):
    _with_checkpoint(_cfg(RLConfig, tmp_path))
    with pytest.raises(ConfigError, match="command: rl -> sft"):
        setup_run(_cfg(SFTConfig, tmp_path))


def test_resume_none_needs_overwrite_and_then_starts_clean(tmp_path):
    _with_checkpoint(_cfg(SFTConfig, tmp_path))
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(ConfigError, match="add overwrite_output_dir=true"):
        setup_run(_cfg(SFTConfig, tmp_path, "resume=none", "optim.learning_rate=0.5"))
    with setup_run(_cfg(SFTConfig, tmp_path, "resume=none", "optim.learning_rate=0.5",
                        "overwrite_output_dir=true")) as ctx:
        # nothing is deleted until the run starts (every input read and validated by then)
        assert ctx.resume_from is None and list_checkpoints(ctx.output_dir)
        assert "learning_rate: 0.5" not in (ctx.output_dir / "config.yaml").read_text()
        ctx.start()
        assert not list_checkpoints(ctx.output_dir) and not (ctx.output_dir / "metrics.jsonl").exists()
        assert "learning_rate: 0.5" in (ctx.output_dir / "config.yaml").read_text()


def test_a_run_in_process_releases_its_folder_and_a_refused_setup_holds_nothing(tmp_path):
    cfg = _cfg(SFTConfig, tmp_path)
    with setup_run(cfg):
        with pytest.raises(ConfigError, match="in use by another run"):  # no in-process takeover
            setup_run(cfg)
    _with_checkpoint(cfg)
    with pytest.raises(ConfigError, match="add overwrite_output_dir=true"):
        setup_run(_cfg(SFTConfig, tmp_path, "resume=none"))
    setup_run(cfg).close()  # the refused setup above released its lock


@pytest.mark.parametrize("key", ["eval_manifest", "train_manifest", "pretrain", "reward.file"])
def test_a_path_typo_is_refused_before_anything_is_written(tmp_path, key):
    with pytest.raises(ConfigError, match=f"`{key}={tmp_path / 'typo'}`"):
        setup_run(_cfg(RLConfig, tmp_path, f"{key}={tmp_path / 'typo'}"))
    assert not (tmp_path / "run").exists()


def test_a_second_process_is_refused_while_the_first_holds_the_folder(tmp_path):
    cfg = _cfg(SFTConfig, tmp_path)
    (tmp_path / "run").mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from asr_rl.trainer.run.folder import RunLock; "
        f"RunLock(Path({str(tmp_path / 'run')!r})); print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=f"in use by another run \\(pid {holder.pid}\\)"):
            setup_run(cfg)
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.1)
    with setup_run(cfg) as ctx:  # the dead holder's lock is gone with it
        assert ctx.output_dir == tmp_path / "run"


def test_checkpoint_folders_follow_the_umask(tmp_path):
    import os

    old = os.umask(0o022)
    try:
        ckpt = save_checkpoint(tmp_path, 1, lambda f: (f / "model.safetensors").write_bytes(b"w"), {"step": 1})
    finally:
        os.umask(old)
    assert ckpt.stat().st_mode & 0o777 == 0o755
    assert (ckpt / "model.safetensors").stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("damage", ["truncate weights", "truncate state", "delete weights"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(tmp_path, damage, caplog):
    import torch

    from asr_rl.trainer.run.checkpoint import checkpoint_problem, resolve_resume

    def weights(folder):
        torch.save({"w": torch.arange(1000.0)}, folder / "model.safetensors")

    older = save_checkpoint(tmp_path, 1, weights, {"step": 1})
    newest = save_checkpoint(tmp_path, 2, weights, {"step": 2, "blob": torch.zeros(1000)})
    name = "model.safetensors" if "weights" in damage else "trainer_state/state.pt"
    target = newest / name
    if damage.startswith("truncate"):
        target.write_bytes(target.read_bytes()[:100])
    else:
        target.unlink()
    assert name in checkpoint_problem(newest) and checkpoint_problem(older) is None
    with caplog.at_level("WARNING"):
        assert resolve_resume(tmp_path, "auto") == older
    assert f"{newest} is damaged ({name}" in caplog.text
    with pytest.raises(ValueError, match=f"the checkpoint is damaged \\({name}"):
        resolve_resume(tmp_path, str(newest))


def test_a_run_that_exits_cleanly_releases_the_lock_and_leaves_no_pid(tmp_path):
    (tmp_path / "run").mkdir()
    subprocess.run([sys.executable, "-c", "from pathlib import Path; from asr_rl.trainer.run.folder import RunLock; "
                    f"RunLock(Path({str(tmp_path / 'run')!r}))"], check=True)
    assert (tmp_path / "run" / ".lock").read_text() == ""  # nothing for the next run to take over


@pytest.mark.parametrize("command", ["sft", "grpo"])
def test_an_overwrite_with_a_bad_manifest_deletes_nothing(tiny_model, tmp_path, command, capsys):
    """resume=none overwrite_output_dir=true into a finished run's folder, with a manifest that fails
    to read: the error names the line, and the old run's checkpoints, final model and metrics stay."""
    from asr_rl.cli import main
    from asr_rl.trainer.configs.rl import RLConfig

    cls = SFTConfig if command == "sft" else RLConfig
    run = tmp_path / "run"
    _with_checkpoint(load_config(cls, None, [f"pretrain={tiny_model}", f"output_dir={run}"]))
    (run / "final").mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "audio": "a.wav", "text": "x"\n')
    code = main(["train", command, f"pretrain={tiny_model}", f"train_manifest={bad}", f"output_dir={run}",
                 "resume=none", "overwrite_output_dir=true"])
    assert code == 2 and f"{bad}:1" in capsys.readouterr().err
    assert list_checkpoints(run) and (run / "final").is_dir() and (run / "metrics.jsonl").read_text()


def test_a_setting_added_since_the_run_was_recorded_resumes_at_its_default(tmp_path):
    """run.json of a run recorded before `model.shared_prefix` existed: resuming with the new key at
    its default is the same run; setting it otherwise is a different one."""
    import json

    from asr_rl.trainer.run.folder import RUN_FILE

    _with_checkpoint(_cfg(RLConfig, tmp_path))
    recorded = tmp_path / "run" / RUN_FILE
    run = json.loads(recorded.read_text())
    del run["settings"]["model.shared_prefix"]
    recorded.write_text(json.dumps(run))
    with setup_run(_cfg(RLConfig, tmp_path)) as ctx:
        assert ctx.resume_from == list_checkpoints(tmp_path / "run")[-1]
    with pytest.raises(ConfigError, match=r"model\.shared_prefix: None -> False"):
        setup_run(_cfg(RLConfig, tmp_path, "model.shared_prefix=false"))
