"""A verifier for the demo's voice-command domain: `reward.file=recipes/rewards/voice_commands.py`.

A reward that needs no transcript (RL on unlabelled audio, `asr-rl eval --verifier`): it judges a
hypothesis by what a valid command looks like, seeing only the hypothesis, the line's `entities`
(the app's contacts, rooms and devices, when the manifest line carries them) and the domain's
lexicon; never the reference or its keywords.

- `command_validity`: the English and Mandarin command grammars as templates (turn on the kitchen
  lights, call a contact at a seven-digit number, set an alarm for a clock time, ...; 把客厅的灯打开,
  拨打五五五一二三四, 七点半叫我起床), their slots filled from the lexicon and the line's entity list;
  1 for a command the grammar holds, partial credit by edits to the nearest one, in words for
  English and in characters for Mandarin (`asr_rl.rewards.grammar.WordGrammar`), 0 for an empty
  transcript. Phone numbers are seven digits not starting with zero or one; times are hours 1-12;
  percentages, degrees and volume levels are in their ranges. None (does not apply) for other
  languages.
- `no_loops`: minus the share of repeated word trigrams (a hallucination loop).
- `speaking_rate`: characters per second of audio within a plausible band (an empty or runaway
  transcript falls outside it).

- `silence`: where the voice-activity detector (silero-vad, asr_rl/rewards/silence.py) hears nobody
  speak, +1 for an empty transcript and -1 for words; there the grammar and the speaking rate do not
  apply (None): an empty answer is the right one. None without the audio (`asr-rl eval --verifier`).

What it cannot see: which of two valid commands was said ("call anna" for "call emma" passes).
With `VOICE_COMMANDS_SCORER=DIR` (an `asr-rl train scorer` folder) in the environment a fourth
function listens: `acoustic`, exp(log P(hypothesis | audio) / frames) under that scorer
(asr_rl/rewards/acoustic.py), weighted `VOICE_COMMANDS_ACOUSTIC_WEIGHT` (default 1).
"""
import os
from functools import lru_cache

from asr_rl.data.synth import grammar_zh as zh
from asr_rl.data.synth.grammar_en import DEVICES, MESSAGES, NAMES, ROOMS, number_words
from asr_rl.rewards.base import Sample
from asr_rl.rewards.grammar import WordGrammar, characters
from asr_rl.rewards.normalize import normalize_text
from asr_rl.rewards.silence import MIN_SPEECH, silence_reward, speech_seconds
from asr_rl.rewards.terms import repeated_ngram_share, speaking_rate_term

TEMPLATES = (
    "{switch} {onoff} the {room} {device}", "{switch} the {room} {device} {onoff}",
    "{dim} the {room} lights to {percent} percent",
    "set the {room} thermostat to {degrees} degrees", "set the temperature in the {room} to {degrees} degrees",
    "{openclose} the {room} blinds",
    "call {name} {call_tail}?", "send a message to {name} saying {message}", "text {name} {message}",
    "dial {phone}",
    "{alarm} {clock} {when}?", "remind me to call {name} at {clock} {when}?",
    "set a timer for {amount} {units}", "set a {amount} {unit} timer",
    "set the volume to {level}", "set the {room} speaker volume to {level}",
)
DIGITS = [number_words(d) for d in range(10)]
SLOTS = {
    "switch": ["turn", "switch"], "onoff": ["on", "off"], "dim": ["dim", "set"], "openclose": ["open", "close"],
    "room": list(ROOMS), "device": list(DEVICES), "name": list(NAMES), "message": list(MESSAGES),
    "percent": [number_words(p) for p in range(10, 101, 10)],
    "degrees": [number_words(d) for d in range(16, 29)],
    "level": [number_words(v) for v in range(1, 11)],
    "call_tail": ["on speaker", "at {phone}"],
    "digit": DIGITS, "first_digit": DIGITS[2:],
    "phone": ["{first_digit} {digit} {digit} {digit} {digit} {digit} {digit}"],
    "hour": [number_words(h) for h in range(1, 13)],
    "minute": [f"oh {d}" for d in DIGITS[1:]] + [number_words(m) for m in range(10, 60)],
    "clock": ["{hour} {minute}?"],
    "alarm": ["set an alarm for", "wake me up at", "set my alarm to"],
    "when": ["tomorrow", "tonight", "in the morning", "in the evening"],
    "amount": [number_words(a) for a in (1, 2, 3, 5, 10, 15, 20, 25, 30, 45, 90)],
    "unit": ["minute", "second", "hour"], "units": ["minute", "minutes", "second", "seconds", "hour", "hours"],
}
# The Mandarin commands, matched by character (numbers as Chinese numerals: 拨打五五五一二三四, 七点半)
TEMPLATES_ZH = (
    "打开{room}的{device}", "关闭{room}的{device}", "把{room}的{device}打开", "把{room}的{device}关掉",
    "把{room}的空调调到{degrees}度", "把{room}的灯调到百分之{percent}",
    "给{name}打电话", "打电话给{name}", "呼叫{name}", "拨打{phone}", "给{name}发消息说{message}", "给{name}发微信",
    "设置{when}?{clock}的闹钟", "{when}?{clock}叫我起床", "定一个{when}?{clock}的闹钟",
    "设置{amount}{unit}的计时器", "设置一个{amount}{unit}的计时器", "倒计时{amount}{unit}",
    "提醒我{when}?{clock}给{name}打电话", "把音量调到{level}",
)
SLOTS_ZH = {
    "room": list(zh.ROOMS), "device": list(zh.DEVICES), "name": list(zh.NAMES), "message": list(zh.MESSAGES),
    "degrees": [zh.zh_number(d) for d in range(16, 29)], "percent": [zh.zh_number(p) for p in range(10, 100, 10)],
    "level": [zh.zh_number(v) for v in range(1, 11)],
    "digit": list(zh.DIGITS), "first_digit": list(zh.DIGITS[2:]), "phone": ["{first_digit}" + "{digit}" * 6],
    "when": [w for w in zh.WHEN if w], "clock": ["{hour}点{minute}?"],
    "hour": [zh.zh_number(h, counting=True) for h in range(1, 13)],
    "minute": ["半"] + [f"零{d}分" for d in zh.DIGITS[1:]] + [zh.zh_number(m) + "分" for m in range(10, 60)],
    "amount": [zh.zh_number(a, counting=True) for a in (1, 2, 3, 5, 10, 15, 20, 30, 45)], "unit": ["分钟", "秒"],
}
# language -> (templates, slots, tokens): the rooms, devices and contacts a line's entity list adds to
GRAMMARS = {"en": (TEMPLATES, SLOTS, str.split), "zh": (TEMPLATES_ZH, SLOTS_ZH, characters)}
_LEXICON = {lang: {*slots["name"], *slots["room"], *slots["device"]} for lang, (_, slots, _) in GRAMMARS.items()}
_GRAMMARS: dict[tuple[str, tuple[str, ...]], WordGrammar] = {}  # one per language and distinct entity list


