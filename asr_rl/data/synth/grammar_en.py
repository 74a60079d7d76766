"""English voice-command grammar: smart-home devices, calls and messages, alarms, timers, numbers.

References are lowercase words without punctuation, and numbers are written as the words spoken
("call anna at five five five one two three four"), so that the reference is exactly what the TTS
engine says and a character-level model has nothing to guess. The vocabulary is kept to a few dozen
names, rooms and devices so that a ~5M-parameter model can learn it from a few thousand utterances.
"""
from __future__ import annotations

import numpy as np

from asr_rl.data.synth.sentence import Sentence, pick

NAMES = ("anna", "ben", "carlos", "david", "emma", "grace", "hannah", "jack", "james", "kevin",
         "laura", "lucy", "maria", "mike", "nina", "oliver", "olivia", "peter", "sarah", "sophie",
         "tom", "zoe")
ROOMS = ("kitchen", "living room", "bedroom", "bathroom", "office", "garage", "hallway",
         "dining room", "basement", "guest room")
DEVICES = ("lights", "lamp", "fan", "heater", "television", "radio", "speaker", "air conditioner",
           "coffee maker", "dishwasher", "washing machine", "humidifier")
MESSAGES = ("dinner is ready", "see you soon", "running late", "call me back", "happy birthday",
            "the door is open")
WHEN = ("", " tomorrow", " tonight", " in the morning", " in the evening")

ONES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
        "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
        "nineteen")
TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")


def number_words(n: int) -> str:
    """0..100 as spoken words, no hyphens ("twenty one"), matching what espeak-ng and flite say."""
    if not 0 <= n <= 100:
        raise ValueError(f"number_words supports 0..100, got {n}")
    if n == 100:
        return "one hundred"
    if n < 20:
        return ONES[n]
    tens, ones = divmod(n, 10)
    return TENS[tens] if ones == 0 else f"{TENS[tens]} {ONES[ones]}"


def digits_words(digits: str) -> str:
    """Read a digit string one digit at a time, the way phone numbers are dictated."""
    return " ".join(ONES[int(d)] for d in digits)


def time_words(hour: int, minute: int) -> str:
    """Clock time on a 12-hour clock: 7:00 -> "seven", 7:05 -> "seven oh five", 7:30 -> "seven thirty"."""
    if minute == 0:
        return number_words(hour)
    if minute < 10:
        return f"{number_words(hour)} oh {ONES[minute]}"
    return f"{number_words(hour)} {number_words(minute)}"


def _phone(rng: np.random.Generator) -> str:
    # Seven digits, not starting with 0 or 1, like a local number.
    first = str(int(rng.integers(2, 10)))
    rest = "".join(str(int(d)) for d in rng.integers(0, 10, size=6))
    return digits_words(first + rest)


def _clock(rng: np.random.Generator) -> str:
    hour = int(rng.integers(1, 13))
    minute = pick(rng, (0, 0, 5, 10, 15, 20, 30, 30, 40, 45, 50, int(rng.integers(1, 60))))
    return time_words(hour, minute)


def _device_power(rng: np.random.Generator) -> Sentence:
    room, device = pick(rng, ROOMS), pick(rng, DEVICES)
    verb, state = pick(rng, ("turn", "switch")), pick(rng, ("on", "off"))
    if rng.random() < 0.5:
        text = f"{verb} {state} the {room} {device}"
    else:
        text = f"{verb} the {room} {device} {state}"
    return Sentence(text, "en", (room, device), text)


def _lights_level(rng: np.random.Generator) -> Sentence:
    room, pct = pick(rng, ROOMS), number_words(10 * int(rng.integers(1, 11)))
    verb = pick(rng, ("dim", "set"))
    text = f"{verb} the {room} lights to {pct} percent"
    return Sentence(text, "en", (room, "lights", pct), text)


