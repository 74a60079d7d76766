"""Checkpoints: a Hugging Face folder per saved step, with the resume state beside the weights.

    <output_dir>/checkpoints/step_000050/    config.json, model.safetensors, processor files
                                            trainer_state/state.pt   (optimizer, scheduler, step,
                                                                      RNG, data position, extras)
    <output_dir>/checkpoints/latest          name of the newest complete checkpoint
    <output_dir>/final/                      the last weights, a plain HF folder
    <output_dir>/best/                       with early stopping: the best weights on dev, and
                                            best.json (step, metric, value)

Each folder is written to a temp folder and renamed into place, so a crash leaves the previous
checkpoint intact and never a half-written one; `transformers` ignores the extra `trainer_state/`.
"""
from __future__ import annotations

import json
import logging
import random
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from asr_rl.utils import atomic_write_text, replace_dir

STATE_DIR = "trainer_state"
FILES = "files.json"
log = logging.getLogger("asr_rl.train")
_STEP_RE = re.compile(r"^step_(\d+)$")


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(output_dir: str | Path, step: int, save_model: Callable[[Path], None], state: dict,
                    max_ckpt_num: int = 2, save_state: Callable[[Path], None] | None = None) -> Path:
    """Write `checkpoints/step_<step>` atomically and prune older ones beyond `max_ckpt_num`.

    `save_model(folder)` writes the HF files; `state` (torch-serialisable) is the resume state;
    `save_state(folder)` may add engine-specific state (e.g. DeepSpeed's) to `trainer_state/`.
    """
    root = Path(output_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{final.name}.tmp"))
    try:
        save_model(tmp)
        (tmp / STATE_DIR).mkdir(exist_ok=True)
        torch.save(state, tmp / STATE_DIR / "state.pt")
        if save_state is not None:
            save_state(tmp / STATE_DIR)
        _record_files(tmp)
        replace_dir(tmp, final)
    except BaseException as e:
        full = disk_full(e, tmp, final, previous=list_checkpoints(output_dir))
        shutil.rmtree(tmp, ignore_errors=True)
        if full is not None:
            raise full from e
        raise
    atomic_write_text(root / "latest", final.name + "\n")
    for old in list_checkpoints(output_dir)[:-max(1, max_ckpt_num)]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def save_final(output_dir: str | Path, save_model: Callable[[Path], None], name: str = "final",
               info: dict | None = None) -> Path:
    """Write `<output_dir>/<name>` (weights only; `final`, or `best` for early stopping) atomically,
    with `info` as `<name>.json` in it when given."""
    final = Path(output_dir) / name
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{name}.tmp"))
    try:
        save_model(tmp)
        if info is not None:
            (tmp / f"{name}.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
        replace_dir(tmp, final)
    except BaseException as e:
        full = disk_full(e, tmp, final, previous=[final] if final.is_dir() else [])
        shutil.rmtree(tmp, ignore_errors=True)
        if full is not None:
            raise full from e
        raise
    return final


class DiskFull(OSError):
    """A save that ran out of disk: the message says which folder, how much was free and needed."""


# free space below which a failed write is taken for a full disk: torch's zip writer reports ENOSPC
# as "[enforce fail at inline_container.cc] unexpected pos", with no errno to read
_NEARLY_FULL = 64 << 20


def disk_full(error: BaseException, tmp: Path, final: Path, previous: list[Path]) -> DiskFull | None:
    """A `DiskFull` for `error` when it came from a full disk (ENOSPC anywhere in its chain, or
    almost nothing free where `tmp` was being written), else None. Measured before `tmp` is removed:
    what it holds is what was written before the disk filled."""
    import errno

    chain, e = [], error
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    try:
        free = shutil.disk_usage(tmp if tmp.exists() else tmp.parent).free
    except OSError:
        return None
    if not any(getattr(x, "errno", None) == errno.ENOSPC for x in chain) and free >= _NEARLY_FULL:
        return None
    written = _folder_bytes(tmp)
    needed = max([written] + [_folder_bytes(p) for p in previous])
    mib = 1 << 20
    kept = f"; {previous[-1]} is intact" if previous else ""
    return DiskFull(errno.ENOSPC, f"the disk is full: writing {final} stopped after {written / mib:.1f} MiB with "
                    f"{free / mib:.1f} MiB free on the filesystem of {final.parent}; one save needs at least "
                    f"{needed / mib:.1f} MiB{kept}. Free space there (or lower max_ckpt_num, or set output_dir "
                    "on a larger disk) and resume with resume=auto")


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete step checkpoints, oldest first (temp folders are never matched)."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_RE.match(p.name))
             and (p / STATE_DIR / "state.pt").is_file()]
    return [p for _, p in sorted(found)]


def resolve_resume(output_dir: str | Path, resume: str) -> Path | None:
    """`auto`: the newest intact checkpoint in `output_dir` (or None), saying so when newer ones are
    damaged; `none`: None; else that path, which must be intact."""
    if resume in ("none", "", "false", "False"):
        return None
    if resume == "auto":
        for ckpt in reversed(list_checkpoints(output_dir)):
            problem = checkpoint_problem(ckpt)
            if problem is None:
                return ckpt
            log.warning("checkpoint %s is damaged (%s): falling back to the one before", ckpt, problem)
        return None
    path = Path(resume)
    if not (path / STATE_DIR / "state.pt").is_file():
        raise FileNotFoundError(f"resume={resume}: {path} is not a checkpoint folder with {STATE_DIR}/state.pt")
    problem = checkpoint_problem(path)
    if problem is not None:
        raise ValueError(f"resume={resume}: the checkpoint is damaged ({problem}); resume from another one")
    return path


def _record_files(folder: Path) -> None:
    """`trainer_state/files.json`: the size of every file of the checkpoint as written, so that a
    truncated or missing file is found before a resume loads it."""
    sizes = {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}
    (folder / STATE_DIR / FILES).write_text(json.dumps(sizes, indent=0, sort_keys=True))


def checkpoint_problem(ckpt: str | Path) -> str | None:
    """What is wrong with a checkpoint's files against the sizes recorded at save (None = intact;
    a checkpoint written before the record existed is taken as intact)."""
    record = Path(ckpt) / STATE_DIR / FILES
    if not record.is_file():
        return None
    for name, size in json.loads(record.read_text()).items():
        path = Path(ckpt) / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} is {path.stat().st_size} bytes, {size} were written"
    return None


