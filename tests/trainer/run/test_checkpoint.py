"""Checkpoint saves that run out of disk, on a real small filesystem (a tmpfs mounted for the test)."""
from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest
import torch

from asr_rl.trainer.run.checkpoint import DiskFull, list_checkpoints, resolve_resume, save_checkpoint


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB tmpfs; skipped where the test may not mount one (not root, no CAP_SYS_ADMIN)."""
    mount = tmp_path / f"disk_{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _save_weights(n_bytes: int):
    def save(folder: Path) -> None:
        torch.save({"w": torch.zeros(n_bytes // 4)}, folder / "model.pt")
    return save


def test_a_save_that_fills_the_disk_says_so_and_keeps_the_checkpoint_before(small_disk):
    out = small_disk / "run"
    state = {"step": 1}
    first = save_checkpoint(out, 1, _save_weights(1_200_000), state, max_ckpt_num=2)  # 1.2 MB of 3
    with pytest.raises(DiskFull) as err:
        save_checkpoint(out, 2, _save_weights(2_400_000), {"step": 2}, max_ckpt_num=2)  # 2.4 MB more: no room
    msg = str(err.value)
    assert "the disk is full: writing" in msg and "step_000002" in msg and f"filesystem of {out / 'checkpoints'}" in msg
    assert "MiB free" in msg and f"{first} is intact" in msg and "resume=auto" in msg
    assert "inline_container" not in msg and "unexpected pos" not in msg
    # nothing half-written is left, and the run resumes from the checkpoint before
    assert list_checkpoints(out) == [first] and not [p for p in (out / "checkpoints").iterdir() if ".tmp" in p.name]
    assert resolve_resume(out, "auto") == first
