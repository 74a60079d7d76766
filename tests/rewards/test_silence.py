"""The `silence` term: silero-vad on real synthesised speech and on the non-speech kinds, and the
demo's verifier leaving the grammar out where nobody speaks."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from asr_rl.data.synth import tts
from asr_rl.data.synth.nonspeech import KINDS, render_clip
from asr_rl.data.synth.voices import Voice
from asr_rl.rewards.base import RewardError, Sample
from asr_rl.rewards.combine import WeightedReward
from asr_rl.rewards.plugins import load_reward_file
from asr_rl.rewards.silence import silence_reward, speech_seconds

VERIFIER = Path(__file__).resolve().parents[2] / "recipes" / "rewards" / "voice_commands.py"


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, str]:
    """Speech in both languages (espeak-ng) and one clip of each non-speech kind, telephone or not."""
    folder = tmp_path_factory.mktemp("vad")
    out = {}
    for name, voice, text in (("speech_en", Voice("espeak", "en-029", "m3", "160"), "call anna at five five five"),
                              ("speech_zh", Voice("espeak", "cmn-latn-pinyin", "f2", "170"), "da3 kai1 ke4 ting1 de5 deng1")):
        out[name] = str(folder / f"{name}.wav")
        sf.write(out[name], 0.5 * tts.synthesize(voice, text), tts.SAMPLE_RATE)
    for i in range(2 * len(KINDS)):  # the second round goes through the telephone line
        audio, extra = render_clip(i, np.random.default_rng(i), tts.SAMPLE_RATE)
        out[f"{extra['kind']}_{extra['channel']}"] = str(folder / f"ns{i}.wav")
        sf.write(out[f"{extra['kind']}_{extra['channel']}"], audio, tts.SAMPLE_RATE)
    return out


def test_the_detector_hears_speech_and_nothing_in_non_speech(clips):
    heard = {name: speech_seconds(path) for name, path in clips.items()}
    assert heard["speech_en"] > 1.0 and heard["speech_zh"] > 1.0
    assert {n: s for n, s in heard.items() if not n.startswith("speech") and s >= 0.3} == {}


def test_empty_is_rewarded_where_nobody_speaks_and_the_term_is_neutral_on_speech(clips):
    reward = WeightedReward({"silence": 1.0})
    rows = [("speech_en", "call anna"), ("speech_en", ""), ("speech_zh", "打开客厅的灯"),
            ("silence_clean", ""), ("silence_clean", "thank you"), ("chord_telephone", ""), ("hum_clean", "mm mm")]
    out = reward([Sample(h, None, "en", audio=clips[a]) for a, h in rows])
    assert out.rewards == [0.0, 0.0, 0.0, 1.0, -1.0, 1.0, -1.0]


def test_a_sample_without_audio_is_named():
    with pytest.raises(RewardError, match="sample 1 .*'u2'.* carries none"):
        WeightedReward({"silence": 1.0})([Sample("", None, audio="x.wav", prompt="u1"), Sample("", None, prompt="u2")])


def test_the_verifier_asks_for_nothing_but_silence_where_nobody_speaks(clips):
    reward = load_reward_file(VERIFIER)
    samples = [Sample("", None, "en", duration=2.0, audio=clips["pink_noise_telephone"]),
               Sample("call anna", None, "en", duration=2.0, audio=clips["pink_noise_telephone"]),
               Sample("call anna", None, "en", duration=2.0, audio=clips["speech_en"]),
               Sample("", None, "en", duration=2.0, audio=clips["speech_en"])]
    out = reward(samples)
    assert out.terms["command_validity"] == [None, None, 1.0, 0.0]
    assert out.terms["silence"] == [1.0, -1.0, None, None]
    # the grammar and the speaking rate would score the empty answer worst; where nobody speaks it is best
    assert out.rewards[0] > out.rewards[1] and out.rewards[2] > out.rewards[3]
    # without the audio (eval --verifier) the line is judged as before
    assert reward([Sample("", None, "en", duration=2.0)]).terms["silence"] == [None]


def test_graded_the_penalty_grows_with_the_words_so_a_group_without_an_empty_sample_still_ranks(clips):
    # n words -> -n / (n + 1); a Han character is a word; punctuation and case do not count
    assert silence_reward("", graded=True) == 1.0 and silence_reward(" . ", graded=True) == 1.0
    assert silence_reward("Thank you.", graded=True) == pytest.approx(-2 / 3)
    assert silence_reward("嗯", graded=True) == -0.5 and silence_reward("谢谢 you", graded=True) == pytest.approx(-3 / 4)
    loop = " ".join(["thank you"] * 10)
    assert silence_reward(loop, graded=True) == pytest.approx(-20 / 21)
    assert silence_reward(loop, graded=True) < silence_reward("you", graded=True)
    assert silence_reward(loop) == silence_reward("you") == -1.0  # flat, the default
    # as a term option, through the reward
    reward = WeightedReward({"silence": 1.0}, {"silence": {"graded": True}})
    out = reward([Sample(h, None, "en", audio=clips["hum_clean"]) for h in ("", "mm", "mm mm mm")])
    assert out.rewards == pytest.approx([1.0, -0.5, -0.75])