def policy_resume_weights(policy) -> dict | None:
    """What the HF folder cannot restore: with LoRA the folder holds merged weights, so the
    trainable tensors (adapters, projector) are kept by name in the resume state."""
    from asr_rl.models.lora import has_lora

    if not has_lora(policy.model):
        return None
    return {n: p.detach().cpu().clone() for n, p in policy.model.named_parameters() if p.requires_grad}


def restore_policy_weights(policy, ckpt: str | Path, trainable: dict | None) -> None:
    """Load the weights a checkpoint was saved with into the (already built) policy."""
    if trainable is not None:
        params = dict(policy.model.named_parameters())
        missing = sorted(set(trainable) - set(params))
        if missing:
            raise ValueError(f"checkpoint {ckpt} has trainable tensors the policy lacks: {missing[:5]}")
        with torch.no_grad():
            for name, value in trainable.items():
                params[name].copy_(value)
        return
    restore_model_weights(policy.model, ckpt)


def restore_model_weights(model: torch.nn.Module, ckpt: str | Path) -> None:
    """Load a checkpoint folder's HF weights into the (already built) transformers `model`."""
    reloaded = type(model).from_pretrained(ckpt, dtype=next(model.parameters()).dtype)
    model.load_state_dict(reloaded.state_dict())


def load_state(ckpt: str | Path) -> dict:
    return torch.load(Path(ckpt) / STATE_DIR / "state.pt", map_location="cpu", weights_only=False)


def cleanup_stale_temps(output_dir: str | Path) -> None:
    """Remove temp folders a killed run left behind (never a complete checkpoint)."""
    root = Path(output_dir) / "checkpoints"
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith(".") and ".tmp" in p.name:
                shutil.rmtree(p, ignore_errors=True)


__all__ = ["save_checkpoint", "save_final", "list_checkpoints", "resolve_resume", "load_state", "rng_state",
           "set_rng_state", "checkpoint_problem", "cleanup_stale_temps", "policy_resume_weights", "restore_policy_weights", "restore_model_weights", "STATE_DIR"]
