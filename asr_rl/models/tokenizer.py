"""An offline character-level tokenizer in a model family's format, trained from manifest texts.

No model hub is reachable here, so a tiny model needs a tokenizer built from its own data. Each
character of the training texts (plus ASCII letters, digits and punctuation, so prompts always
tokenise) is one token; the family's special tokens (`TokenizerSpec`, given by its
`AudioLLMSpec`) are added as special tokens, and the tags the model prints (`language English`,
`<|en|>`) as one added token each, so that a tag costs one step, not sixteen. The result is a
`PreTrainedTokenizerFast` (saved with the `tokenizers` backend), which `AutoProcessor.from_pretrained` loads with no asr-rl code.

A WordLevel tokenizer would be silently replaced by Qwen2's byte-level pre-tokenizer when loaded as a
qwen2/qwen3 tokenizer, hence a merge-free BPE over characters.
"""
from __future__ import annotations

import json
import string
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
# ChatML, as Qwen's text models render a conversation (the text RLHF path's default).
CHATML_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


@dataclass(frozen=True)
class TokenizerSpec:
    """The special tokens and chat template a model family's tokenizer needs.

    Attributes:
        special: special tokens (never split, skipped when decoding plain text), in id order.
        added: ordinary added tokens, each one id (e.g. `language English`, `<|en|>`), so that a
            character-level model pays one step for a tag, not sixteen.
        extra_special: named special tokens the processor looks up (`audio_token`, ...).
        chat_template: the family's Jinja chat template (None for plain text LMs).
        pad: padding token; eos: end-of-turn token.
        ids: tokens at fixed ids (a released tokenizer's, e.g. Qwen's `<|im_end|>` = 151645); the
            characters take the first ids and unreachable placeholders fill the gap up to them.
    """

    special: tuple[str, ...] = (PAD, IM_START, IM_END)
    added: tuple[str, ...] = ()
    extra_special: dict = field(default_factory=dict)
    chat_template: str | None = CHATML_TEMPLATE
    pad: str = PAD
    eos: str = IM_END
    ids: dict = field(default_factory=dict)


TEXT_FIELDS = ("text", "prompt", "label", "chosen", "rejected")


