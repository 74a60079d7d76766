"""Typed configuration: frozen dataclasses, a YAML file, and dotted `key=value` overrides.

Defaults live only in the dataclasses below (no default YAML is generated or checked in). A config
file and the command line may set any field by its dotted path (`rollout.temperature=0.7`); a leaf
name that occurs once in the tree may also be given bare (`n_samples_per_prompt=8`), so that
OpenRLHF's flat option names work. Unknown keys and values of the wrong type are errors that name
the key, where it came from, and the closest valid key.

The sections that the trainers use are defined in their own modules' configs
(`asr_rl.trainer.configs.rl`); this module holds the machinery and the keys every run shares.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from asr_rl.settings import Range, setting  # noqa: F401 (setting re-exported)

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration key or value that cannot be used; the message says which and why."""


# ---------------------------------------------------------------------------------------------
# Sections shared by every command
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DataConfig:
    """How utterances are read and batched.

    Attributes:
        sample_rate: rate the model expects; audio at other rates is resampled (soxr).
        min_duration: shorter utterances are skipped with a warning (seconds).
        max_duration: longer utterances are skipped with a warning (seconds).
        shuffle: shuffle the training manifest every epoch (seeded by the run's `seed`).
        decode_workers: threads decoding a batch's audio (what the encoder cache lacks) in parallel.
        bucket_batches: group utterances of similar prompt length (audio duration plus context
            list) into batches, sorting runs of this many batches by it (0 = off); less padding, same
            epoch coverage.
        input_key: prompt field of a text prompt set (OpenRLHF's --input_key).
        label_key: reference/label field of a text prompt set.
        apply_chat_template: render text prompts with the tokenizer's chat template.
        max_prompt_len: text prompts are truncated from the left to this many tokens.
    """

    sample_rate: int = setting(16000, gt=0)
    min_duration: float = setting(0.1, ge=0)
    max_duration: float = setting(30.0, gt=0)
    shuffle: bool = True
    bucket_batches: int = setting(0, ge=0)
    decode_workers: int = setting(2, ge=0)
    input_key: str = "prompt"
    label_key: str = "label"
    apply_chat_template: bool = True
    max_prompt_len: int = setting(1024, ge=1)


@dataclass(frozen=True)
class LoggingConfig:
    """Where metrics go besides the run folder's `metrics.jsonl` (always written).

    Attributes:
        tensorboard: also write TensorBoard event files under `<output_dir>/tensorboard`.
        wandb_project: log to Weights & Biases under this project when set (needs `wandb`).
        logging_steps: print one console line every this many steps.
        progress_bar: show a tqdm progress bar on rank 0.
    """

    tensorboard: bool = True
    wandb_project: str | None = None
    logging_steps: int = setting(1, ge=1)
    progress_bar: bool = True


@dataclass(frozen=True)
class RunConfig:
    """The keys every `asr-rl train ...` command accepts (docs/commands.md).

    Attributes:
        pretrain: starting model folder (a Hugging Face checkpoint).
        train_manifest: training utterances: a JSONL manifest, or any format `data.format` reads.
        prompt_data: JSONL prompt set for the text path.
        eval_manifest: JSONL manifest evaluated every `eval_steps` (audio path).
        output_dir: run folder: checkpoints, metrics, resolved config.
        max_steps: number of optimisation steps (RL: rollout steps) to run.
        max_minutes: stop early, with a final checkpoint, after this much wall time; 0 = no limit (the LR
            schedule spans `max_steps`; SFT's spans the steps the cap holds if max_steps' would not fit).
        save_steps: write a checkpoint every this many steps (and always at the end); <=0: only end.
        eval_steps: evaluate on `eval_manifest` every this many steps; <=0: only at the end.
        max_ckpt_num: keep the newest this many step checkpoints.
        seed: seeds data order, sampling and initialisation.
        backend: `local` (one process) or `ray` (Ray actor groups with DeepSpeed).
        resume: `auto` continues from the newest checkpoint in `output_dir` (only when it is the
            same run: same command and run-defining settings); `none` starts fresh; a path resumes
            from that checkpoint.
        overwrite_output_dir: with resume=none, delete the checkpoints and metrics of the run that
            `output_dir` holds and start over (without it such a folder is refused).
        num_threads: torch intra-op threads per process (1 is fastest when processes share cores).
        device: `cpu`, `cuda` or `auto` (cuda when available).
    """

    pretrain: str | None = None
    train_manifest: str | None = None
    prompt_data: str | None = None
    eval_manifest: str | None = None
    output_dir: str = "runs/default"
    max_steps: int = setting(100, ge=1)
    max_minutes: float = setting(0.0, ge=0, note="0 = no limit")
    save_steps: int = 50
    eval_steps: int = 50
    max_ckpt_num: int = setting(2, ge=1)
    seed: int = setting(42, ge=0)
    backend: Literal["local", "ray"] = "local"
    resume: str = "auto"
    overwrite_output_dir: bool = False
    num_threads: int = setting(1, ge=1)
    device: Literal["cpu", "cuda", "auto"] = "auto"
    data: DataConfig = field(default_factory=DataConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------
def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] = (),
                presets: list[str] = ()) -> T:
    """Build `cls` from its defaults, then `key=value` presets (an algorithm's or a checkpoint's),
    then a YAML file, then `key=value` overrides (later wins)."""
    values: dict[str, Any] = {}
    for item in presets:
        key, value = parse_override(item)
        _assign(cls, values, key, value, source=f"preset {item!r}")
    if path is not None:
        for key, value in _read_yaml(Path(path)).items():
            _assign(cls, values, key, value, source=f"{path}")
    for item in overrides:
        key, value = parse_override(item)
        _assign(cls, values, key, value, source=f"command-line override {item!r}")
    return _build(cls, _unflatten(values), prefix="")


