"""Each workflow page's commands run as written, in the page's order, at tiny scale.

A page's commands run in a folder of their own where the paths they name hold the tiny test model
(a Qwen2-Audio folder with the packaged Whisper encoder) and the tiny synthesised corpus; only
their sizes are overridden (steps, batches, tokens, lines synthesised), appended after the page's
own settings, which they replace. A command that fails, or leaves no output where it says, fails
the test, naming the page and the command."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_docs import ROOT, doc_commands

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed")]
WORKFLOWS = ROOT / "docs" / "workflows"
NEEDS_A_CLUSTER = {"gpu-cluster.md": "its command joins a running Ray cluster with GPUs (RAY_ADDRESS=auto, vLLM)"}

# the sizes appended to a command (argparse and dotted overrides: the last value given wins)
RL_SCALE = ["max_steps=1", "rollout.rollout_batch_size=2", "rollout.n_samples_per_prompt=4", "rollout.max_new_tokens=8",
            "optim.micro_train_batch_size=2", "eval.eval_max_samples=2"]
SCALE = {("train", "grpo"): RL_SCALE, ("train", "ppo"): RL_SCALE,
         ("train", "sft"): ["max_steps=1", "train_batch_size=2", "micro_train_batch_size=2"],
         ("train", "scorer"): ["max_steps=2", "train_batch_size=4"],
         ("train", "dpo"): ["max_steps=1", "train_batch_size=2", "micro_train_batch_size=2"],
         ("train", "rm"): ["max_steps=1", "train_batch_size=2"],
         ("data", "synth"): ["--train", "8", "--test", "2", "--workers", "1", "--quiet"],
         ("data", "pairs"): ["--n", "4", "--max-new-tokens", "8"]}


def _every_character(path: Path) -> Path:
    """Text lines holding every character the corpus synthesis can write (its grammars and its
    context lists' entities), so the model's tokenizer writes whatever a page synthesises."""
    from asr_rl.data.synth import contexts, grammar_zh

    items = [item for lang in ("en", "zh") for kind in contexts.categories(lang).values() for item in kind]
    texts = ["abcdefghijklmnopqrstuvwxyz' ", "".join(grammar_zh.CHAR_PINYIN), *items]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


@pytest.fixture(scope="module")
def model(tiny_corpus, tmp_path_factory) -> Path:
    """What the pages call the SFT: the tiny Qwen2-Audio fitted to the tiny corpus (100 steps), so
    that its samples are transcripts that differ, as the pages' pairs and labels need."""
    from asr_rl.cli import main
    from asr_rl.models.builders import init_model

    folder = tmp_path_factory.mktemp("workflow_model")
    texts = [tiny_corpus / "train.jsonl", _every_character(folder / "chars.jsonl")]
    init_model("qwen2_audio", "tiny", texts, folder / "init")
    assert main(["train", "sft", f"pretrain={folder / 'init'}", f"train_manifest={tiny_corpus / 'train.jsonl'}",
                 f"output_dir={folder / 'sft'}", "max_steps=100", "train_batch_size=8", "micro_train_batch_size=8",
                 "optim.learning_rate=0.003", "eval_steps=0", "save_steps=0", "logging.progress_bar=false",
                 "logging.tensorboard=false"]) == 0
    return folder / "sft" / "final"


def _manifest(src: Path, dst: Path, labelled: bool = True) -> None:
    rows = [json.loads(x) for x in src.read_text().splitlines()]
    for row in rows:
        row["audio"] = str((src.parent / row["audio"]).resolve())
        if not labelled:
            row.pop("text")
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _sandbox(folder: Path, page: Path, model: Path, corpus: Path, text_data: dict) -> None:
    """The paths the workflow pages name, holding the tiny model and corpus."""
    (folder / "recipes").symlink_to(ROOT / "recipes")
    for name in ("exp/my_sft/final", "exp/sft/best", "exp/sft/final", "exp/grpo/final"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).symlink_to(model)
    for name in ("data/my_pool.jsonl", "source/train.jsonl", "train.jsonl", "pool.jsonl"):
        _manifest(corpus / "train.jsonl", folder / name)
    for name in ("data/my_dev.jsonl", "source/dev.jsonl", "dev.jsonl"):
        _manifest(corpus / "dev.jsonl", folder / name)
    for name in ("target/pool.jsonl", "untranscribed.jsonl"):
        _manifest(corpus / "train.jsonl", folder / name, labelled=False)
    if page.name == "text-rlhf.md":  # a prompt set, preference pairs, and the page's own reward file
        shutil.copy(text_data["prompts"], folder / "prompts.jsonl")
        shutil.copy(text_data["prefs"], folder / "pairs.jsonl")
        (folder / "my_reward.py").write_text("\n".join(re.findall(r"```python\n(.*?)```", page.read_text(), re.S)))


def _output(argv: list[str]) -> str | None:
    """Where a command says it writes: `output_dir=` (its `final/`), `--out` or `--output`."""
    for i, arg in enumerate(argv):
        if arg.startswith("output_dir="):
            return arg.split("=", 1)[1] + "/final"
        if arg in ("--out", "--output"):
            return argv[i + 1]
    return None


@pytest.mark.parametrize("page", sorted(WORKFLOWS.glob("*.md")), ids=lambda p: p.name)
def test_each_workflow_page_s_commands_run_at_tiny_scale(page, model, tiny_corpus, text_data, tmp_path):
    if page.name in NEEDS_A_CLUSTER:
        pytest.skip(NEEDS_A_CLUSTER[page.name])
    commands = doc_commands(page)
    assert commands, f"{page.name} shows no command a reader can run"
    _sandbox(tmp_path, page, model, tiny_corpus, text_data)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
    for command in commands:
        argv = shlex.split(command)[1:]
        argv += SCALE.get(tuple(argv[:2]), [])
        res = subprocess.run(["asr-rl", *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, (page.name, command, res.stdout[-1500:], res.stderr[-3000:])
        out = _output(argv)
        assert out is None or (tmp_path / out).exists(), (page.name, command, f"wrote no {out}")


def test_the_cluster_page_s_recipe_settings_load_as_the_recipe_passes_them(monkeypatch):
    """Its run needs a Ray cluster with GPUs; what it sets is checked here: the environment the recipe
    maps onto `asr-rl train grpo` and the overrides after the stages, loaded as the recipe passes them."""
    from asr_rl.trainer.recipes.rl import load_rl_config

    block = re.findall(r"```bash\n(.*?)```", (WORKFLOWS / "gpu-cluster.md").read_text(), flags=re.S)[0]
    words = shlex.split(re.sub(r"\\\n", " ", block))
    env = dict(w.split("=", 1) for w in words[:words.index("bash")])
    extra = words[words.index("bash") + 4:]  # after `bash recipes/run_grpo_from_sft.sh 0 3`
    monkeypatch.chdir(ROOT)
    cfg = load_rl_config("grpo", "recipes/configs/grpo_demo.yaml", [
        f"backend={env['BACKEND'].lower()}", f"rollout.engine={env['ENGINE']}",
        f"distributed.actor_num_gpus_per_node={env['NUM_RANKS']}", f"distributed.zero_stage={env['ZERO_STAGE']}", *extra])
    assert (cfg.backend, cfg.rollout.engine, cfg.distributed.zero_stage) == ("ray", "vllm", 3)
    assert cfg.rollout.rollout_batch_size == 64 and cfg.distributed.bf16
