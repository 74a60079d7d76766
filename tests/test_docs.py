"""The docs: the references are generated from the code and current, every key and flag has a doc
line, `mkdocs build --strict` passes (no broken link or reference), and the getting-started page's
commands run as written."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))


def test_the_generated_references_are_current_and_document_every_key_and_flag():
    import gen_docs_reference as g

    from asr_rl.cli import build_parser

    undocumented = [f"{command}: {key}" for command, cls in g.commands().items()
                    for key, _, _, doc in g.config_rows(cls) if not doc]
    assert undocumented == []
    bare = [f"{command} {flag}" for command, flags, _ in g.parser_rows(build_parser()) for flag, text in flags
            if not text]
    assert bare == []
    # in a fresh process: a test that registers an entry (a dummy term, an estimator) would change the
    # help texts built from the registries in this one
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs_reference.py"), "--check"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_bytes()) <= 12 * 1024


@pytest.mark.slow
def test_mkdocs_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]


def bash_blocks(page: Path) -> str:
    return "\n".join(re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.S))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed")
def test_the_getting_started_walk_through_runs_as_written(tmp_path):
    script = bash_blocks(ROOT / "docs" / "getting-started.md")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
    res = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, (res.stdout[-2000:], res.stderr[-3000:])
    assert (tmp_path / "exp/mine/grpo/final/config.json").is_file()
    last = res.stdout.strip().splitlines()
    assert any('"reward/accuracy"' in line and '"reward/brevity"' in line for line in last)
    assert (tmp_path / "exp/mine/eval/report.json").is_file()


def doc_commands(page: Path) -> list[str]:
    """The concrete `asr-rl ...` commands of a page's code blocks (continuations joined, comments cut);
    lines with placeholders (`DIR`, `PATH`, `[...]`, `...`) are syntax summaries, not commands."""
    out = []
    for block in re.findall(r"```(?:bash|text)?\n(.*?)```", page.read_text(), flags=re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            m = re.match(r"^(?:[A-Z_]+=\S+\s+)*(asr-rl\s.*)$", line.split(" #")[0].strip().rstrip("&").strip())
            if m and "..." not in m.group(1) and not re.search(r"[A-Z_]{3,}=|\bDIR\b|PATH|\[|`", m.group(1)):
                out.append(m.group(1))
    return out


PAGES = sorted(p for p in (ROOT / "docs").rglob("*.md") if "reference" not in p.parts and p.name != "history.md")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT / "docs")))
def test_every_command_a_page_shows_parses_and_its_config_loads(page, monkeypatch):
    """Each concrete `asr-rl` command of the docs parses, and a `train` command's keys and values load
    (an unknown key, a bad value or a setting that does not apply fails here, not in a reader's shell)."""
    import shlex

    from asr_rl.cli import build_parser, train_config

    monkeypatch.chdir(ROOT)  # `--config recipes/...` and reward files resolve from the repository
    parser = build_parser()
    for command in doc_commands(page):
        argv = shlex.split(command)[1:]
        args, extra = parser.parse_known_args(argv)
        assert not extra or argv[0] == "train", (command, extra)
        if argv[0] == "train":
            train_config(args.algo, args.config, extra)
