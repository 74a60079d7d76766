"""The configuration and CLI references of the docs, generated from the code so they cannot drift.

    python scripts/gen_docs_reference.py            # writes docs/reference/config.md and cli.md
    python scripts/gen_docs_reference.py --check    # exit 1 when the committed files differ

Every config key of every `asr-rl train` command comes from its dataclass: type, default (the one
source of defaults) and the doc line of the class's `Attributes:` section, nested sections
(`rollout.*`, `algo.*`, ...) flattened to the dotted keys the overrides take. Every CLI command and
flag comes from the argparse parser `asr-rl` builds, with its help text. tests/test_docs.py checks
that the files are current and that no key or flag lacks a doc line.
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "reference"


def commands() -> dict[str, type]:
    """`asr-rl train <name>` -> its config class (RL presets share RLConfig)."""
    from asr_rl.trainer.configs.preference import DPOConfig, RMConfig
    from asr_rl.trainer.configs.rl import RLConfig, SFTConfig
    from asr_rl.trainer.recipes.scorer import ScorerConfig

    return {"sft": SFTConfig, "grpo / ppo / rloo / reinforce_pp ...": RLConfig, "dpo / kto": DPOConfig,
            "rm": RMConfig, "scorer": ScorerConfig}


def attribute_docs(cls: type) -> dict[str, str]:
    """{field: its doc} from the `Attributes:` sections of `cls` and its bases (a subclass's line wins);
    a doc spans its indented continuation lines."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        doc = inspect.getdoc(klass) or ""
        if "Attributes:" not in doc:
            continue
        section = doc.split("Attributes:", 1)[1].splitlines()
        first = next((ln for ln in section if ln.strip()), "")
        indent = len(first) - len(first.lstrip())
        name, lines = None, []
        for line in section:
            depth = len(line) - len(line.lstrip())
            m = re.match(r"^(\w+(?:, \w+)*)(?: \([^)]*\))?: ?(.*)$", line.strip()) if depth == indent else None
            if m:
                if name:
                    for n in name.split(", "):
                        out[n] = " ".join(lines).strip()
                name, lines = m.group(1), [m.group(2)]
            elif line.strip() and depth > indent and name:
                lines.append(line.strip())
            elif line.strip() and depth < indent:
                break
        if name:
            for n in name.split(", "):
                out[n] = " ".join(lines).strip()
            name = None
    return out


def _type_name(t) -> str:
    s = t if isinstance(t, str) else getattr(t, "__name__", None) or str(t)
    return str(s).replace("typing.", "").replace("NoneType", "None")


def config_rows(cls: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, doc) of every field of `cls`, nested dataclasses flattened."""
    hints = typing.get_type_hints(cls)
    docs = attribute_docs(cls)
    defaults = cls()
    rows = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        value = getattr(defaults, f.name)
        if dataclasses.is_dataclass(value):
            doc = docs.get(f.name) or (inspect.getdoc(type(value)) or "").split("\n\n")[0].replace("\n", " ")
            rows.append((f"{prefix}{f.name}", "section", "", doc))
            rows += config_rows(type(value), f"{prefix}{f.name}.")
            continue
        rows.append((f"{prefix}{f.name}", _type_name(hints.get(f.name, f.type)), repr(value), docs.get(f.name, "")))
    return rows


def config_markdown() -> str:
    parts = ["# Configuration reference\n",
             "Generated from the config dataclasses by `scripts/gen_docs_reference.py` (do not edit). Every key is "
             "given as `key=value` on the command line or in a YAML `--config`; nested keys are dotted "
             "(`rollout.n_samples_per_prompt=8`); an unknown key is an error.\n"]
    for command, cls in commands().items():
        parts.append(f"\n## asr-rl train {command}\n\n`{cls.__module__}.{cls.__name__}`\n\n")
        parts.append("| key | type | default | what it does |\n|---|---|---|---|\n")
        for key, typ, default, doc in config_rows(cls):
            parts.append(f"| `{key}` | {_cell(typ)} | {_cell(default)} | {_cell(doc)} |\n")
    return "".join(parts)


def parser_rows(parser: argparse.ArgumentParser, path: str = "asr-rl") -> list[tuple[str, list[tuple[str, str]], str]]:
    """(command, [(flag, help)], the command's help) for every leaf command of `parser`."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        flags = [(", ".join(a.option_strings) or a.metavar or a.dest, _help(a)) for a in parser._actions
                 if not isinstance(a, argparse._HelpAction)]
        return [(path, flags, parser.description or "")]
    rows = []
    for action in subs:
        helps = {c.dest: c.help for c in action._choices_actions}
        for name, sub in action.choices.items():
            for cmd, flags, desc in parser_rows(sub, f"{path} {name}"):
                rows.append((cmd, flags, desc or helps.get(name) or ""))
    return rows


def cli_markdown() -> str:
    from asr_rl.cli import build_parser

    parts = ["# CLI reference\n", "Generated from `asr-rl`'s argparse parser by `scripts/gen_docs_reference.py` "
             "(do not edit).\n"]
    for command, flags, desc in parser_rows(build_parser()):
        parts.append(f"\n## {command}\n\n{_cell(desc)}\n\n| flag | what it does |\n|---|---|\n")
        parts += [f"| `{flag}` | {_cell(text)} |\n" for flag, text in flags]
    return "".join(parts)


def _help(action: argparse.Action) -> str:
    """The flag's help as `--help` prints it (a deferred text made, `%(default)s` filled in)."""
    text = action.help
    if text is None:
        return ""
    if hasattr(text, "value"):  # asr_rl.utils.Deferred: a help built from a registry
        text = text.value()
    return str(text) % {**vars(action), "prog": "asr-rl"} if "%(" in str(text) else str(text)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def main() -> int:
    files = {OUT / "config.md": config_markdown(), OUT / "cli.md": cli_markdown()}
    if "--check" in sys.argv:
        stale = [str(p) for p, text in files.items() if not p.is_file() or p.read_text() != text]
        if stale:
            print(f"out of date: {', '.join(stale)}; run python scripts/gen_docs_reference.py", file=sys.stderr)
            return 1
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    for path, text in files.items():
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
