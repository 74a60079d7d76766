"""Unlabelled audio end to end on the tiny model: GRPO trains from a pool without transcripts under a
reward that needs none; what needs transcripts refuses the pool at load, naming the line."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import Qwen3ASRForConditionalGeneration

from asr_rl.trainer.recipes.rl import load_rl_config, run_audio_rl
from asr_rl.trainer.run.metrics import read_metrics
from tests.trainer.driver.test_grpo_e2e import _overrides

pytestmark = pytest.mark.slow
VERIFIER = Path(__file__).resolve().parents[3] / "recipes" / "rewards" / "voice_commands.py"


def _pool(corpus: Path, out: Path, labelled_every: int = 0) -> Path:
    """The corpus's training lines with `text` removed (kept on every `labelled_every`-th line)."""
    rows = [json.loads(x) for x in (corpus / "train.jsonl").read_text().splitlines()]
    for i, row in enumerate(rows):
        row["audio"] = str((corpus / row["audio"]).resolve())
        if not labelled_every or i % labelled_every:
            del row["text"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def _params(path):
    return dict(Qwen3ASRForConditionalGeneration.from_pretrained(path).named_parameters())


@pytest.mark.parametrize("reward", [[f"reward.file={VERIFIER}", "reward.terms=null"],
                                    ["reward.terms={fluency: 1.0, repetition: 0.5, speaking_rate: 1.0}"]])
def test_grpo_trains_on_unlabelled_audio_under_a_reward_that_needs_no_transcript(tiny_model, tiny_corpus, tmp_path,
                                                                                 reward):
    pool = _pool(tiny_corpus, tmp_path / "pool")
    final = run_audio_rl(load_rl_config("grpo", None, _overrides(tiny_model, pool, tmp_path / "run", "max_steps=2",
                                                                 *reward)))
    before, after = _params(tiny_model), _params(final)
    assert any(not torch.equal(before[n], after[n]) for n in before if "language_model.layers" in n)
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2] and "reward/mean" in rows[-1]


def test_a_mixed_pool_scores_each_line_by_the_terms_it_can_take(tiny_model, tiny_corpus, tmp_path):
    pool = _pool(tiny_corpus, tmp_path / "pool", labelled_every=2)
    run_audio_rl(load_rl_config("grpo", None, _overrides(tiny_model, pool, tmp_path / "run", "max_steps=1",
                                                         "save_steps=0", "reward.terms={cer: 1.0, fluency: 0.5}")))
    assert "reward/cer" in read_metrics(tmp_path / "run")[0]  # scored on the labelled lines only


@pytest.mark.parametrize("extra, message", [
    (["reward.terms={cer: 1.0}"], "reward term 'cer' needs the transcript and {pool}:1 has none"),
    (["reward.terms={fluency: 1.0}", "rollout.reference_in_group=true", "micro_train_batch_size=5"],
     "rollout.reference_in_group needs each line's transcript and {pool}:1 has none"),
    (["reward.terms={fluency: 1.0}", "algo.sft_coef=0.1"], "algo.sft_coef needs each line's transcript"),
])
def test_what_needs_transcripts_refuses_an_unlabelled_pool_naming_the_line(tiny_model, tiny_corpus, tmp_path,
                                                                           extra, message):
    pool = _pool(tiny_corpus, tmp_path / "pool")
    with pytest.raises(ValueError) as err:
        run_audio_rl(load_rl_config("grpo", None, _overrides(tiny_model, pool, tmp_path / "run", *extra)))
    assert message.format(pool=pool / "train.jsonl") in str(err.value)
    assert not (tmp_path / "run" / "final").exists()


def test_sft_and_eval_refuse_unlabelled_lines_naming_the_first(tiny_model, tiny_corpus, tmp_path, capsys):
    from asr_rl.cli import main

    pool = _pool(tiny_corpus, tmp_path / "pool") / "train.jsonl"
    assert main(["train", "sft", f"pretrain={tiny_model}", f"train_manifest={pool}",
                 f"output_dir={tmp_path / 's'}", "max_steps=1"]) == 2
    assert f"{pool}:1: missing `text` (the transcript): SFT needs one" in capsys.readouterr().err
    assert main(["eval", "--model", str(tiny_model), "--test-set", f"pool={pool}", "--quiet"]) == 2
    assert f"test set {pool}: {pool}:1 has no `text`: eval needs the transcripts" in capsys.readouterr().err


def test_a_labelled_home_set_beside_an_unlabelled_pool_by_their_probabilities(tiny_model, tiny_corpus, tmp_path):
    from asr_rl.data.manifest import read_manifest
    from asr_rl.trainer.recipes.rl import datasets_sampler
    from asr_rl.trainer.run.plan import read_datasets

    pool = _pool(tiny_corpus, tmp_path / "pool") / "train.jsonl"
    home = tiny_corpus / "train.jsonl"
    overrides = _overrides(tiny_model, pool, tmp_path / "run", "max_steps=2", "save_steps=0",
                           "reward.terms={cer: 1.0, fluency: 0.5}")
    overrides = [o if not o.startswith("train_manifest=") else f"train_manifest={home},{pool}" for o in overrides]
    cfg = load_rl_config("grpo", None, [*overrides, "train_manifest_probs=[0.5, 0.5]"])
    utts, sizes = read_datasets(cfg)
    each = [*read_manifest(home), *read_manifest(pool, text_needed_by=None)]
    assert sizes == [8, 8] and [(u.id, u.text, u.source) for u in utts] == [(u.id, u.text, u.source) for u in each]
    assert len(datasets_sampler(cfg, sizes).parts) == 2
    run_audio_rl(cfg)
    rows = read_metrics(tmp_path / "run")
    assert "reward/cer" in rows[0] and rows[-1]["data/share_0"] + rows[-1]["data/share_1"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="names 2 datasets: give train_manifest_probs"):
        load_rl_config("grpo", None, overrides)