def _thermostat(rng: np.random.Generator) -> Sentence:
    room, degrees = pick(rng, ROOMS), number_words(int(rng.integers(16, 29)))
    if rng.random() < 0.5:
        text = f"set the {room} thermostat to {degrees} degrees"
        return Sentence(text, "en", (room, "thermostat", degrees), text)
    text = f"set the temperature in the {room} to {degrees} degrees"
    return Sentence(text, "en", (room, degrees), text)


def _blinds(rng: np.random.Generator) -> Sentence:
    room = pick(rng, ROOMS)
    text = f"{pick(rng, ('open', 'close'))} the {room} blinds"
    return Sentence(text, "en", (room, "blinds"), text)


def _call(rng: np.random.Generator) -> Sentence:
    name = pick(rng, NAMES)
    kind = int(rng.integers(3))
    if kind == 0:
        text = f"call {name}"
        return Sentence(text, "en", (name,), text)
    if kind == 1:
        text = f"call {name} on speaker"
        return Sentence(text, "en", (name,), text)
    phone = _phone(rng)
    text = f"call {name} at {phone}"
    return Sentence(text, "en", (name, phone), text)


def _message(rng: np.random.Generator) -> Sentence:
    name, message = pick(rng, NAMES), pick(rng, MESSAGES)
    if rng.random() < 0.5:
        text = f"send a message to {name} saying {message}"
    else:
        text = f"text {name} {message}"
    return Sentence(text, "en", (name,), text)


def _dial(rng: np.random.Generator) -> Sentence:
    phone = _phone(rng)
    text = f"dial {phone}"
    return Sentence(text, "en", (phone,), text)


def _alarm(rng: np.random.Generator) -> Sentence:
    clock, when = _clock(rng), pick(rng, WHEN)
    template = pick(rng, ("set an alarm for {t}{w}", "wake me up at {t}{w}", "set my alarm to {t}{w}"))
    text = template.format(t=clock, w=when)
    return Sentence(text, "en", (clock,), text)


def _timer(rng: np.random.Generator) -> Sentence:
    unit = pick(rng, ("minute", "minute", "second", "hour"))
    amounts = {"minute": (1, 2, 3, 5, 10, 15, 20, 25, 30, 45), "second": (10, 15, 20, 30, 45, 90),
               "hour": (1, 2, 3)}[unit]
    n = number_words(pick(rng, amounts))
    plural = "" if n == "one" else "s"
    if rng.random() < 0.6:
        text = f"set a timer for {n} {unit}{plural}"
    else:
        text = f"set a {n} {unit} timer"
    return Sentence(text, "en", (n,), text)


def _reminder(rng: np.random.Generator) -> Sentence:
    name, clock = pick(rng, NAMES), _clock(rng)
    text = f"remind me to call {name} at {clock}{pick(rng, WHEN)}"
    return Sentence(text, "en", (name, clock), text)


def _volume(rng: np.random.Generator) -> Sentence:
    level = number_words(int(rng.integers(1, 11)))
    if rng.random() < 0.5:
        text = f"set the volume to {level}"
        return Sentence(text, "en", (level,), text)
    room = pick(rng, ROOMS)
    text = f"set the {room} speaker volume to {level}"
    return Sentence(text, "en", (room, "speaker", level), text)


# Weights: device control and calls are the bulk of real assistant traffic; each still appears often
# enough in 1-2k English utterances to be learned.
TEMPLATES = ((_device_power, 4), (_lights_level, 2), (_thermostat, 2), (_blinds, 1), (_call, 3),
             (_message, 2), (_dial, 2), (_alarm, 3), (_timer, 2), (_reminder, 1), (_volume, 1))


def sample_english(rng: np.random.Generator) -> Sentence:
    """Draw one English command; the same generator state always gives the same sentence."""
    weights = np.array([w for _, w in TEMPLATES], dtype=float)
    template = TEMPLATES[int(rng.choice(len(TEMPLATES), p=weights / weights.sum()))][0]
    return template(rng)
