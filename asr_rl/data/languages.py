"""Language codes a manifest may use, with the names Qwen3-ASR prints in its output prefix
(`language English<asr_text>...`). The same table as transformers' Qwen3-ASR processor, kept here so
that the data layer does not import a model."""
from __future__ import annotations

LANGUAGE_NAMES: dict[str, str] = {
    "ar": "Arabic", "yue": "Cantonese", "zh": "Chinese", "cs": "Czech", "da": "Danish",
    "nl": "Dutch", "en": "English", "fil": "Filipino", "fi": "Finnish", "fr": "French",
    "de": "German", "el": "Greek", "hi": "Hindi", "hu": "Hungarian", "id": "Indonesian",
    "it": "Italian", "ja": "Japanese", "ko": "Korean", "mk": "Macedonian", "ms": "Malay",
    "fa": "Persian", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian",
    "es": "Spanish", "sv": "Swedish", "th": "Thai", "tr": "Turkish", "vi": "Vietnamese",
}
NAME_TO_CODE: dict[str, str] = {name.lower(): code for code, name in LANGUAGE_NAMES.items()}

# Languages written without spaces between words: scored by CER only (DESIGN: CER for zh).
CHARACTER_SCORED = frozenset({"zh", "yue", "ja", "th"})


def language_name(code: str) -> str:
    """`zh` -> `Chinese`; raises ValueError listing valid codes for an unknown one."""
    try:
        return LANGUAGE_NAMES[code]
    except KeyError:
        raise ValueError(f"unknown language code {code!r}; valid codes: {', '.join(sorted(LANGUAGE_NAMES))}") from None


def language_code(name_or_code: str | None) -> str | None:
    """Accepts `English`, `english` or `en`; returns the code, or None when unrecognised."""
    if name_or_code is None:
        return None
    key = name_or_code.strip()
    if key in LANGUAGE_NAMES:
        return key
    return NAME_TO_CODE.get(key.lower())
