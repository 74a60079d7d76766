"""The acoustic scorer and the `acoustic` reward term: the CTC likelihood by hand, a scorer trained
on real synthesised speech that hears a wrong word where a grammar cannot, and the term served."""
from __future__ import annotations

from pathlib import Path

import math

import httpx
import pytest
import torch

from asr_rl.rewards.acoustic_scorer import AcousticScorer, source_chars
from asr_rl.rewards.base import Sample


def test_log_likelihood_sums_every_alignment_by_hand():
    # labels {a, b} + blank, uniform outputs (a zero head), 3 frames x 1 slot. The paths of length 3
    # over {_, a, b} that collapse to "a" are a contiguous block of a's among blanks: a__ _a_ __a aa_
    # _aa aaa, 6 of 27; "" is ___ only (1 of 27); "ab" needs both: a_b ab_ _ab aab abb ... = a-block
    # then b-block with optional blanks: ab_, a_b, _ab, aab, abb = 5 of 27.
    s = AcousticScorer(4, ["a", "b"], hidden=4, layers=1, labels_per_frame=1)
    with torch.no_grad():
        s.head.weight.zero_()
        s.head.bias.zero_()
    states = [torch.randn(3, 4)]
    ll = s.log_likelihood(states, ["a", "", "ab", "abab", "c"], [0, 0, 0, 0, 0])
    assert ll[:3].tolist() == pytest.approx([math.log(6 / 27), math.log(1 / 27), math.log(5 / 27)], rel=1e-5)
    assert ll[3] == float("-inf")  # 4 labels need at least 5 slots with the repeat: not in 3
    assert ll[4] == float("-inf")  # "c" has no label
    assert source_chars(["Call Anna!", "打开 灯"]) == sorted(set("call anna") | set("打开灯"))


@pytest.mark.slow
def test_a_trained_scorer_hears_the_wrong_name_and_is_served(whisper_model, tiny_corpus, tmp_path):
    """Trained on the corpus's transcripts (the frozen Whisper encoder's states), it ranks each English
    transcript above the same sentence with one word swapped for another of the corpus (a sentence a
    command grammar passes just as well) and above an empty one; served by `reward serve`."""
    from asr_rl.config import load_config
    from asr_rl.data.manifest import read_manifest
    from asr_rl.rewards.acoustic import AcousticTerm
    from asr_rl.trainer.recipes.scorer import ScorerConfig, train_scorer
    from tests.conftest import serve_reward

    cfg = load_config(ScorerConfig, None, [f"pretrain={whisper_model}", f"train_manifest={tiny_corpus / 'train.jsonl'}",
                                           f"output_dir={tmp_path / 'scorer'}", "max_steps=250", "train_batch_size=4",
                                           "augment.noise_prob=0", "logging.tensorboard=false", "logging.progress_bar=false",
                                           f"eval_manifest={tiny_corpus / 'train.jsonl'}", "eval_steps=250"])
    folder = train_scorer(cfg)
    term = AcousticTerm(folder)
    english = [u for u in read_manifest(tiny_corpus / "train.jsonl") if u.language == "en"]
    words = sorted({w for u in english for w in u.text.lower().split()})
    samples, wrong = [], []
    for g, u in enumerate(english):
        ref = u.text.lower().split()
        k = max(range(len(ref)), key=lambda i: len(ref[i]))  # the longest word: a name or a number word
        swapped = " ".join(ref[:k] + [next(w for w in words if w != ref[k] and len(w) >= 3)] + ref[k + 1:])
        for hyp in (u.text, swapped, ""):
            samples.append(Sample(hypothesis=hyp, reference=None, audio=str(u.audio), group_id=g, prompt=u.id))
        wrong.append(swapped)
    scores = term.scores(samples)
    right, swapped, empty = scores[0::3], scores[1::3], scores[2::3]
    assert all(0.0 <= x <= 1.0 for x in scores)
    assert all(r > s for r, s in zip(right, swapped)), list(zip(right, swapped, wrong))
    assert all(r > e for r, e in zip(right, empty))
    # the states are kept: scored again, nothing is encoded; with a cache folder, a new term reads them
    from tests.models.test_encoder_cache import count_encoder_rows

    seen = count_encoder_rows(term.encoder)
    assert term.scores(samples) == scores and sum(seen) == 0
    filled = AcousticTerm(folder, encoder_cache=tmp_path / "cache")
    assert filled.scores(samples) == pytest.approx(scores, abs=1e-6)
    again = AcousticTerm(folder, encoder_cache=tmp_path / "cache")
    seen = count_encoder_rows(again.encoder)
    assert again.scores(samples) == pytest.approx(scores, abs=1e-6) and sum(seen) == 0
    # the demo's verifier with the scorer beside it: the acoustic function listens where the audio is
    # given, and does not apply where it is not (`eval --verifier` judges transcripts alone)
    import os

    from asr_rl.rewards.plugins import load_reward_file

    os.environ["VOICE_COMMANDS_SCORER"] = str(folder)
    try:
        verifier = load_reward_file(Path(__file__).resolve().parents[2] / "recipes/rewards/voice_commands.py")
    finally:
        del os.environ["VOICE_COMMANDS_SCORER"]
    out = verifier([samples[0], Sample(samples[0].hypothesis, None, "en", duration=2.0)])
    assert out.terms["acoustic"] == [pytest.approx(scores[0], abs=1e-6), None]
    with serve_reward(f"acoustic:{folder}", token="t") as url:
        body = {"query": [s.hypothesis for s in samples[:3]], "prompts": [s.prompt for s in samples[:3]],
                "labels": [None] * 3, "samples": [{"hypothesis": s.hypothesis, "reference": None, "audio": s.audio,
                                                   "prompt": s.prompt, "group_id": s.group_id} for s in samples[:3]]}
        got = httpx.post(f"{url}/get_reward", json=body, headers={"Authorization": "Bearer t"}, timeout=60).json()
    assert got["rewards"] == pytest.approx(scores[:3], rel=1e-4)


