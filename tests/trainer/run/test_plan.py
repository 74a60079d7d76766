"""The run plan: an RL run's start-up reads the model folder and the data once, and its checks
stop at the first that fails, in `PREFLIGHT`'s order, before anything later is read."""
from __future__ import annotations

import json

import pytest

from asr_rl.models import weights
from asr_rl.models.families.base import AudioLLMSpec
from asr_rl.models.loading import require_audio_llm
from asr_rl.trainer.recipes.rl import load_rl_config
from asr_rl.trainer.run import plan as run_plan
from asr_rl.trainer.run.plan import PREFLIGHT, RunPlan, preflight
from tests.trainer.driver.test_grpo_e2e import _overrides


@pytest.fixture
def reads(monkeypatch):
    """How often the start-up reads a model's config.json and loads its processor (the real ones run)."""
    counts = {"config.json": 0, "processor": 0}
    read_config, load_processor = weights.read_model_config, AudioLLMSpec.load_processor

    def counted_config(path):
        counts["config.json"] += 1
        return read_config(path)

    def counted_processor(self, path):
        counts["processor"] += 1
        return load_processor(self, path)

    monkeypatch.setattr(weights, "read_model_config", counted_config)
    monkeypatch.setattr(AudioLLMSpec, "load_processor", counted_processor)
    return counts


def test_the_checks_run_in_one_line_in_their_order():
    assert [c.__name__ for c in PREFLIGHT] == ["require_manifest", "check_unlabelled", "check_writable",
                                               "check_prompts_fit", "check_cache"]


def test_a_run_s_start_up_reads_the_model_folder_once(tiny_model, tiny_corpus, tmp_path, reads):
    cfg = load_rl_config("grpo", None, _overrides(tiny_model, tiny_corpus, tmp_path / "run",
                                                  f"model.encoder_cache={tmp_path / 'cache'}"))
    plan = RunPlan(cfg)
    require_audio_llm(plan.model)
    preflight(cfg, plan)
    assert plan.longest.duration == max(u.duration for u in plan.utts)
    assert plan.cache.utterances == len(plan.utts) == 8 and plan.sizes == [8]
    assert reads == {"config.json": 1, "processor": 1}


def test_the_first_failing_check_stops_before_the_model_s_tokenizer_is_read(tiny_model, tiny_corpus, tmp_path, reads):
    rows = [json.loads(x) for x in (tiny_corpus / "train.jsonl").read_text().splitlines()]
    for row in rows:
        row["audio"] = str((tiny_corpus / row["audio"]).resolve())
        del row["text"]
        row["context"] = ["\u2603 snowman"]  # a character the tokenizer cannot write: check_writable's
    pool = tmp_path / "pool"
    pool.mkdir()
    (pool / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    overrides = _overrides(tiny_model, pool, tmp_path / "run", "reward.terms={fluency: 1.0}")
    cfg = load_rl_config("grpo", None, [*overrides, "rollout.reference_in_group=true", "micro_train_batch_size=5"])
    plan = RunPlan(cfg)
    with pytest.raises(ValueError, match="rollout.reference_in_group needs each line's transcript"):
        preflight(cfg, plan)
    assert reads == {"config.json": 0, "processor": 0}  # the data was read, the model not yet
    cfg = load_rl_config("grpo", None, [*overrides, "rollout.reference_in_group=false"])
    with pytest.raises(ValueError, match="characters the model's tokenizer cannot write"):
        preflight(cfg, RunPlan(cfg))
    assert reads == {"config.json": 1, "processor": 1}


def test_without_a_manifest_nothing_is_read(tmp_path, tiny_model, reads, monkeypatch):
    cfg = load_rl_config("grpo", None, [f"pretrain={tiny_model}", f"output_dir={tmp_path / 'run'}"])
    monkeypatch.setattr(run_plan, "read_datasets", lambda cfg: pytest.fail("the data was read"))
    with pytest.raises(ValueError, match="`train_manifest` is not set"):
        preflight(cfg, RunPlan(cfg))
    assert reads == {"config.json": 0, "processor": 0}
