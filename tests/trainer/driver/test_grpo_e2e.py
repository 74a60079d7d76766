"""End to end on the tiny model: the real loop, local backend, real synthesised audio."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import Qwen3ASRForConditionalGeneration

from asr_rl.trainer.run.metrics import read_metrics
from asr_rl.trainer.recipes.rl import load_rl_config, run_audio_rl

pytestmark = pytest.mark.slow


def _overrides(model, corpus, out, *extra):
    return [f"pretrain={model}", f"train_manifest={corpus / 'train.jsonl'}", f"output_dir={out}",
            "rollout_batch_size=2", "n_samples_per_prompt=4", "micro_train_batch_size=4", "max_new_tokens=12",
            "max_steps=3", "save_steps=1", "eval_steps=0", "temperature=1.5", "actor_learning_rate=0.01",
            "logging.tensorboard=false", "logging.progress_bar=false", *extra]


def _params(path):
    return dict(Qwen3ASRForConditionalGeneration.from_pretrained(path).named_parameters())


def test_three_grpo_steps_train_projector_and_llm_and_leave_the_encoder(tiny_model, tiny_corpus, tmp_path):
    final = run_audio_rl(load_rl_config("grpo", None, _overrides(tiny_model, tiny_corpus, tmp_path / "run")))
    before, after = _params(tiny_model), _params(final)  # plain transformers loads the checkpoint
    encoder = [n for n in before if n.startswith("model.audio_tower.")]
    assert encoder and all(torch.equal(before[n], after[n]) for n in encoder)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert any("multi_modal_projector" in n for n in changed) and any("language_model.layers" in n for n in changed)
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for key in ("reward/mean", "reward/cer", "actor/loss", "policy/clip_frac", "kl/loss", "policy/entropy",
                "response/length_mean", "time/rollout", "time/train", "rollout/groups_filtered"):
        assert key in rows[-1], key


def test_adaptive_kl_follows_the_measured_kl_of_the_loss_term(tiny_model, tiny_corpus, tmp_path):
    # KL in the loss, one on-policy update per rollout (no old log-probs): the controller must read the
    # KL the loss measured. Ziegler et al.: coef *= 1 + clip(kl / target - 1, -0.2, 0.2) * n / horizon,
    # here n = 8 sequences = horizon. Step 1: the policy still equals the reference, kl = 0 exactly ->
    # x0.8 (0.1 -> 0.08). Steps 2-3: any real KL is far above a target of 1e-6 -> x1.2 each.
    run_audio_rl(load_rl_config("grpo", None, _overrides(
        tiny_model, tiny_corpus, tmp_path / "r", "save_steps=0", "init_kl_coef=0.1", "use_kl_loss=true",
        "kl_target=1e-6", "kl_horizon=8")))
    rows = read_metrics(tmp_path / "r")
    assert rows[0]["kl/loss"] == 0.0 and rows[1]["kl/loss"] > 1e-4 and rows[2]["kl/loss"] > 1e-4
    assert [r["kl/coef"] for r in rows] == pytest.approx([0.08, 0.096, 0.1152])


def test_rollout_correction_logs_the_engine_trainer_mismatch(tiny_model, tiny_corpus, tmp_path):
    # the HF engine's log-probs travel with the experience; ICEPOP weighs each token by the
    # trainer/engine ratio, which is 1 up to float noise here: nothing is masked, the KL is ~0
    run_audio_rl(load_rl_config("grpo", None, _overrides(
        tiny_model, tiny_corpus, tmp_path / "r", "max_steps=1", "save_steps=0", "algo.rollout_correction=icepop")))
    row = read_metrics(tmp_path / "r")[0]
    assert row["rollout_corr/masked_frac"] == 0.0
    assert row["rollout_corr/weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert abs(row["rollout_corr/kl"]) < 1e-4 and row["rollout_corr/max_abs_log_ratio"] < 1e-3


def test_a_run_with_a_dev_set_logs_the_start_score_as_step_0(tiny_model, tiny_corpus, tmp_path):
    from asr_rl.evaluation.evaluate import run_eval

    dev = tiny_corpus / "dev.jsonl"
    run_audio_rl(load_rl_config("grpo", None, _overrides(tiny_model, tiny_corpus, tmp_path / "r", "max_steps=1",
                                                         "save_steps=0", f"eval_manifest={dev}", "eval_steps=1")))
    start, first = read_metrics(tmp_path / "r")
    assert (start["step"], first["step"]) == (0, 1)
    assert "reward/mean" not in start and "reward/mean" in first  # step 0 is the start's eval, not a step
    expected = run_eval(tiny_model, {"dev": str(dev)}, progress=False)["dev"]
    assert start["eval/cer"] == pytest.approx(expected.cer)
    assert start["eval/keyword_recall"] == pytest.approx(expected.keyword_recall)


def test_killed_after_step_2_resumes_to_the_same_step_3(tiny_model, tiny_corpus, tmp_path):
    straight = tmp_path / "straight"
    run_audio_rl(load_rl_config("grpo", None, _overrides(tiny_model, tiny_corpus, straight)))
    resumed = tmp_path / "resumed"
    cli = [str(Path(sys.executable).parent / "asr-rl"), "train", "grpo",
           *_overrides(tiny_model, tiny_corpus, resumed)]
    fault = [sys.executable, str(Path(__file__).resolve().parents[2] / "fault.py"), "after-step", "2", "--", *cli[1:]]
    killed = subprocess.run(fault, capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert [r["step"] for r in read_metrics(resumed)] == [1, 2]
    done = subprocess.run(cli + ["resume=auto"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = read_metrics(straight), read_metrics(resumed)
    assert [r["step"] for r in b] == [1, 2, 3]
    for key in ("reward/mean", "actor/loss", "policy/entropy", "kl/loss", "response/length_mean"):
        assert b[2][key] == pytest.approx(a[2][key], rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize("extra", [
    ["advantage_estimator=dr_grpo"], ["advantage_estimator=rloo"], ["advantage_estimator=reinforce"],
    ["advantage_estimator=reinforce_baseline"], ["policy_loss=gspo", "loss_agg_mode=seq-mean-token-mean"], ["policy_loss=gspo_token"],
    ["use_kl_loss=false", "init_kl_coef=0.05", "max_epochs=2", "dual_clip=3.0", "eps_clip_low_high=[0.2,0.28]"],
    ["algo.sft_coef=0.5"], ["algo.reward_aggregation=normalize_then_sum", "reward.terms={cer: 1.0, keyword: 0.3}"],
])
def test_every_estimator_and_loss_variant_runs_a_step(tiny_model, tiny_corpus, tmp_path, extra):
    run_audio_rl(load_rl_config("grpo", None, _overrides(tiny_model, tiny_corpus, tmp_path / "r", "max_steps=1",
                                                         "save_steps=0", "rollout.dynamic_filtering=false", *extra)))
    (row,) = read_metrics(tmp_path / "r")
    assert row["actor/optimizer_steps"] >= 1 and row["actor/grad_norm"] > 0
    assert ("actor/sft_ce" in row) == ("algo.sft_coef=0.5" in extra)


def test_ppo_with_critic_trains_policy_and_critic(tiny_model, tiny_corpus, tmp_path):
    from asr_rl.trainer.run.checkpoint import list_checkpoints, load_state

    cfg = load_rl_config("ppo", None, _overrides(tiny_model, tiny_corpus, tmp_path / "ppo", "n_samples_per_prompt=2",
                                                 "micro_train_batch_size=2"))
    assert cfg.algo.advantage_estimator == "gae" and not cfg.algo.use_kl_loss
    run_audio_rl(cfg)
    rows = read_metrics(tmp_path / "ppo")
    assert all("critic/loss" in r and "kl/mean" in r for r in rows)
    states = [load_state(c)["workers"]["critic"]["weights"] for c in list_checkpoints(tmp_path / "ppo")]
    head = [s["value_head.weight"] for s in states]
    assert not torch.equal(head[0], head[-1])  # the critic kept learning between saved steps


def test_grpo_on_a_pretrained_encoder_leaves_it_and_encodes_each_utterance_once(whisper_model, tiny_corpus,
                                                                                tmp_path, monkeypatch):
    """Qwen2-Audio on the frozen Whisper tower: 3 steps x 2 utterances x 4 samples, with old/reference
    log-probs and the update all reusing the encoder's states: one tower pass per distinct utterance."""
    from transformers import Qwen2AudioForConditionalGeneration

    from asr_rl.data.batching import BatchLoader
    from asr_rl.data.manifest import read_manifest
    from tests.models.test_encoder_cache import count_mel_convolutions

    seen = count_mel_convolutions(monkeypatch)
    cfg = load_rl_config("grpo", None, _overrides(whisper_model, tiny_corpus, tmp_path / "run", "save_steps=0",
                                                  "rollout.dynamic_filtering=false", "max_epochs=2"))
    final = run_audio_rl(cfg)
    replay = BatchLoader(read_manifest(cfg.train_manifest), 2, seed=cfg.seed)
    drawn = {u.id for _ in range(3) for u in replay.next_batch().utterances}
    assert sum(seen) == len(drawn) and len(seen) <= 3  # at most one tower call per step
    before = dict(Qwen2AudioForConditionalGeneration.from_pretrained(whisper_model).named_parameters())
    after = dict(Qwen2AudioForConditionalGeneration.from_pretrained(final).named_parameters())
    tower = [n for n in before if n.startswith("model.audio_tower.")]
    assert tower and all(torch.equal(before[n], after[n]) for n in tower)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert "model.multi_modal_projector.linear.weight" in changed and any("language_model.layers" in n for n in changed)
    assert read_metrics(tmp_path / "run")[-1]["kl/loss"] >= 0  # the reference scored the same cached states


