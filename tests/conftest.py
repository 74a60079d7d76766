"""Shared fixtures: real audio written with soundfile, small manifests."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

import numpy as np
import pytest
import soundfile as sf

# One torch thread per process: on 2 shared cores this is 2-3x faster than 2 threads each.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Each pytest-xdist worker starts its own embedded Ray clusters. Ray looks for "the latest cluster"
# in its temp folder (a `ray start` or a test's two-node cluster writes it there), so each worker
# gets a folder of its own and never joins the other's cluster.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("RAY_TMPDIR", f"/tmp/ray-{os.environ['PYTEST_XDIST_WORKER']}")

RAY_CPUS = 4  # logical slots on 2 cores: a policy rank plus separate reference and critic groups


def pytest_sessionfinish(session, exitstatus):
    if "ray" in sys.modules:
        from asr_rl.trainer.distributed.ray_utils import shutdown_ray

        shutdown_ray()


@pytest.fixture
def local_ray():
    """This process's embedded Ray (`RAY_CPUS` CPU slots), started on first use and kept for the
    tests after it (a start costs seconds). A cluster of another size (a run that started its own)
    is replaced; a test that leaves actors holding slots gets the cluster shut down after it, so that
    the next test starts from a free one."""
    import ray

    from asr_rl.trainer.distributed.ray_utils import init_ray, shutdown_ray

    if ray.is_initialized() and ray.cluster_resources().get("CPU") != RAY_CPUS:
        shutdown_ray()
    init_ray(num_cpus=RAY_CPUS, object_store_mb=256)
    yield
    deadline = time.monotonic() + 10  # actors give their slots back asynchronously
    while ray.is_initialized() and ray.available_resources().get("CPU") != RAY_CPUS:
        if time.monotonic() > deadline:
            shutdown_ray()
            break
        time.sleep(0.2)


def write_tone(path: Path, seconds: float = 0.5, sr: int = 16000, channels: int = 1, freq: float = 440.0) -> Path:
    """A sine tone, so that loaders and feature extractors see real signal."""
    t = np.arange(int(seconds * sr)) / sr
    wav = 0.3 * np.sin(2 * np.pi * freq * t).astype(np.float32)
    if channels > 1:
        wav = np.stack([wav * (c + 1) / channels for c in range(channels)], axis=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), wav, sr, subtype="PCM_16")
    return path


def write_manifest(path: Path, rows: list) -> Path:
    """Rows may be dicts (dumped as JSON) or raw strings (written verbatim, for malformed lines)."""
    lines = [r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def tone_manifest(tmp_path: Path) -> Path:
    write_tone(tmp_path / "wavs" / "a.wav", 0.5)
    write_tone(tmp_path / "wavs" / "b.wav", 1.0, freq=220)
    return write_manifest(tmp_path / "m.jsonl", [
        {"id": "a", "audio": "wavs/a.wav", "text": "call anna", "language": "en", "keywords": ["anna"]},
        {"id": "b", "audio": "wavs/b.wav", "text": "打开客厅的灯", "language": "zh", "speaker": "s1"},
    ])


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> Path:
    """A real synthesised bilingual corpus: 8 train, 2 per test set (espeak-ng)."""
    from asr_rl.data.synth import synthesize_corpus

    out = tmp_path_factory.mktemp("corpus") / "c"
    synthesize_corpus(out, langs=("en", "zh"), n_train=8, n_test=2, seed=0, workers=1, progress=False)
    return out


@pytest.fixture(scope="session")
def tiny_model(tiny_corpus, tmp_path_factory) -> Path:
    """A randomly initialised tiny Qwen3-ASR folder with a tokenizer trained on `tiny_corpus`."""
    from asr_rl.models.builders import init_model

    return init_model("qwen3_asr", "tiny", [tiny_corpus / "train.jsonl"], tmp_path_factory.mktemp("m") / "tiny")


@pytest.fixture(scope="session")
def whisper_model(tiny_corpus, tmp_path_factory) -> Path:
    """A tiny Qwen2-Audio folder: the pretrained Whisper tiny.en encoder (packaged) + a tiny Qwen2 LLM."""
    from asr_rl.models.builders import init_model

    return init_model("qwen2_audio", "tiny", [tiny_corpus / "train.jsonl"], tmp_path_factory.mktemp("w") / "q2a")


@pytest.fixture(scope="session")
def text_data(tmp_path_factory):
    from tests.trainer.recipes.text_fixtures import write_text_data

    return write_text_data(tmp_path_factory.mktemp("text"))


@pytest.fixture(scope="session")
def tiny_text_model(text_data, tmp_path_factory) -> Path:
    from asr_rl.models.builders import init_model

    return init_model("qwen2", "tiny", [text_data["prompts"], text_data["prefs"]],
                      tmp_path_factory.mktemp("tm") / "qwen2")


@contextlib.contextmanager
def serve_reward(spec: str, token: str = "s3cret"):
    """A real `asr-rl reward serve --reward SPEC` process on a free 127.0.0.1 port; yields its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).parent / "asr-rl"
    proc = subprocess.Popen([str(exe), "reward", "serve", "--reward", spec, "--port", str(port),
                             "--token", token], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail(f"reward server did not start: {proc.stdout.read()}")
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def reward_server():
    """A real `asr-rl reward serve --reward builtin:asr` process on a free 127.0.0.1 port (token s3cret)."""
    with serve_reward("builtin:asr") as url:
        yield url
