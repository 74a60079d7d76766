"""User reward files: a `.py` that plugs in unchanged if it defines either

* OpenRLHF's `reward_func(queries, prompts, labels, **kwargs)`, returning a tensor/list of rewards
  or a dict `{"rewards": ..., "scores": ... (optional), "extra_logs": {...} (optional)}`; or
* TRL-style functions `(completions, **kwargs) -> list[float | None]`: a module-level list
  `reward_funcs` (with optional `reward_weights`), or a single function whose first parameter is
  named `completions`. Dataset columns arrive as keyword lists (`text`, `language`, `keywords`,
  `context`, `duration`, `audio` (its path), `id`, `speaker`, and any other manifest field), plus
  `prompts` and `references`.
  `None` means "does not apply to this sample": the sample's reward is the weighted sum of the
  functions that do apply, and a sample that no function applies to is an error (never a 0).

What OpenRLHF's `reward_func` receives for ASR: `queries` are the raw responses (with the language
tag and `<asr_text>`), `prompts` the utterance ids (audio) or prompt texts (text path), `labels`
the references; kwargs add `hypotheses`, `languages`, `keywords`, `durations`, `group_ids`, `contexts`.
"""
from __future__ import annotations

import importlib.util
import inspect
import math
import sys
from pathlib import Path
from types import ModuleType

from asr_rl.rewards.base import RewardError, RewardOutput, Sample, check_output


