"""`DEMO_SCALE=tiny` quickstart end to end (what `DEMO_SCALE=tiny make demo` runs), in a temp folder:
corpus -> model init -> SFT -> reward server -> GRPO on Ray + DeepSpeed -> eval -> report."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.ray]


@pytest.mark.parametrize("arch", ["qwen2_audio", "qwen3_asr"])  # pretrained Whisper encoder; from scratch
def test_tiny_quickstart_runs_every_stage_and_resumes(tmp_path, arch):
    env = {**os.environ, "DEMO_SCALE": "tiny", "ARCH": arch, "EXP": str(tmp_path / "exp"),
           "CORPUS": str(tmp_path / "corpus"), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PORT": "5199", "RAY_ADDRESS": ""}
    res = subprocess.run(["bash", str(ROOT / "recipes/quickstart.sh")], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    exp = tmp_path / "exp"
    assert sorted(p.name for p in (exp / ".done").iterdir()) == [f"stage{i}" for i in range(7)]
    report = (exp / "report" / "report.md").read_text()
    # adapting to the target (qwen2_audio's default): the home domain's clean set and the target's sets
    sets = (("test_clean", "target_pool", "target_dev", "target_test", "nonspeech") if arch == "qwen2_audio"
            else ("test_clean", "test_noisy", "test_accent", "dev"))
    for test_set in sets:
        assert f"| {test_set} | grpo |" in report and f"| {test_set} | sft |" in report
    assert (exp / "grpo" / "final" / "config.json").is_file()
    compare = json.loads((exp / "eval" / "compare" / "report.json").read_text())["compare"]
    assert set(sets) <= set(json.dumps(compare).split('"'))
    assert "P(B<A)" in report  # the paired-bootstrap intervals reach the report
    if arch == "qwen2_audio":  # SFT wrote its frozen encoder's states (GRPO also writes what it encodes new)
        assert any((exp / "encoder_cache").glob("*.idx"))
    info = json.loads((exp / "grpo" / "final" / "asr_rl.json").read_text())
    assert info["arch"] == arch and (info["encoder"] == "whisper-tiny.en") == (arch == "qwen2_audio")
    again = subprocess.run(["bash", str(ROOT / "recipes/quickstart.sh")], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count("done before, skipped") == 7
