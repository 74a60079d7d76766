"""The judge: text pairs made without audio (data/judge_pairs.py), a reward model trained on them
that scores held-out sentences above their corrupted copies, served over HTTP and training GRPO on
unlabelled audio, and the settings that choose it."""
from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest

from asr_rl.data.judge_pairs import CORRUPTIONS, DomainText, corrupt, judge_prompt, make_judge_pairs, read_domain_text
from asr_rl.rewards.config import RewardConfig
from asr_rl.rewards.pipeline import reward_spec_config

VOCAB = ["call", "anna", "now", "lights", "off", "kitchen"]


def _draw(text, kind, seed=0):
    return corrupt(text, kind, np.random.default_rng(seed), VOCAB)


@pytest.mark.parametrize("seed", range(5))
def test_each_corruption_makes_the_error_it_names(seed):
    words = "turn the kitchen lights off".split()
    sub = _draw(" ".join(words), "substitute", seed).split()
    assert len(sub) == 5 and sum(a != b for a, b in zip(sub, words)) <= 1 and set(sub) - set(words) <= set(VOCAB)
    dele = _draw(" ".join(words), "delete", seed).split()
    assert len(dele) in (3, 4) and all(w in words for w in dele)
    ins = _draw(" ".join(words), "insert", seed).split()
    assert len(ins) == 6 and any(ins[:i] + ins[i + 1:] == words and ins[i] in VOCAB for i in range(6))
    rep = _draw(" ".join(words), "repeat", seed).split()
    assert any(rep == words[:i] + words[i:i + n] * k + words[i + n:]  # a span of 1-3 words said 2-4 times
               for i in range(5) for n in (1, 2, 3) for k in (2, 3, 4) if i + n <= 5)
    trunc = _draw(" ".join(words), "truncate", seed).split()
    assert 1 <= len(trunc) < 5 and trunc == words[:len(trunc)]
    miss = _draw(" ".join(words), "misspell", seed).split()
    diff = [(a, b) for a, b in zip(miss, words) if a != b]
    assert len(miss) == 5 and len(diff) <= 1 and all(len(a) == len(b) for a, b in diff)


def test_a_sentence_without_spaces_is_corrupted_by_character():
    out = corrupt("打开客厅的灯", "delete", np.random.default_rng(1), ["打", "开"])
    assert " " not in out and len(out) in (4, 5) and all(c in "打开客厅的灯" for c in out)


def test_pairs_cycle_the_corruptions_carry_the_context_and_are_seeded():
    sentences = [DomainText("call anna now", ("anna",)), DomainText("turn the kitchen lights off")]
    rows = make_judge_pairs(sentences, per_sentence=6, seed=3)
    assert [r["corruption"] for r in rows] == list(CORRUPTIONS) * 2
    assert all(r["chosen"] != r["rejected"] for r in rows)
    assert rows[0]["prompt"] == judge_prompt(("anna",)) == "Transcript of a spoken request. Words it may use: anna."
    assert rows[6]["prompt"] == "Transcript of a spoken request."
    assert rows == make_judge_pairs(sentences, per_sentence=6, seed=3) != make_judge_pairs(sentences, 6, seed=4)