def test_the_shared_prefix_step_equals_the_repeated_prompt_step(tiny_model, tiny_corpus, tmp_path):
    """A GRPO step with a KL reference and old log-probs (two epochs, so two optimiser steps),
    micro-batches that split groups: the same samples and rewards, and the same parameters (fp32)
    as with the prompt repeated per sample. At the default actor rate (2e-4): Adam's first steps
    move every weight by about the rate whatever its gradient's size, so a gradient that is 0 on one
    path and float noise (1e-12) on the other moves a weight by up to lr x noise / eps; at the
    e2e tests' 0.01 that is ~6e-6, at 2e-4 well under 1e-6. Adam's eps is 1e-6 (as in the Ray
    test with the reference in the group): at 1e-8 a gradient element that is reduction-order noise
    on both paths (seen: one projector weight, 2.5e-6 apart after two steps) is amplified to the
    size of a real step."""
    finals = [run_audio_rl(load_rl_config("grpo", None, _overrides(
        tiny_model, tiny_corpus, tmp_path / f"shared_{shared}", "max_steps=1", "save_steps=0", "init_kl_coef=0.05",
        "algo.max_epochs=2", "micro_train_batch_size=2", "actor_learning_rate=2e-4", "optim.adam_eps=1e-6",
        f"model.shared_prefix={str(shared).lower()}")))
        for shared in (False, True)]
    before, ref, got = _params(tiny_model), _params(finals[0]), _params(finals[1])
    assert any(not torch.equal(before[n], ref[n]) for n in ref)
    diffs = {n: float((got[n] - ref[n]).abs().max()) for n in ref}
    assert max(diffs.values()) <= 1e-6, {n: d for n, d in diffs.items() if d > 1e-6}
    rows = [read_metrics(tmp_path / f"shared_{s}") for s in (False, True)]
    assert [r["reward/mean"] for r in rows[0]] == [r["reward/mean"] for r in rows[1]]


def test_grpo_runs_from_a_kaldi_folder_in_one_language(tiny_model, tiny_corpus, tmp_path):
    """`train_manifest=` a Kaldi/WeNet folder (wav.scp + text, no utt2lang): `data.language` gives the
    language of every utterance, and the loop runs on it as on the JSONL manifest."""
    from asr_rl.data.manifest import read_manifest

    utts = [u for u in read_manifest(tiny_corpus / "train.jsonl") if u.language == "en"]
    folder = tmp_path / "kaldi"
    folder.mkdir()
    (folder / "wav.scp").write_text("".join(f"{u.id} {u.audio}\n" for u in utts))
    (folder / "text").write_text("".join(f"{u.id} {u.text}\n" for u in utts), encoding="utf-8")
    run_audio_rl(load_rl_config("grpo", None, _overrides(tiny_model, tiny_corpus, tmp_path / "run", "max_steps=1",
                                                         f"train_manifest={folder}", "data.language=en")))
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1]
