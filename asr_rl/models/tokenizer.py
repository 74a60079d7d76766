"""An offline character-level tokenizer in Qwen3-ASR's format, trained from manifest texts.

No model hub is reachable here, so a tiny model needs a tokenizer built from its own data. Each
character of the training texts (plus ASCII letters, digits and punctuation, so prompts always
tokenise) is one token; the Qwen3-ASR special tokens are added as special tokens, and each
`language <Name>` prefix the model prints is one added token, so that the language tag costs one
step, not sixteen. The result is a `PreTrainedTokenizerFast` (saved with the `tokenizers` backend),
which `AutoProcessor.from_pretrained` loads with no asr-rl code.

A WordLevel tokenizer would be silently replaced by Qwen2's byte-level pre-tokenizer when loaded as a
qwen2/qwen3 tokenizer (ENVIRONMENT.md), hence a merge-free BPE over characters.
"""
from __future__ import annotations

import json
import string
from collections.abc import Iterable
from pathlib import Path

from asr_rl.data.languages import LANGUAGE_NAMES

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
AUDIO_START, AUDIO_END, AUDIO_PAD, ASR_TEXT = "<|audio_start|>", "<|audio_end|>", "<|audio_pad|>", "<asr_text>"
SPECIAL_TOKENS = [PAD, IM_START, IM_END, AUDIO_START, AUDIO_END, AUDIO_PAD]

# The Qwen3-ASR conversation format: the audio sits in the user turn, the assistant turn holds
# `language <Name><asr_text><transcript>` (the prefill may force the language).
CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' -}}"
    "{%- if m['content'] is string -%}{{- m['content'] -}}"
    "{%- else -%}{%- for c in m['content'] -%}"
    "{%- if c['type'] == 'audio' -%}{{- '<|audio_start|><|audio_pad|><|audio_end|>' -}}"
    "{%- elif c['type'] == 'text' -%}{{- c['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- if not (loop.last and continue_final_message) -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def language_prefix(name: str | None) -> str:
    """The assistant-turn prefix Qwen3-ASR writes before the transcript."""
    return f"language {name}"


TEXT_FIELDS = ("text", "prompt", "label", "chosen", "rejected")


def read_texts(manifests: Iterable[str | Path]) -> list[str]:
    """The text fields of every line of the given JSONL files: manifests (`text`), prompt sets
    (`prompt`, `messages`, `label`) and preference pairs (`chosen`, `rejected`). Lines that fail to
    parse are skipped: `asr-rl data check` is the place that reports them."""
    texts = []
    for path in manifests:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if not isinstance(row, dict):
                    continue
                texts += [row[k] for k in TEXT_FIELDS if isinstance(row.get(k), str)]
                texts += [str(m.get("content", "")) for m in row.get("messages") or [] if isinstance(m, dict)]
    return texts


def build_char_tokenizer(texts: Iterable[str], audio: bool = True):
    """A Qwen3-ASR-compatible `PreTrainedTokenizerFast` whose vocabulary is the characters of `texts`
    (plus printable ASCII), the special tokens and (for audio models) `<asr_text>` and one token per
    `language <Name>` prefix."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = set(string.ascii_letters + string.digits + string.punctuation + " \n")
    for t in texts:
        chars.update(t)
    added = [ASR_TEXT] + [language_prefix(n) for n in [*LANGUAGE_NAMES.values(), "None"]] if audio else []
    vocab_list = SPECIAL_TOKENS + added + sorted(chars)
    vocab = {tok: i for i, tok in enumerate(vocab_list)}
    # No merges: every character is its own token. Characters outside the vocabulary are dropped
    # by the tokenizer, which only matters for training targets, and those built the vocabulary.
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(SPECIAL_TOKENS)
    if added:
        backend.add_tokens(added)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=IM_END, pad_token=PAD, bos_token=None,
        extra_special_tokens={"audio_token": AUDIO_PAD, "audio_bos_token": AUDIO_START,
                              "audio_eos_token": AUDIO_END},
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok
