"""Qwen's released byte-level BPE, offline (issue 29, first step).

The vocabulary of Qwen2 / Qwen2.5 / Qwen3 (and so of Qwen2-Audio, Qwen2.5-Omni and Qwen3-ASR) is
151,643 byte-level BPE ranks, the same file Qwen's tiktoken tokenizer reads. No hub here: the PyPI
package `dashscope` ships that file as `dashscope/resources/qwen.tiktoken`; `make install` installs
the package without its dependencies (`pip install --no-deps dashscope`) only for the file, which is
found without importing the package (its own imports need what --no-deps leaves out). transformers'
`TikTokenConverter` with Qwen2's pre-tokenizer pattern turns the ranks into the fast tokenizer the
released `tokenizer.json` holds: "Hello, world" -> [9707, 11, 1879], "你好" -> [108386], digits
one token each (" 7:30" -> [220, 22, 25, 18, 15]).

The special tokens then take their released ids (151643 `<|endoftext|>`, 151644 `<|im_start|>`,
151645 `<|im_end|>`, each family's audio tokens, ...): a family's `TokenizerSpec.ids`. Ids between
them that the family does not name (the vision tokens of a speech-only family, ...) are filled with
placeholders that nothing produces, so every named token sits at its released id.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from asr_rl.models.tokenizer import TokenizerSpec

QWEN_RANKS = 151643
# Qwen2's pre-tokenizer (its tokenizer.json): one digit a token, unlike tiktoken's cl100k \p{N}{1,3}
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")


def ranks_file() -> Path:
    """dashscope's `qwen.tiktoken`, located without importing dashscope."""
    found = importlib.util.find_spec("dashscope")
    path = Path(next(iter(found.submodule_search_locations))) / "resources" / "qwen.tiktoken" if found else None
    if path is None or not path.is_file():
        raise FileNotFoundError("Qwen's BPE ranks (dashscope/resources/qwen.tiktoken) are not installed: run `make "
                                "install`, or `pip install --no-deps dashscope` (only its file is used)")
    return path


def build_qwen_tokenizer(spec: TokenizerSpec):
    """A `PreTrainedTokenizerFast` with Qwen's released BPE and `spec`'s special tokens at their ids
    (`spec.ids`, all >= 151643), its chat template and named special tokens. `spec.added` (a
    character tokenizer's one-id tags such as `language English`) is not added: the released
    tokenizer writes those as ordinary BPE text."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    missing = [t for t in spec.special if t not in spec.ids]
    if missing or min(spec.ids.values(), default=QWEN_RANKS) < QWEN_RANKS:
        raise ValueError(f"Qwen's BPE takes special tokens at their released ids (>= {QWEN_RANKS}); "
                         f"without one: {missing}")
    backend = TikTokenConverter(vocab_file=str(ranks_file()), pattern=QWEN2_PATTERN).converted()
    at = {i: tok for tok, i in spec.ids.items()}
    specials = [at.get(i, f"<|reserved_{i}|>") for i in range(QWEN_RANKS, max(at) + 1)]
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=spec.eos, pad_token=spec.pad, bos_token=None,
                                  extra_special_tokens=dict(spec.extra_special))
    tok.chat_template = spec.chat_template
    for t, i in spec.ids.items():
        if tok.convert_tokens_to_ids(t) != i:
            raise RuntimeError(f"{t} landed at id {tok.convert_tokens_to_ids(t)}, not its released {i}")
    return tok


__all__ = ["QWEN2_PATTERN", "QWEN_RANKS", "build_qwen_tokenizer", "ranks_file"]
