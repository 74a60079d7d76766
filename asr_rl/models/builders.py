"""`asr-rl model init`: a new audio-LLM (any registered family) or text LM with an offline tokenizer.

The folder written is a plain Hugging Face checkpoint: the family's model class and
`AutoProcessor.from_pretrained` load it with no asr-rl import. Beside it, `asr_rl.json` records how
it was built (family, size, encoder source); a randomly initialised encoder is what makes SFT train
the encoder (and add CTC) by default, while a pretrained one stays frozen.

Families and sizes live in their specs (models/families/); `--encoder` takes a packaged pretrained
encoder (`whisper-tiny.en`), a Hugging Face Whisper folder, or `none` (random init).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from asr_rl.models.families import FAMILIES
from asr_rl.models.tokenizer import build_char_tokenizer, read_texts
from asr_rl.utils import umasked

INFO_FILE = "asr_rl.json"
# the text LLMs of the text RLHF path, as large as the audio-LLMs' LLMs of the same size names
TEXT_SIZES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32),
    "small": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64),
}
TEXT_ARCHS = ("qwen2", "qwen3")  # text LLMs for the text RLHF path
ARCHS = (*FAMILIES, *TEXT_ARCHS)


def build_text_lm(arch: str, size: str, tokenizer, seed: int = 0):
    """A randomly initialised Qwen2/Qwen3 causal LM with the LLM part of size `size`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    if size not in TEXT_SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {', '.join(TEXT_SIZES)}")
    config_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}[arch]
    text = dict(TEXT_SIZES[size])
    if arch == "qwen2":
        text.pop("head_dim")  # qwen2 derives it from hidden_size / heads
    config = config_cls(vocab_size=len(tokenizer), max_position_embeddings=4096, tie_word_embeddings=True,
                        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                        bos_token_id=None, **text)
    torch.manual_seed(seed)
    model = model_cls(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def read_info(path: str | os.PathLike) -> dict:
    """How `model init` built the folder (`{}` for a folder from elsewhere, e.g. the hub)."""
    f = Path(path) / INFO_FILE
    return json.loads(f.read_text()) if f.is_file() else {}


def encoder_is_pretrained(path: str | os.PathLike) -> bool:
    """False only for folders whose encoder `model init` initialised randomly."""
    return read_info(path).get("encoder", "pretrained") != "random"


def init_model(arch: str, size: str, tokenizer_from: list[str | os.PathLike], out: str | os.PathLike,
               seed: int = 0, encoder: str | None = "default", tokenizer: str | None = None) -> Path:
    """Build tokenizer (+ processor) + model and save them atomically to `out` (temp folder, rename).

    `encoder`: "default" (the family's: Whisper tiny.en for qwen2_audio, none for qwen3_asr), None or
    "none" (random init), or a packaged name / Hugging Face Whisper folder. `tokenizer`: "char" (a
    character vocabulary from `tokenizer_from`'s texts), the family's released BPE ("qwen"), or None:
    the size's own (`AudioLLMSpec.default_tokenizer`: the BPE for tiny-real, characters otherwise).
    """
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; supported: {', '.join(ARCHS)}")
    for path in tokenizer_from:
        if not Path(path).is_file():
            raise FileNotFoundError(f"--tokenizer-from {path} does not exist")
    texts = read_texts(tokenizer_from)
    if not texts:
        raise ValueError(f"no text fields (text, prompt, label, chosen, rejected, messages) found in "
                         f"{', '.join(map(str, tokenizer_from))}")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} already exists and is not empty; choose another --out or delete it")
    info = {"arch": arch, "size": size, "seed": seed}
    if arch in FAMILIES:
        spec = FAMILIES.get(arch)
        source = spec.default_encoder if encoder == "default" else (None if encoder in (None, "none") else encoder)
        tokenizer = tokenizer or spec.default_tokenizer(size)
        tok = spec.make_tokenizer(texts, size, tokenizer)
        model, processor = spec.build(size, tok, encoder=source, seed=seed)
        info["encoder"] = str(source) if source else "random"
        info["tokenizer"] = tokenizer
    else:
        if encoder not in ("default", None, "none") or tokenizer not in (None, "char"):
            raise ValueError(f"--encoder and --tokenizer are for audio-LLMs; {arch} is a text LM")
        processor = build_char_tokenizer(texts)
        model = build_text_lm(arch, size, processor, seed=seed)
    _save_atomically(out, model, processor, info)
    return out


def _save_atomically(out: Path, model, processor, info: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp"))
    os.chmod(tmp, umasked(0o777))  # mkdtemp makes it private; a model folder is meant to be shared
    try:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
        (tmp / INFO_FILE).write_text(json.dumps(info, indent=1) + "\n")
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# The published fine-tuning rates a released checkpoint starts at (trainer/recipes/presets.py).
RELEASED_CHECKPOINT = {
    "sft": ["optim.learning_rate=1e-5"],
    "rl": ["optim.actor_learning_rate=1e-6", "optim.critic_learning_rate=9e-6"],
}


def is_released_checkpoint(pretrain: str | None) -> bool:
    """A model folder that `asr-rl model init` did not build (it writes asr_rl.json, and training
    carries that file into its checkpoints)."""
    return bool(pretrain) and (Path(pretrain) / "config.json").is_file() and not (Path(pretrain) / INFO_FILE).is_file()


def arch_help() -> str:
    """`model init --arch`'s help: the registered families, then the text LMs."""
    return f"{' | '.join(FAMILIES)} (audio-LLMs), {' | '.join(TEXT_ARCHS)} (text)"


def encoder_help() -> str:
    """`model init --encoder`'s help, with each family's default encoder."""
    defaults = ", ".join(f"{n}: {FAMILIES.get(n).default_encoder or 'none'}" for n in FAMILIES)
    return ("pretrained audio encoder: whisper-tiny.en (packaged), a Hugging Face Whisper folder, or none (random "
            f"init); default: the family's ({defaults})")