def read_texts(manifests: Iterable[str | Path]) -> list[str]:
    """The text fields of every line of the given JSONL files: manifests (`text`), prompt sets
    (`prompt`, `messages`, `label`) and preference pairs (`chosen`, `rejected`). A line that is not
    a JSON object holding one of them is an error naming its file and line (`ManifestError`): a
    skipped line's characters would be missing from the vocabulary."""
    from asr_rl.data.manifest import ManifestError, Problem

    texts = []
    for path in manifests:
        problems = []
        for lineno, line in enumerate(_lines(path), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                problems.append(Problem(lineno, f"malformed JSON ({e.msg} at column {e.colno})"))
                continue
            found = _row_texts(row) if isinstance(row, dict) else []
            if not found:
                problems.append(Problem(lineno, f"expected a JSON object with a text field ({', '.join(TEXT_FIELDS)} "
                                                f"or messages), got {line.strip()[:60]}"))
            texts += found
        if problems:
            raise ManifestError(path, problems, kind="--tokenizer-from file")
    return texts


def _lines(path: str | Path) -> list[str]:
    try:
        return Path(path).read_text(encoding="utf-8").split("\n")  # not splitlines: JSON strings may hold U+2028
    except UnicodeDecodeError as e:
        raise ValueError(f"--tokenizer-from file {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def _row_texts(row: dict) -> list[str]:
    texts = [row[k] for k in TEXT_FIELDS if isinstance(row.get(k), str)]
    messages = row.get("messages")
    texts += [str(m.get("content", "")) for m in (messages if isinstance(messages, list) else []) if isinstance(m, dict)]
    # a manifest's context words are prompt text: the vocabulary must write them too
    context = row.get("context")
    return texts + ([c for c in context if isinstance(c, str)] if texts and isinstance(context, list) else [])


def build_char_tokenizer(texts: Iterable[str], spec: TokenizerSpec | None = None):
    """A `PreTrainedTokenizerFast` whose vocabulary is the characters of `texts` (plus printable
    ASCII), then `spec`'s special and added tokens (default: a plain chat LM's)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    spec = spec or TokenizerSpec()
    chars = set(string.ascii_letters + string.digits + string.punctuation + " \n")
    for t in texts:
        chars.update(t)
    # an added token that is also a character (e.g. "\n") must not take two ids
    vocab_list = list(dict.fromkeys([t for t in (*spec.special, *spec.added) if t not in spec.ids] + sorted(chars)))
    vocab = {tok: i for i, tok in enumerate(vocab_list)}
    if spec.ids:  # the released ids: placeholders (never produced: there are no merges) fill the gap
        at = {i: tok for tok, i in spec.ids.items()}
        if len(vocab) > min(at):
            raise ValueError(f"{len(vocab)} characters and tags do not fit below the fixed id {min(at)}")
        vocab.update({at.get(i, f"<|reserved_{i}|>"): i for i in range(len(vocab), max(at) + 1)})
    # No merges: every character is its own token. Characters outside the vocabulary are dropped
    # by the tokenizer, which only matters for training targets, and those built the vocabulary.
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(list(spec.special))
    if spec.added:
        backend.add_tokens(list(spec.added))
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=spec.eos, pad_token=spec.pad, bos_token=None,
                                  extra_special_tokens=dict(spec.extra_special))
    if spec.chat_template:
        tok.chat_template = spec.chat_template
    return tok


def is_char_vocabulary(path: str | Path) -> bool:
    """Whether the folder's `tokenizer.json` is a character vocabulary (`build_char_tokenizer`'s: a
    BPE without merges or pre-tokenizer)."""
    file = Path(path) / "tokenizer.json"
    if not file.is_file():
        return False
    spec = json.loads(file.read_text(encoding="utf-8"))
    model = spec.get("model") or {}
    return model.get("type") == "BPE" and not model.get("merges") and spec.get("pre_tokenizer") is None


def load_tokenizer(path: str | Path):
    """A text model folder's tokenizer. A character vocabulary loads as its `tokenizer.json` says:
    `AutoTokenizer` would take the model type's class (transformers 5: `Qwen2Tokenizer` for a qwen2
    folder), whose byte-level pre-tokenizer drops the spaces, newlines and every non-ASCII
    character of such a vocabulary (a judge would read "call anna" as "callanna" and Mandarin as
    nothing). Any other folder loads with `AutoTokenizer`."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if is_char_vocabulary(path):
        return PreTrainedTokenizerFast.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def unwritable_chars(tokenizer, texts: Iterable[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    """The `(where, text)` pairs whose text holds characters `tokenizer` cannot write, with those
    characters: a character is writable when decoding its encoding gives it back. A character
    tokenizer drops what its vocabulary lacks (a Japanese transcript on an en/zh model would train
    on an empty target); a byte-level BPE writes everything."""
    verdict: dict[str, bool] = {}

    def writable(c: str) -> bool:
        if c not in verdict:
            ids = tokenizer(c, add_special_tokens=False)["input_ids"]
            verdict[c] = c.isspace() or tokenizer.decode(ids) == c
        return verdict[c]

    out = []
    for where, text in texts:
        bad = sorted({c for c in text if not writable(c)})
        if bad:
            out.append((where, bad))
    return out


def written_texts(utterances) -> list[tuple[str, str]]:
    """`(where, text)` of each utterance's transcript and, as `<where> (context)`, its context list."""
    texts = [(u.source or u.id, u.text) for u in utterances if u.text]
    return texts + [(f"{u.source or u.id} (context)", " ".join(u.context)) for u in utterances if u.context]


def require_writable(utterances, tokenizer, what: str = "train_manifest") -> None:
    """ValueError naming the lines (up to 10) and characters of `utterances` the model cannot write,
    in their transcripts or their context lists (prompt text: a dropped character would change a
    listed name without a word)."""
    from asr_rl.data.utterance_table import column_of

    chars: set[str] = set()  # first the distinct characters (a set's update runs in C)
    for text in column_of(utterances, "text"):
        chars.update(text or "")
    for context in column_of(utterances, "context"):
        chars.update(*context)
    bad = unwritable_chars(tokenizer, [("", "".join(sorted(chars)))])
    if bad:  # now which lines hold them
        bad = unwritable_chars(tokenizer, written_texts(utterances))
        chars = sorted({c for _, cs in bad for c in cs})
        lines = "; ".join(f"{where}: {' '.join(cs)}" for where, cs in bad[:10])
        raise ValueError(f"{what}: {len(bad)} transcripts or context lists hold characters the model's tokenizer cannot write "
                         f"({''.join(chars[:40])}), e.g. {lines}. Build the model's tokenizer from this data "
                         "(asr-rl model init --tokenizer-from ...) or fix these lines")


def require_contexts_fit(contexts: Iterable[tuple[str, tuple[str, ...]]], tokenizer, limit: int | None,
                         reserve: int, what: str) -> None:
    """ValueError naming the first of `contexts` (`(where, items)`) whose list the prompt cannot hold:
    its characters the tokenizer cannot write (a dropped one changes a listed name without a word),
    or its tokens, with `reserve` positions left for the audio and the response, over the LLM's
    `limit` positions (None: no limit known). Checked before a forward could ask for the memory of a
    prompt no model takes."""
    seen: set[tuple[str, ...]] = set()
    for where, items in contexts:
        if not items or items in seen:
            continue
        seen.add(items)
        text = ", ".join(items)
        bad = unwritable_chars(tokenizer, [(where, text)])
        if bad:
            raise ValueError(f"{what}: {where}: the context list holds characters the model's tokenizer cannot "
                             f"write: {' '.join(bad[0][1])}; remove them or build the tokenizer from these lists")
        n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        if limit is not None and n + reserve > limit:
            raise ValueError(f"{what}: {where}: the context list of {len(items)} items is {n} tokens; with "
                             f"{reserve} positions for the audio and the response the prompt would exceed the "
                             f"model's {limit} positions. Shorten the list (at most ~{max(limit - reserve, 0)} "
                             "tokens)")


def require_prompts_fit(utterances, tokenizer, limit: int | None, max_new_tokens: int, what: str) -> None:
    """`require_contexts_fit` for the context lists of `utterances`, each named by its line, with
    room kept for the longest audio (at the prompt positions a second of audio takes) and
    `max_new_tokens`."""
    from asr_rl.data.batching import POSITIONS_PER_SECOND
    from asr_rl.data.utterance_table import context_chars_of, durations_of

    longest = float(durations_of(utterances).max(initial=0.0))
    reserve = max_new_tokens + int(POSITIONS_PER_SECOND * longest)
    with_context = (utterances[int(i)] for i in np.flatnonzero(context_chars_of(utterances)))  # only those decoded
    require_contexts_fit(((f"{u.source or u.id} (context)", u.context) for u in with_context), tokenizer, limit,
                         reserve, what)


def token_ids(tokenizer, texts: Iterable[str], batch: int = 1024) -> dict[str, list[int]]:
    """{text: its token ids (no special tokens)} of each distinct text, encoded a batch at a time
    (one call a text costs ~20x more: a 300k-line set spent seconds there)."""
    unique = list(dict.fromkeys(texts))
    out = {}
    for start in range(0, len(unique), batch):
        chunk = unique[start:start + batch]
        out.update(zip(chunk, tokenizer(chunk, add_special_tokens=False)["input_ids"]))
    return out


def token_lengths(tokenizer, texts: Iterable[str]) -> dict[str, int]:
    """{text: its number of tokens} of each distinct text (`token_ids`)."""
    return {text: len(ids) for text, ids in token_ids(tokenizer, texts).items()}