def _grammar(language: str, entities) -> WordGrammar:
    """The language's grammar, with the line's entity list added to the contacts, rooms and devices
    (a user's own names the lexicon does not know)."""
    extra = tuple(sorted({normalize_text(e) for e in entities or ()} - _LEXICON[language]))
    if (language, extra) not in _GRAMMARS:
        templates, slots, split = GRAMMARS[language]
        more = {k: [*slots[k], *extra] for k in ("name", "room", "device")}
        _GRAMMARS[language, extra] = WordGrammar(templates, {**slots, **more}, split=split)
    return _GRAMMARS[language, extra]


def _speech(audio) -> list[bool]:
    """Whether somebody speaks in each line's audio (True where the audio is not given)."""
    return [a is None or speech_seconds(a) >= MIN_SPEECH for a in audio]


def command_validity(completions, language, entities=None, audio=None, **kwargs):
    entities = entities or [None] * len(completions)
    speech = _speech(audio or [None] * len(completions))
    return [_grammar(lang, ents).score(normalize_text(c)) if lang in GRAMMARS and said else None
            for c, lang, ents, said in zip(completions, language, entities, speech)]


def no_loops(completions, **kwargs):
    return [-repeated_ngram_share(c, 3) for c in completions]


def speaking_rate(completions, duration, audio=None, **kwargs):
    rates = speaking_rate_term([Sample(c, None, duration=d) for c, d in zip(completions, duration)])
    return [r if said else None for r, said in zip(rates, _speech(audio or [None] * len(completions)))]


def silence(completions, audio=None, **kwargs):
    if audio is None:
        return [None] * len(completions)
    return [None if said else silence_reward(c) for c, said in zip(completions, _speech(audio))]


reward_funcs = [command_validity, no_loops, speaking_rate, silence]
reward_weights = [1.0, 0.5, 0.5, 1.0]


@lru_cache(maxsize=1)
def _acoustic_term(folder: str):
    from asr_rl.rewards.acoustic import AcousticTerm

    return AcousticTerm(folder)


def acoustic(completions, audio=None, **kwargs):
    """None where the audio is not given (`asr-rl eval --verifier` judges transcripts alone)."""
    audio = audio or [None] * len(completions)
    heard = [i for i, a in enumerate(audio) if a]
    scores = _acoustic_term(SCORER).scores([Sample(completions[i], None, audio=audio[i]) for i in heard]) if heard else []
    out = [None] * len(completions)
    for i, v in zip(heard, scores):
        out[i] = v
    return out


SCORER = os.environ.get("VOICE_COMMANDS_SCORER")
if SCORER:
    reward_funcs.append(acoustic)
    reward_weights.append(float(os.environ.get("VOICE_COMMANDS_ACOUSTIC_WEIGHT", "1.0")))