def load_module(path: str | Path) -> ModuleType:
    """Import a user file, with errors that name the file (and line, for syntax errors)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"reward file {path} does not exist")
    name = f"asr_rl_user_reward_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise ValueError(f"reward file {path} has a syntax error at line {e.lineno}: {e.msg}") from None
    except Exception as e:
        raise ValueError(f"reward file {path} failed to import: {type(e).__name__}: {e}") from e
    sys.modules[name] = module  # so Ray/pickle can find functions defined in it
    return module


def _columns(samples: list[Sample]) -> dict[str, list]:
    cols: dict[str, list] = {"prompts": [s.prompt for s in samples], "references": [s.reference for s in samples],
                             "text": [s.reference for s in samples], "language": [s.language for s in samples],
                             "keywords": [list(s.keywords) for s in samples],
                             "context": [list(s.context) for s in samples],
                             "duration": [s.duration for s in samples], "audio": [s.audio for s in samples]}
    extra = sorted({k for s in samples for k in s.metadata} - set(cols))
    for k in extra:
        cols[k] = [s.metadata.get(k) for s in samples]
    return cols


def _call_with_accepted(fn, *args, **extras):
    """`fn(*args, **extras)`, passing only the extras `fn` accepts: OpenRLHF documents
    `reward_func(queries, prompts, labels)` without `**kwargs`, and TRL functions name what they read."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C function: no signature to read
        return fn(*args, **extras)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return fn(*args, **extras)
    names = {p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    return fn(*args, **{k: v for k, v in extras.items() if k in names})


class OpenRLHFFileReward:
    """Calls `reward_func(queries, prompts, labels, **kwargs)` from a user file (the extras only if
    it takes them)."""

    def __init__(self, path: str | Path, fn):
        self.name = f"{Path(path).name}:reward_func"
        self.fn = fn

    def __call__(self, samples: list[Sample]) -> RewardOutput:
        try:
            raw = _call_with_accepted(
                self.fn, [s.response for s in samples], [s.prompt for s in samples], [s.reference for s in samples],
                hypotheses=[s.hypothesis for s in samples], languages=[s.language for s in samples],
                keywords=[list(s.keywords) for s in samples], durations=[s.duration for s in samples],
                group_ids=[s.group_id for s in samples], contexts=[list(s.context) for s in samples])
        except Exception as e:
            raise RewardError(f"reward {self.name!r} raised {type(e).__name__} on samples 0-{len(samples) - 1}: {e}") from e
        rewards, scores, logs = raw, None, {}
        if isinstance(raw, dict):
            if "rewards" not in raw:
                raise RewardError(f"reward {self.name!r} returned a dict without 'rewards' (keys: {sorted(raw)})")
            rewards, scores, logs = raw["rewards"], raw.get("scores"), raw.get("extra_logs") or {}
        out = RewardOutput(_as_list(self.name, rewards), scores=_as_list(self.name, scores) if scores is not None else None,
                           terms={"file": _as_list(self.name, rewards)}, extra_logs=_mean_logs(logs))
        return check_output(self.name, out, len(samples))


class TRLFileReward:
    """Weighted TRL-style functions `(completions, **kwargs) -> list[float | None]`."""

    def __init__(self, path: str | Path, fns: list, weights: list[float] | None = None):
        self.name = Path(path).name
        self.fns = fns
        self.weights = list(weights) if weights is not None else [1.0] * len(fns)
        if len(self.weights) != len(fns):
            raise ValueError(f"reward file {path}: reward_weights has {len(self.weights)} entries for {len(fns)} reward_funcs")

    def __call__(self, samples: list[Sample]) -> RewardOutput:
        cols = _columns(samples)
        terms: dict[str, list] = {}
        for fn in self.fns:
            label = f"{self.name}:{fn.__name__}"
            try:
                values = _call_with_accepted(fn, [s.hypothesis for s in samples], **cols)
            except Exception as e:
                raise RewardError(f"reward {label!r} raised {type(e).__name__} on samples 0-{len(samples) - 1}: {e}") from e
            terms[fn.__name__] = _as_list(label, values, allow_none=True, n=len(samples))
        rewards = []
        for i in range(len(samples)):
            applicable = [(w, vals[i]) for w, vals in zip(self.weights, terms.values()) if vals[i] is not None]
            if not applicable:
                raise RewardError(f"reward {self.name!r}: no function applies to sample {i} (all returned None)")
            rewards.append(sum(w * v for w, v in applicable))
        return check_output(self.name, RewardOutput(rewards, terms=terms), len(samples))


def load_reward_file(path: str | Path):
    """The reward a user file defines (OpenRLHF `reward_func` first, then TRL-style functions)."""
    module = load_module(path)
    if callable(getattr(module, "reward_func", None)):
        _check_takes(path, module.reward_func, 3, "reward_func(queries, prompts, labels, **kwargs)")
        return OpenRLHFFileReward(path, module.reward_func)
    if isinstance(getattr(module, "reward_funcs", None), (list, tuple)):
        for fn in module.reward_funcs:
            if not callable(fn):
                raise ValueError(f"reward file {path}: reward_funcs holds {fn!r}, which is not a function")
            _check_takes(path, fn, 1, "f(completions, **kwargs)")
        return TRLFileReward(path, list(module.reward_funcs), getattr(module, "reward_weights", None))
    trl = [f for f in vars(module).values() if inspect.isfunction(f) and f.__module__ == module.__name__
           and list(inspect.signature(f).parameters)[:1] == ["completions"]]
    if len(trl) == 1:
        return TRLFileReward(path, trl)
    found = ", ".join(n for n, f in vars(module).items() if inspect.isfunction(f)) or "none"
    raise ValueError(f"reward file {path} defines no recognised reward: expected `reward_func(queries, prompts, "
                     f"labels, **kwargs)`, a list `reward_funcs`, or one function `(completions, **kwargs)`; "
                     f"functions found: {found}")


def _check_takes(path, fn, positional: int, how: str) -> None:
    """ValueError naming the file and the function when `fn` cannot be called as the protocol calls
    it: `positional` arguments, then keywords (those it names)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin: nothing to read, it is called as it is
        return
    params = list(sig.parameters.values())
    # the columns it names beyond the positional ones arrive as keywords, whichever it names
    named = {p.name: None for p in params[positional:] if p.default is p.empty
             and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    try:
        sig.bind(*([None] * positional), **named)
    except TypeError as e:
        raise ValueError(f"reward file {path}: {getattr(fn, '__name__', fn)}{sig} cannot be called as {how}: {e}") from None


def _as_list(name: str, values, allow_none: bool = False, n: int | None = None) -> list:
    if hasattr(values, "tolist"):
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
        raise RewardError(f"reward {name!r} returned {type(values).__name__}, expected a list of numbers")
    if n is not None and len(values) != n:
        raise RewardError(f"reward {name!r} returned {len(values)} values for {n} samples")
    for i, v in enumerate(values):
        if v is None and allow_none:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise RewardError(f"reward {name!r} returned {v!r} ({type(v).__name__}) for sample {i}; expected a number")
        if not math.isfinite(v):
            raise RewardError(f"reward {name!r} returned {v} for sample {i}; rewards must be finite")
    return list(values)


def _mean_logs(logs: dict) -> dict[str, float]:
    out = {}
    for k, v in logs.items():
        if hasattr(v, "tolist"):
            v = v.tolist()
        if isinstance(v, (list, tuple)) and v:
            v = sum(v) / len(v)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = float(v)
    return out
