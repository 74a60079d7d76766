"""Synthetic speakers and the fixed train/dev/test split of them.

A voice is (engine, accent, variant, speed, pitch), written as an id such as
`espeak:en-gb+m3:s160:p45` or `flite:slt:d1.10`. A model trained on the corpus must generalise to
voices it never heard, so the split is by timbre, not by utterance: the espeak-ng variants (formant
and pitch-range presets) and flite voices are partitioned into disjoint groups for train, dev and
test, which makes every dev/test voice id impossible in train whatever the seed. Two English accents
are held out of every group except `accent`, the harder test set, and the target domain's groups
(`target_pool`, `target_dev`, `target_test`: synth/target.py), whose variants no other group uses.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from asr_rl.data.synth.sentence import pick

EN_ACCENTS = ("en-us", "en-us-nyc", "en-gb", "en-gb-x-rp", "en-gb-x-gbclan", "en-gb-x-gbcwmd")
HELD_OUT_ACCENTS = ("en-029", "en-gb-scotland")
ZH_ACCENT = "cmn-latn-pinyin"

# espeak-ng variant names are case sensitive and an unknown one silently falls back to the default
# voice; each name below was checked to change the audio. klatt6 is left out: it renders like klatt.
VARIANT_GROUPS = {
    "train": ("m1", "m2", "m3", "m4", "m5", "m6", "f1", "f2", "f3", "klatt", "klatt2", "klatt3",
              "adam", "paul", "steph", "linda", "john", "max", "robert"),
    "dev": ("m7", "f4", "klatt4", "david", "Annie"),
    "test": ("m8", "f5", "klatt5", "edward", "belinda", "Andy"),
}
VARIANT_GROUPS["accent"] = VARIANT_GROUPS["test"]
# The target domain: variants no source group uses, checked the same way (with en-029 and
# en-gb-scotland, every name gave bytes unlike the default voice's and every other variant's, except
# caleb, which renders exactly like klatt and is left out). Near relatives stay in one group, so that
# dev and test voices are new timbres: Mario/Michael/gustave/marcelo and Gene/Gene2 (pool), iven/iven2
# (dev), Hugo/Henrique/michel/miguel/Diogo/anika and Storm/victor/Denis (test); steph2/steph3 and
# edward2 are left out as relatives of steph and edward.
VARIANT_GROUPS["target_pool"] = ("Alex", "Mike", "Gene", "Gene2", "Jacky", "Lee", "Mario", "Michael", "gustave",
                                 "marcelo", "antonio", "quincy", "rob", "Andrea", "Alicia", "aunty")
VARIANT_GROUPS["target_dev"] = ("iven", "iven2", "ed", "travis", "Nguyen", "grandma", "Marco")
VARIANT_GROUPS["target_test"] = ("Hugo", "Henrique", "michel", "miguel", "Diogo", "anika", "Storm", "victor",
                                 "Denis", "pedro", "sandro", "shelby", "grandpa")
TARGET_GROUPS = ("target_pool", "target_dev", "target_test")

# flite voices are other speakers recorded for CMU, English only; awb is Scottish, so it is held out
# with the Scottish accent. flite has no fifth voice, so the target groups have none.
FLITE_GROUPS = {"train": ("kal16", "rms"), "dev": (), "test": ("slt",), "accent": ("awb",),
                **{group: () for group in TARGET_GROUPS}}
FLITE_ACCENTS = {"kal16": "en-us", "rms": "en-us", "slt": "en-us", "awb": "en-gb-scotland"}
FLITE_SHARE = 0.15  # of English utterances, where the group has flite voices

# espeak-ng "en-gb" ignores +variant (it resolves to an mbrola entry); "en" is the same voice file
# (gmw/en) and honours variants.
ESPEAK_VOICE_NAME = {"en-gb": "en"}

EN_SPEEDS = tuple(range(140, 201, 10))  # words per minute
ZH_SPEEDS = tuple(range(150, 211, 10))  # one pinyin syllable counts as a word
PITCHES = tuple(range(30, 71, 5))  # espeak-ng's 0..99 scale, 50 is the variant's own pitch
FLITE_STRETCH = ("0.90", "1.00", "1.10", "1.20")  # duration_stretch: >1 is slower

GROUPS = tuple(VARIANT_GROUPS)


@dataclass(frozen=True)
class Voice:
    """One synthetic speaker. `variant` is an espeak-ng variant or a flite voice name."""

    engine: str  # "espeak" | "flite"
    accent: str
    variant: str
    speed: str  # espeak: words per minute; flite: duration stretch
    pitch: int = 50

    @property
    def id(self) -> str:
        if self.engine == "flite":
            return f"flite:{self.variant}:d{self.speed}"
        return f"espeak:{self.accent}+{self.variant}:s{self.speed}:p{self.pitch}"

    @property
    def espeak_name(self) -> str:
        """The -v argument for espeak-ng."""
        return f"{ESPEAK_VOICE_NAME.get(self.accent, self.accent)}+{self.variant}"


def accents_for(group: str, language: str) -> tuple[str, ...]:
    """Accents a group draws from; `accent` and the target groups: the held-out English accents only."""
    _check_group(group)
    if language == "zh":
        return (ZH_ACCENT,)
    return HELD_OUT_ACCENTS if group == "accent" or group in TARGET_GROUPS else EN_ACCENTS


def sample_voice(group: str, language: str, rng: np.random.Generator) -> Voice:
    """Draw a voice for one utterance from `group` (one of GROUPS)."""
    _check_group(group)
    flite_voices = FLITE_GROUPS[group] if language == "en" else ()
    if flite_voices and rng.random() < FLITE_SHARE:
        name = pick(rng, flite_voices)
        return Voice("flite", FLITE_ACCENTS[name], name, pick(rng, FLITE_STRETCH))
    accent = pick(rng, accents_for(group, language))
    speeds = ZH_SPEEDS if language == "zh" else EN_SPEEDS
    variant = pick(rng, VARIANT_GROUPS[group])
    return Voice("espeak", accent, variant, str(pick(rng, speeds)), int(pick(rng, PITCHES)))


def all_voice_ids(group: str, language: str) -> set[str]:
    """Every voice id `sample_voice(group, language, ...)` can return (used to prove disjointness)."""
    ids = {Voice("flite", FLITE_ACCENTS[n], n, s).id
           for n in (FLITE_GROUPS[group] if language == "en" else ()) for s in FLITE_STRETCH}
    speeds = ZH_SPEEDS if language == "zh" else EN_SPEEDS
    ids |= {Voice("espeak", a, v, str(s), p).id for a in accents_for(group, language)
            for v in VARIANT_GROUPS[group] for s in speeds for p in PITCHES}
    return ids


def _check_group(group: str) -> None:
    if group not in VARIANT_GROUPS:
        raise ValueError(f"unknown voice group {group!r}; valid: {', '.join(GROUPS)}")
