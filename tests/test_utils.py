from __future__ import annotations

import os
import stat

from asr_rl.utils import atomic_write_text, replace_dir, write_jsonl


def test_atomic_write_leaves_plain_permissions_and_no_temp_files(tmp_path):
    atomic_write_text(tmp_path / "a.txt", "hello")
    mode = stat.S_IMODE(os.stat(tmp_path / "a.txt").st_mode)
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_write_jsonl_keeps_non_ascii_readable(tmp_path):
    write_jsonl(tmp_path / "x.jsonl", [{"text": "打开"}, {"text": "b"}])
    assert (tmp_path / "x.jsonl").read_text(encoding="utf-8") == '{"text": "打开"}\n{"text": "b"}\n'


def test_replace_dir_swaps_an_existing_folder(tmp_path):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "f").write_text("old")
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "f").write_text("new")
    replace_dir(tmp_path / "new", tmp_path / "old")
    assert (tmp_path / "old" / "f").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]