def parse_override(item: str) -> tuple[str, Any]:
    """`a.b=1` -> ("a.b", 1). Values are parsed as YAML scalars/lists (`x=[1,2]`, `y=null`)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key=value")
    key, raw = item.split("=", 1)
    key = key.strip().lstrip("-").replace("-", "_")
    if not key:
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def config_to_dict(cfg: Any) -> dict:
    """Plain nested dict (tuples as lists) for saving beside a run."""
    out = {}
    for f in fields(cfg):
        v = getattr(cfg, f.name)
        if is_dataclass(v):
            v = config_to_dict(v)
        elif isinstance(v, tuple):
            v = list(v)
        out[f.name] = v
    return out


def leaf_values(cfg: Any) -> dict[str, Any]:
    """Every leaf setting of `cfg` by its dotted path (tuples as lists), e.g. {"rollout.temperature": 1.0}."""
    out: dict[str, Any] = {}
    for f in fields(cfg):
        v = getattr(cfg, f.name)
        if is_dataclass(v):
            out.update({f"{f.name}.{k}": x for k, x in leaf_values(v).items()})
        else:
            out[f.name] = list(v) if isinstance(v, tuple) else v
    return out


def save_config(cfg: Any, path: str | Path) -> None:
    from asr_rl.utils import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(config_to_dict(cfg), sort_keys=False, allow_unicode=True))


def replace(cfg: T, **changes: Any) -> T:
    """`dataclasses.replace` accepting dotted keys: `replace(cfg, **{"rollout.temperature": 0.7})`."""
    return _replace_nested(cfg, _unflatten(changes))


def _replace_nested(cfg: Any, nested: dict) -> Any:
    kwargs = {}
    for name, value in nested.items():
        current = getattr(cfg, name)
        kwargs[name] = _replace_nested(current, value) if is_dataclass(current) and isinstance(value, dict) else value
    return dataclasses.replace(cfg, **kwargs)


# ---------------------------------------------------------------------------------------------
# Internals
# ---------------------------------------------------------------------------------------------
def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys, got {type(data).__name__}")
    return data


@functools.lru_cache(maxsize=None)
def _field_paths(cls: type, prefix: str = "") -> dict[str, Any]:
    """Every leaf field's dotted path -> its type annotation."""
    return {path: tp for path, (tp, _) in _leaf_fields(cls, prefix).items()}