def test_domain_text_from_a_manifest_or_plain_text_and_a_bad_line_named(tmp_path):
    (tmp_path / "t.txt").write_text("call anna\n\n  lights off \n")
    assert read_domain_text(tmp_path / "t.txt") == [DomainText("call anna"), DomainText("lights off")]
    rows = [{"audio": "a.wav", "text": "call anna", "context": ["anna"]}, {"audio": "b.wav"}, {"text": "lights off"}]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_domain_text(tmp_path / "m.jsonl") == [DomainText("call anna", ("anna",)), DomainText("lights off")]
    (tmp_path / "bad.jsonl").write_text('{"text": "x"}\n{"text": \n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: malformed JSON"):
        read_domain_text(tmp_path / "bad.jsonl")


def test_the_judge_setting_is_checked_at_load(tmp_path):
    with pytest.raises(ValueError, match="reward.judge: .* is not a reward-model folder"):
        RewardConfig(terms=None, judge=str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="set reward.judge, reward.file or reward.remote_url, one of them"):
        RewardConfig(terms=None, judge=str(tmp_path), remote_url="http://127.0.0.1:1")
    with pytest.raises(ValueError, match="reward.term_options does not apply to a reward given by reward.judge"):
        RewardConfig(terms=None, judge=str(tmp_path), term_options={"cer": {}})
    assert reward_spec_config(f"judge:{tmp_path}").judge == str(tmp_path)


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    """A tiny judge trained on pairs from 300 grammar sentences; 100 more held out."""
    from asr_rl.config import load_config
    from asr_rl.data.synth.grammar_en import sample_english
    from asr_rl.models.builders import init_model
    from asr_rl.trainer.configs.preference import RMConfig
    from asr_rl.trainer.recipes.rm import train_rm
    from asr_rl.utils import write_jsonl

    out, rng = tmp_path_factory.mktemp("judge"), np.random.default_rng(0)
    sentences = [DomainText(sample_english(rng).text) for _ in range(400)]
    write_jsonl(out / "pairs.jsonl", make_judge_pairs(sentences[:300], per_sentence=4, seed=0))
    model = init_model("qwen2", "tiny", [out / "pairs.jsonl"], out / "lm")
    final = train_rm(load_config(RMConfig, None, [
        f"pretrain={model}", f"prompt_data={out / 'pairs.jsonl'}", f"output_dir={out / 'rm'}", "max_steps=150",
        "train_batch_size=16", "optim.learning_rate=0.003", "save_steps=0", "logging.tensorboard=false",
        "logging.progress_bar=false"]))
    return final, make_judge_pairs(sentences[300:], per_sentence=2, seed=1)


@pytest.mark.slow
def test_a_trained_judge_prefers_held_out_sentences_to_their_corrupted_copies(judge):
    from asr_rl.rewards.base import Sample
    from asr_rl.rewards.pipeline import load_reward_spec

    folder, held_out = judge
    reward = load_reward_spec(f"judge:{folder}")
    chosen = reward([Sample(r["chosen"], None) for r in held_out]).rewards
    rejected = reward([Sample(r["rejected"], None) for r in held_out]).rewards
    wins = defaultdict(list)
    for row, c, r in zip(held_out, chosen, rejected):
        wins[row["corruption"]].append(c > r)
    assert np.mean([w for v in wins.values() for w in v]) >= 0.65  # 200 pairs; chance is 0.5; ~0.73 measured
    assert np.mean(wins["repeat"] + wins["truncate"]) >= 0.75  # the loop and the cut-off are the easiest


@pytest.mark.slow
def test_grpo_trains_on_unlabelled_audio_under_a_served_judge(judge, tiny_model, tiny_corpus, tmp_path):
    import torch

    from asr_rl.trainer.recipes.rl import load_rl_config, run_audio_rl
    from asr_rl.trainer.run.metrics import read_metrics
    from tests.conftest import serve_reward
    from tests.trainer.driver.test_grpo_e2e import _overrides
    from tests.trainer.driver.test_unlabelled_e2e import _params, _pool

    pool = _pool(tiny_corpus, tmp_path / "pool")
    with serve_reward(f"judge:{judge[0]}") as url:
        final = run_audio_rl(load_rl_config("grpo", None, _overrides(
            tiny_model, pool, tmp_path / "run", "max_steps=2", f"reward.remote_url={url}", "reward.remote_token=s3cret",
            "reward.terms=null")))
    before, after = _params(tiny_model), _params(final)
    assert any(not torch.equal(before[n], after[n]) for n in before if "language_model.layers" in n)
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["reward/std"] > 0  # the judge told samples apart


def test_judge_pairs_from_a_pool_without_transcripts_names_the_file_and_why(tmp_path, capsys):
    from asr_rl.cli import main

    pool = tmp_path / "pool.jsonl"
    pool.write_text('{"id": "a", "audio": "a.wav"}\n{"id": "b", "audio": "b.wav"}\n')
    assert main(["data", "judge-pairs", "--text", str(pool), "--out", str(tmp_path / "p.jsonl")]) == 2
    err = capsys.readouterr().err
    assert f"{pool}: none of its 2 lines has a `text` (unlabelled audio?)" in err and "one sentence a line" in err
    assert not (tmp_path / "p.jsonl").exists()


@pytest.mark.slow
def test_the_judge_as_a_term_beside_others_is_the_sigmoid_of_its_score(judge):
    import math

    from asr_rl.rewards.base import RewardError, Sample
    from asr_rl.rewards.config import RewardConfig
    from asr_rl.rewards.pipeline import load_reward_spec, make_reward
    from asr_rl.rewards.terms import plausibility_term

    folder, held_out = judge
    samples = [Sample(held_out[0]["chosen"], None, "en"), Sample(held_out[0]["rejected"], None, "en")]
    alone = load_reward_spec(f"judge:{folder}")(samples).rewards
    both = make_reward(RewardConfig(terms={"plausibility": 1.0, "repetition": 0.5},
                                    term_options={"plausibility": {"model": str(folder)}}))(samples)
    assert both.terms["plausibility"] == pytest.approx([1 / (1 + math.exp(-r)) for r in alone])
    assert both.rewards == pytest.approx([j + 0.5 * r for j, r in zip(both.terms["plausibility"], both.terms["repetition"])])
    with pytest.raises(RewardError, match=r"the plausibility term needs its judge: reward.term_options=\{plausibility: \{model: DIR\}\}"):
        plausibility_term(samples)
