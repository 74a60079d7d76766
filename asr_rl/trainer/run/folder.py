"""A run folder holds one run: checked paths, an exclusive lock, and the settings that define it.

Before anything is written or loaded: every path setting is checked; the folder is locked (a
second run into it stops instead of interleaving metrics and weights; the kernel releases the lock
when its holder dies, so a killed run never leaves a stale one); a folder that already holds
checkpoints is resumed only by the same run (same command and run-defining settings, recorded in
`run.json`), else the run stops and says how to resume, overwrite or pick another folder. Only then
are `config.yaml` and `run.json` written.
"""
from __future__ import annotations

import atexit
import fcntl
import json
import logging
import os
import shutil
from pathlib import Path

from asr_rl.config import ConfigError, leaf_values, save_config
from asr_rl.utils import atomic_write_text

log = logging.getLogger("asr_rl.train")

RUN_FILE = "run.json"
LOCK_FILE = ".lock"
# Settings a resumed run may change: how long and how often, where it logs and evaluates, where it
# runs. Every other setting defines the run.
# `output_dir` is where the run is, not what it is: a folder moved with `mv` (or named from another
# working directory) holds the same run.
RESUMABLE_CHANGES = {"output_dir", "resume", "overwrite_output_dir", "max_steps", "max_minutes", "save_steps", "eval_steps",
                     "eval_manifest", "max_ckpt_num", "num_threads", "device", "logging", "eval",
                     "distributed.ray_num_cpus"}
# Path settings: (key, kind) checked up front; "model" = a folder with config.json, "data" = a file
# or a dataset folder (data/readers: a `datasets` or Kaldi folder).
PATH_KEYS = (("pretrain", "model"), ("critic_pretrain", "model"), ("reward_pretrain", "model"),
             ("train_manifest", "data"), ("prompt_data", "file"), ("eval_manifest", "data"), ("reward.file", "file"))
_KINDS = {"model": "a model folder with config.json", "file": "a file", "data": "a file or a dataset folder"}


def check_paths(cfg) -> None:
    """Every path setting that is set exists (before any model or data loads): a ConfigError names
    the key and the path."""
    for key, kind in PATH_KEYS:
        value = _get(cfg, key)
        if not value:
            continue
        for part in value.split(",") if key == "train_manifest" else [value]:  # several datasets: a,b
            path = Path(part.strip())
            ok = {"model": (path / "config.json").is_file(), "file": path.is_file(), "data": path.exists()}[kind]
            if not ok:
                raise ConfigError(f"`{key}={value}`: {path} is not {_KINDS[kind]}")
    if getattr(cfg, "reward", None) is not None:
        from asr_rl.rewards.term_options import check_term_folders

        try:
            check_term_folders(cfg.reward)
        except ValueError as e:
            raise ConfigError(str(e)) from None


class RunLock:
    """An exclusive `flock` on `<output_dir>/.lock` (or on `lock`, guarding what `what` names: an
    output file, "--out FILE"), held until `release()` or process exit."""

    def __init__(self, folder: Path, lock: Path | None = None, what: str | None = None):
        self.path = lock or folder / LOCK_FILE
        what = what or f"output_dir {folder}"
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(self.fd)
            option = what.split()[0]
            raise ConfigError(f"{what} is in use by another run (pid {holder}); wait for it to finish, "
                              f"or choose another {option}") from None
        previous = os.pread(self.fd, 64, 0).decode(errors="replace").strip()
        if previous:
            log.info("%s: the run before (pid %s) ended without releasing its lock; taking it over", what, previous)
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)
        atexit.register(self.release)  # a run that ends (or fails) cleanly leaves an empty lock file

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def defining_settings(cfg) -> dict:
    """The settings that define a run, by dotted key."""
    return {k: v for k, v in leaf_values(cfg).items() if _defining(k)}


def _defining(key: str) -> bool:
    return key not in RESUMABLE_CHANGES and key.split(".", 1)[0] not in RESUMABLE_CHANGES


def check_run_folder(cfg, command: str, has_checkpoints: bool) -> None:
    """Refuse a run that `cfg.output_dir` may not take (another run's checkpoints there without
    resume=auto of the same run, or resume=none without overwrite_output_dir); writes nothing."""
    out = Path(cfg.output_dir)
    if has_checkpoints and cfg.resume == "auto" and cfg.overwrite_output_dir:
        raise ConfigError(f"output_dir {out} holds a run's checkpoints, and overwrite_output_dir=true (start over) "
                          "meets resume=auto (continue that run; the default): add resume=none to delete them and "
                          "start over, or drop overwrite_output_dir to continue")
    if has_checkpoints and cfg.resume == "auto":
        _check_same_run(out, cfg, command)
    elif has_checkpoints and cfg.resume in ("none", "", "false") and not cfg.overwrite_output_dir:
        raise ConfigError(f"output_dir {out} holds another run's checkpoints and resume=none; add "
                          "overwrite_output_dir=true to delete them and start over, resume=auto to continue "
                          "that run, or choose another output_dir")


def claim_run_folder(cfg, command: str, has_checkpoints: bool) -> None:
    """The run starts in `cfg.output_dir`: an overwrite deletes the previous run's checkpoints and
    metrics now (only once every input was read and validated), and `config.yaml`/`run.json` are
    written."""
    out = Path(cfg.output_dir)
    if has_checkpoints and cfg.resume in ("none", "", "false"):
        for name in ("checkpoints", "final", "best", "tensorboard", "metrics.jsonl"):
            target = out / name
            shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
        log.info("overwrite_output_dir: removed the previous run's checkpoints and metrics from %s", out)
    save_config(cfg, out / "config.yaml")
    atomic_write_text(out / RUN_FILE, json.dumps({"command": command, "settings": defining_settings(cfg)},
                                                 indent=1, sort_keys=True, default=str) + "\n")


def _check_same_run(out: Path, cfg, command: str) -> None:
    recorded = out / RUN_FILE
    if not recorded.is_file():
        return  # a folder from before run.json: nothing to compare against
    before = json.loads(recorded.read_text())
    now = json.loads(json.dumps(defining_settings(cfg), default=str))
    diffs = [f"command: {before['command']} -> {command}"] if before["command"] != command else []
    # a setting added to the toolkit since that run was recorded, left at its default, is what the
    # run did (new settings default to the old behaviour): not a difference
    defaults = json.loads(json.dumps(defining_settings(type(cfg)()), default=str))
    keys = sorted(k for k in set(before["settings"]) | set(now)  # a run.json of older versions records more
                  if _defining(k) and (k in before["settings"] or now.get(k) != defaults.get(k)))
    diffs += [f"{k}: {before['settings'].get(k)!r} -> {now.get(k)!r}" for k in keys
              if before["settings"].get(k) != now.get(k)]
    if diffs:
        shown = "; ".join(diffs[:6]) + (f"; and {len(diffs) - 6} more" if len(diffs) > 6 else "")
        from asr_rl.trainer.run.checkpoint import list_checkpoints

        ckpts = list_checkpoints(out)
        moved = (f"; if its files moved (paths differ), resume={ckpts[-1]} continues from its checkpoint with these "
                 "settings" if ckpts else "")
        raise ConfigError(f"output_dir {out} holds the checkpoints of a different run ({shown}). To resume that run, "
                          f"use its settings ({out / 'config.yaml'}){moved}; to start over in this folder, add "
                          "resume=none overwrite_output_dir=true; or choose another output_dir")


def _get(cfg, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part, None)
    return cfg


__all__ = ["check_paths", "RunLock", "check_run_folder", "claim_run_folder", "defining_settings", "RUN_FILE"]