@functools.lru_cache(maxsize=None)
def _leaf_fields(cls: type, prefix: str = "") -> dict[str, tuple[Any, Range | None]]:
    """Every leaf field's dotted path -> (type annotation, valid range or None)."""
    hints = typing.get_type_hints(cls)
    out: dict[str, tuple[Any, Range | None]] = {}
    for f in fields(cls):
        tp = hints[f.name]
        if _is_dataclass_type(tp):
            out.update(_leaf_fields(tp, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = (tp, f.metadata.get("range"))
    return out


def _check_range(value: Any, valid: Range | None, key: str, full: str, source: str) -> None:
    items = value if isinstance(value, (list, tuple)) else [value]
    bad = [v for v in items if isinstance(v, (int, float)) and not isinstance(v, bool) and not valid.holds(v)] \
        if valid is not None else []
    if bad:
        name = f"`{key}`" + (f" ({full})" if key != full else "")
        raise ConfigError(f"{source}: {name} must be {valid}, got {value!r}")


def _assign(cls: type, values: dict[str, Any], key: str, value: Any, source: str) -> None:
    """Record `key=value` (a leaf, or a section given as a mapping) under its full dotted path."""
    paths = _field_paths(cls)
    sections = {p.rsplit(".", 1)[0] for p in paths if "." in p}
    full = _resolve(str(key), paths, sections, source)
    if full in sections:
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: `{full}` is a section; set its keys, e.g. {full}.<name>=...")
        for sub_key, sub_value in value.items():
            _assign(cls, values, f"{full}.{sub_key}", sub_value, source)
        return
    values[full] = _coerce(value, paths[full], full, source)
    _check_range(values[full], _leaf_fields(cls)[full][1], str(key), full, source)


def _resolve(key: str, paths: dict[str, Any], sections: set[str], source: str) -> str:
    """Map a bare leaf name to its unique dotted path, or fail naming the closest valid key."""
    if key in paths or key in sections:
        return key
    matches = [p for p in list(paths) + sorted(sections) if p.rsplit(".", 1)[-1] == key]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise ConfigError(f"{source}: `{key}` is ambiguous; use one of {', '.join(matches)}")
    candidates = list(paths) + [p.rsplit(".", 1)[-1] for p in paths]
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.5)
    hint = f"; did you mean `{close[0]}`?" if close else ""
    raise ConfigError(f"{source}: unknown config key `{key}`{hint}")


def _coerce(value: Any, tp: Any, key: str, source: str) -> Any:
    """Check `value` against the annotation `tp`, converting only where lossless (int -> float,
    list -> tuple)."""
    try:
        return _coerce_inner(value, tp)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{source}: `{key}` expects {_type_name(tp)}, got {value!r} ({e})") from None


def _coerce_inner(value: Any, tp: Any) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce_inner(value, arg)
            except (TypeError, ValueError) as e:
                errors.append(str(e))
        raise TypeError("; ".join(errors))
    if origin is Literal:
        if value not in args:
            raise ValueError(f"must be one of {', '.join(map(repr, args))}")
        return value
    if origin in (tuple, list):
        if isinstance(value, str):  # `patterns=a,b` from the command line
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise TypeError("not a list")
        item_tp = args[0] if args else Any
        items = [_coerce_inner(v, item_tp) for v in value]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise TypeError("not a mapping")
        k_tp, v_tp = args if args else (Any, Any)
        return {_coerce_inner(k, k_tp): _coerce_inner(v, v_tp) for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise TypeError("not true/false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError("not an integer")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads `1e-5` (no dot) as a string
            try:
                return float(value)
            except ValueError:
                raise TypeError("not a number") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError("not a number")
        return float(value)
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise TypeError("not a string")
        return str(value)
    if tp is type(None):
        if value is not None:
            raise TypeError("not null")
        return None
    raise TypeError(f"unsupported annotation {tp}")


def _type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "one of " + ", ".join(map(repr, args))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin in (tuple, list):
        return f"a list of {_type_name(args[0])}" if args else "a list"
    if origin is dict:
        return "a mapping"
    return {int: "an integer", float: "a number", bool: "true/false", str: "a string",
            type(None): "null"}.get(tp, str(tp))


def _unflatten(flat: dict[str, Any]) -> dict:
    nested: dict = {}
    for key, value in flat.items():
        node = nested
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return nested


def _build(cls: type[T], nested: dict, prefix: str, base: Any = None) -> T:
    """`cls` with the values in `nested`; unset fields keep `base`'s values: a section's default as
    its parent declares it (SFT's `optim` has its own learning rate), else the class defaults."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in fields(cls):
        if f.name not in nested:
            continue
        tp = hints[f.name]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        kwargs[f.name] = (_build(tp, nested[f.name], f"{prefix}{f.name}.", default) if _is_dataclass_type(tp)
                          else nested[f.name])
    try:
        obj = dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: {e}") from None
    return obj


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and is_dataclass(tp)