def test_the_term_names_what_it_lacks(tmp_path):
    from asr_rl.rewards.base import RewardError
    from asr_rl.rewards.terms import get_term

    with pytest.raises(RewardError, match="needs its scorer folder"):
        get_term("acoustic")([Sample("call anna", None, audio="x.wav")])
    with pytest.raises(FileNotFoundError, match="not an acoustic scorer folder"):
        AcousticScorer.load(tmp_path)


def test_a_scorer_file_cut_short_is_named_with_what_to_do(tmp_path):
    AcousticScorer(8, list("abc"), hidden=8, layers=1).save(tmp_path / "s")
    weights = tmp_path / "s" / "scorer.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError, match=rf"{weights} cannot be read .*cut short or damaged; train the scorer again"):
        AcousticScorer.load(tmp_path / "s")


def _scorer_cfg(model, tiny_corpus, tmp_path, *extra):
    from asr_rl.config import load_config
    from asr_rl.trainer.recipes.scorer import ScorerConfig

    return load_config(ScorerConfig, None, [f"pretrain={model}", f"train_manifest={tiny_corpus / 'train.jsonl'}",
                                            f"output_dir={tmp_path / 'scorer'}", "max_steps=2", "train_batch_size=4",
                                            "logging.tensorboard=false", "logging.progress_bar=false", *extra])


def test_a_dev_set_without_words_or_transcripts_is_refused_before_training(whisper_model, tiny_corpus, tmp_path):
    from tests.conftest import write_manifest, write_tone
    from asr_rl.trainer.recipes.scorer import train_scorer

    write_tone(tmp_path / "a.wav")
    silent = write_manifest(tmp_path / "silent.jsonl", [{"id": f"s{i}", "audio": "a.wav", "text": "", "language": "en"}
                                                        for i in range(3)])
    with pytest.raises(ValueError, match=rf"eval_manifest={silent}: none of its 3 lines has a transcript with words"):
        train_scorer(_scorer_cfg(whisper_model, tiny_corpus, tmp_path, f"eval_manifest={silent}"))
    unlabelled = write_manifest(tmp_path / "u.jsonl", [{"id": "a", "audio": "a.wav", "text": "call anna"},
                                                       {"id": "b", "audio": "a.wav"}])
    with pytest.raises(ValueError, match=rf"{unlabelled}:2.*the scorer's dev CER"):
        train_scorer(_scorer_cfg(whisper_model, tiny_corpus, tmp_path, f"eval_manifest={unlabelled}"))
    assert not (tmp_path / "scorer").exists()  # refused before the run folder, let alone any training


def test_an_encoder_no_training_ever_touched_is_refused(tiny_model, tiny_corpus, tmp_path):
    """A fresh `model init` with a random encoder: SFT records the steps it trains one (its CTC), and
    a scorer listens only through an encoder something trained."""
    from asr_rl.config import ConfigError
    from asr_rl.models.builders import read_info
    from asr_rl.trainer.recipes.scorer import check_encoder_trained

    assert read_info(tiny_model)["encoder"] == "random" and "encoder_steps" not in read_info(tiny_model)
    with pytest.raises(ConfigError, match=r"its audio encoder is `model init`'s random one, never trained"):
        check_encoder_trained(_scorer_cfg(tiny_model, tiny_corpus, tmp_path))
    check_encoder_trained(_scorer_cfg(tiny_model, tiny_corpus, tmp_path, "encoder_trained=true"))  # vouched for


def test_the_conv_body_reads_each_utterance_as_alone_and_reloads(tmp_path):
    """A padded batch gives each utterance the log-likelihood it gets alone (frames past its length
    never reach it), a step moves the conv weights, and the folder reloads to the same scores; a
    folder saved before bodies existed loads as the LSTM it is."""
    torch.manual_seed(0)
    s = AcousticScorer(6, list("abc"), hidden=8, layers=3, labels_per_frame=2, body="conv")
    short, long = torch.randn(4, 6), torch.randn(11, 6)
    together = s.log_likelihood([short, long], ["ab", "abc"], [0, 1])
    alone = [s.log_likelihood([x], [t], [0])[0] for x, t in ((short, "ab"), (long, "abc"))]
    assert together.tolist() == pytest.approx([a.item() for a in alone], abs=1e-5)
    before = s.conv.convs[0].weight.detach().clone()
    opt = torch.optim.SGD(s.parameters(), lr=0.1)
    s.loss([short, long], ["ab", "abc"]).backward()
    opt.step()
    assert not torch.equal(before, s.conv.convs[0].weight)
    s.save(tmp_path / "conv")
    again = AcousticScorer.load(tmp_path / "conv")
    assert again.body == "conv"
    assert again.log_likelihood([short], ["ab"], [0]).tolist() == pytest.approx(
        s.eval().log_likelihood([short], ["ab"], [0]).tolist(), abs=1e-6)
    old = AcousticScorer(6, list("abc"), hidden=8, layers=1)
    old.config.pop("body")  # what an earlier version wrote
    old.save(tmp_path / "lstm")
    assert AcousticScorer.load(tmp_path / "lstm").body == "lstm"
    with pytest.raises(ValueError, match="body must be one of lstm, conv, got 'gru'"):
        AcousticScorer(6, list("abc"), body="gru")
