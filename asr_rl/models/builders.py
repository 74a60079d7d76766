"""`asr-rl model init`: randomly initialised Qwen3-ASR models with an offline tokenizer.

The folder written is a plain Hugging Face checkpoint: `Qwen3ASRForConditionalGeneration.from_pretrained`
and `AutoProcessor.from_pretrained` load it with no asr-rl import.

Sizes:
    tiny:  ~0.2M parameters, for tests (seconds).
    small: ~5M parameters (audio tower 256 x 3 layers, Qwen3 LLM 256 x 3 layers, head_dim 64):
           the size that ENVIRONMENT.md measured reaching low CER on 2 cores in about 20-25 minutes.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from asr_rl.models.tokenizer import AUDIO_PAD, build_char_tokenizer, read_texts

SIZES: dict[str, dict] = {
    "tiny": dict(
        audio=dict(d_model=64, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=128,
                   downsample_hidden_size=16),
        text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=32),
    ),
    "small": dict(
        audio=dict(d_model=256, encoder_layers=3, encoder_attention_heads=4, encoder_ffn_dim=1024,
                   downsample_hidden_size=64),
        text=dict(hidden_size=256, intermediate_size=768, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64),
    ),
}
ARCHS = ("qwen3_asr", "qwen2", "qwen3")  # the audio-LLM, and text LLMs for the text RLHF path


def build_qwen3_asr(size: str, tokenizer, seed: int = 0):
    """A randomly initialised `Qwen3ASRForConditionalGeneration` sized `size` for `tokenizer`."""
    import torch
    from transformers import Qwen3ASRConfig, Qwen3ASRForConditionalGeneration

    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    spec = SIZES[size]
    audio = dict(num_mel_bins=128, output_dim=spec["text"]["hidden_size"], **spec["audio"])
    text = dict(vocab_size=len(tokenizer), max_position_embeddings=4096, tie_word_embeddings=True,
                rope_theta=10000.0, **spec["text"])
    config = Qwen3ASRConfig(
        audio_config=audio, text_config=text,
        audio_token_id=tokenizer.convert_tokens_to_ids(AUDIO_PAD),
        timestamp_token_id=tokenizer.convert_tokens_to_ids(AUDIO_PAD),
        pad_token_id=tokenizer.pad_token_id, eos_token_id=[tokenizer.eos_token_id],
    )
    torch.manual_seed(seed)
    model = Qwen3ASRForConditionalGeneration(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = [tokenizer.eos_token_id]
    return model


def build_text_lm(arch: str, size: str, tokenizer, seed: int = 0):
    """A randomly initialised Qwen2/Qwen3 causal LM with the LLM part of size `size`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    config_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}[arch]
    text = dict(SIZES[size]["text"])
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


def init_model(arch: str, size: str, tokenizer_from: list[str | os.PathLike], out: str | os.PathLike,
               seed: int = 0) -> Path:
    """Build tokenizer (+ processor) + model and save them atomically to `out` (temp folder, rename)."""
    from transformers import Qwen3ASRFeatureExtractor, Qwen3ASRProcessor

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
    tokenizer = build_char_tokenizer(texts, audio=arch == "qwen3_asr")
    if arch == "qwen3_asr":
        processor = Qwen3ASRProcessor(feature_extractor=Qwen3ASRFeatureExtractor(), tokenizer=tokenizer,
                                      chat_template=tokenizer.chat_template)
        model = build_qwen3_asr(size, tokenizer, seed=seed)
    else:
        processor, model = tokenizer, build_text_lm(arch, size, tokenizer, seed=seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp"))
    try:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
