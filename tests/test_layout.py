"""The shape of the package, checked: rooms (and the trainer's sub-rooms) that import only downwards,
no import cycle (module or function level, relative and `importlib` imports included), every module
importable on its own (and without ray/deepspeed/vllm outside `trainer/distributed/`), the size
budget, extension names used only inside their registries, scripts that use only public names, and
a product that never points at a file outside the repository.

Each check is a function of the sources (`{module: source}`), so the tests at the end plant a
violation in a copy of the real sources and see the check catch it."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "asr_rl"
DISTRIBUTED = "asr_rl.trainer.distributed"
# The rooms of the package, bottom first; a room may import itself, the rooms before it in its own
# list and the helper modules. The trainer is split by role: rollout (engines, experience), configs,
# run (bookkeeping), update (policy/critic updates, the policy worker), driver (the loop, its roles,
# the local backend), distributed (Ray/DeepSpeed placement of the same roles), recipes (entry points).
BASE = ["asr_rl.algos", "asr_rl.data", "asr_rl.models", "asr_rl.rewards", "asr_rl.evaluation"]
TRAINER = [f"asr_rl.trainer.{r}" for r in ("rollout", "configs", "run", "update", "driver", "distributed", "recipes")]
ALLOWED = {
    "asr_rl.algos": set(),
    "asr_rl.data": set(),
    "asr_rl.models": {"asr_rl.data"},
    "asr_rl.rewards": {"asr_rl.data", "asr_rl.models"},
    "asr_rl.evaluation": {"asr_rl.data", "asr_rl.models", "asr_rl.rewards"},
    **{room: set(BASE) | set(TRAINER[:i]) for i, room in enumerate(TRAINER)},
    "asr_rl.trainer": set(),  # the package itself holds nothing
}
HELPERS = {"asr_rl", "asr_rl.config", "asr_rl.settings", "asr_rl.utils", "asr_rl.registry"}  # import no room
TOP = {"asr_rl.cli", "asr_rl.cli_data"}  # may import every room
# what a product file may not point at: the team's notes live outside the repository
OUTSIDE = re.compile(r"\b(DESIGN|ENVIRONMENT|STYLE|DEVELOPERS)\.md\b|\.\./shared\b")


SOURCES = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p.read_text()
           for p in PKG.rglob("*.py")}
SCRIPTS = {f"scripts.{p.stem}": p.read_text() for p in (ROOT / "scripts").glob("*.py")}


def _resolve(target: str, modules: dict[str, str]) -> str | None:
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def imports(name: str, modules: dict[str, str]) -> set[str]:
    """asr_rl modules `name` imports: at module or function level (a cycle closed inside a function
    is still a cycle), absolute or relative, or through `importlib.import_module("...")`."""
    package = name if _is_package(name, modules) else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(modules[name])):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            targets = [node.args[0].value]
        for t in targets:
            t = _resolve(t, modules)
            if t and t.startswith("asr_rl") and t != name:
                out.add(t)
    return out


def _is_package(name: str, modules: dict[str, str]) -> bool:
    return any(m.startswith(name + ".") for m in modules)


def room(name: str) -> str | None:
    if name in HELPERS or name in TOP:
        return name
    return max((r for r in ALLOWED if name == r or name.startswith(r + ".")), key=len, default=None)


def back_arrows(modules: dict[str, str]) -> list[str]:
    """Imports that run up or across: a room importing one not listed for it (helpers import no room)."""
    bad = []
    for m in modules:
        here = room(m)
        if here is None or here in TOP:
            if here is None:
                bad.append(f"{m} is in no room")
            continue
        for dep in imports(m, modules):
            there = room(dep)
            if there == here or there in HELPERS:  # every module may use the helpers
                continue
            if here in HELPERS or there not in ALLOWED[here]:
                bad.append(f"{m} -> {dep}")
    return sorted(bad)


def cycles(modules: dict[str, str]) -> list[list[str]]:
    graph = {m: imports(m, modules) for m in modules}
    state: dict[str, int] = {}
    found = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for dep in sorted(graph[m]):
            if state.get(dep) == 1:
                found.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return found


def registered_names() -> dict[str, set[str]]:
    """Extension names by the module that owns them: every `X = Registry(...)`'s entries, and the
    model families' names and `config.model_type` values (owned by their package)."""
    import importlib

    owners: dict[str, set[str]] = {}
    for m, src in SOURCES.items():
        for node in ast.parse(src).body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "Registry":
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                owners.setdefault(m, set()).update(getattr(importlib.import_module(m), target.id))
    from asr_rl.models.families import FAMILIES, SPECS

    owners.setdefault("asr_rl.models.families", set()).update(FAMILIES, SPECS)
    return owners


# Entry names that are also the words of a field, a metric or a command: as a dict key or subscript
# they name that (a manifest's `language`, the `cer` metric, the `train ppo` command), not the entry;
# compared, they are still checked.
COMMON_WORDS = {"cer", "wer", "language", "keyword", "biasing", "ppo"}


def _name_uses(tree: ast.AST):
    """(line, string, compared) of every string used to pick by name: compared (==, !=, in), a dict
    key, a subscript, a `match` case, or the argument of `startswith`/`endswith`."""
    def strings(node):
        elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]

    for node in ast.walk(tree):
        found, compared = [], False
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                  for op in node.ops):
            found, compared = [s for side in [node.left, *node.comparators] for s in strings(side)], True
        elif isinstance(node, ast.Dict):
            found = [s for k in node.keys if k is not None for s in strings(k)]
        elif isinstance(node, ast.Subscript):
            found = strings(node.slice)
        elif isinstance(node, ast.MatchValue):
            found = strings(node.value)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("startswith", "endswith") and node.args):
            found = strings(node.args[0])
        for s in found:
            yield node.lineno, s, compared


def names_outside_registries(modules: dict[str, str], owners: dict[str, set[str]]) -> list[str]:
    bad = []
    everything = set().union(*owners.values())
    for m, src in modules.items():
        allowed = {n for o, names in owners.items() if m == o or m.startswith(o + ".") for n in names}
        for line, value, compared in _name_uses(ast.parse(src)):
            if value in everything - allowed and (compared or value not in COMMON_WORDS):
                bad.append(f"{m}:{line} picks {value!r} by name")
    return bad


def outside_references(files: dict[str, str]) -> list[str]:
    return [f"{name}:{i}: {line.strip()}" for name, text in files.items()
            for i, line in enumerate(text.splitlines(), 1) if OUTSIDE.search(line)]


def private_names_in_scripts(scripts: dict[str, str]) -> list[str]:
    bad = []
    for name, src in scripts.items():
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("asr_rl"):
                bad += [f"{name}:{node.lineno} imports {a.name} from {node.module}" for a in node.names
                        if a.name.startswith("_")]
            elif isinstance(node, ast.ImportFrom) and node.module and any(p.startswith("_") for p in node.module.split(".")):
                if node.module.startswith("asr_rl"):
                    bad.append(f"{name}:{node.lineno} imports the private module {node.module}")
    return bad


def _product_files() -> dict[str, str]:
    files = {str(p.relative_to(ROOT)): p.read_text() for p in PKG.rglob("*.py")}
    files.update({str(p.relative_to(ROOT)): p.read_text() for p in (ROOT / "scripts").glob("*")
                  if p.suffix in (".py", ".sh")})
    files.update({str(p.relative_to(ROOT)): p.read_text() for p in (ROOT / "recipes").rglob("*")
                  if p.suffix in (".py", ".sh", ".yaml")})
    for name in ("pyproject.toml", "Makefile", ".ci/run"):
        if (ROOT / name).is_file():
            files[name] = (ROOT / name).read_text()
    return files


# ---------------------------------------------------------------------------------- the checks
def test_no_import_cycle_between_modules():
    found = cycles(SOURCES)
    assert found == [], "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_rooms_and_the_trainers_sub_rooms_import_only_downwards():
    assert back_arrows(SOURCES) == []


def test_the_math_imports_nothing_but_torch_and_itself():
    heavy = {"ray", "deepspeed", "vllm", "transformers"}
    for m, src in SOURCES.items():
        if room(m) == "asr_rl.algos":
            roots = {(a.name if isinstance(n, ast.Import) else n.module or "").split(".")[0]
                     for n in ast.walk(ast.parse(src)) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
            assert not roots & heavy, f"{m} imports {roots & heavy}"


def test_ray_deepspeed_and_vllm_are_imported_at_module_level_only_in_distributed():
    bad = []
    for m, src in SOURCES.items():
        if m.startswith(DISTRIBUTED):
            continue
        for node in ast.parse(src).body:  # module level only: a builder may import vllm when it runs
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{m}: {n}" for n in names if n.split(".")[0] in ("ray", "deepspeed", "vllm")]
    assert bad == []


def third_party_imports(modules: dict[str, str]) -> list[str]:
    """The other packages' modules (and names, `module:name`) the sources import at module level,
    except the distributed stack: imported once before forking, so each child pays for its own
    module only (a lazily loaded name, e.g. a transformers model class, counts as imported)."""
    out = set()
    for src in modules.values():
        for node in ast.parse(src).body:
            if isinstance(node, ast.Import):
                out |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                out |= {f"{node.module}:{a.name}" for a in node.names}
    return sorted(n for n in out if n.split(".")[0].split(":")[0] not in ("asr_rl", "ray", "deepspeed", "vllm",
                                                                            "__future__"))


_IMPORT_EACH = textwrap.dedent("""
    import importlib, importlib.abc, os, sys
    # the other packages once, before forking: each child imports its one module of ours
    for spec in os.environ["THIRD_PARTY"].split(","):
        module, _, name = spec.partition(":")
        try:
            getattr(importlib.import_module(module), name) if name else importlib.import_module(module)
        except (ImportError, AttributeError):  # a submodule reached as an attribute, or an optional one
            pass
    early = sorted(m for m in sys.modules if m.split(".")[0] in ("ray", "deepspeed", "vllm"))
    if early:  # a child could then import them unblocked: the check would pass vacuously
        sys.exit(f"the other packages imported {early[:3]} before forking")

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("ray", "deepspeed", "vllm"):
                raise ImportError(f"{name} is not installed (blocked by the test)")

    failed = []
    for name in sys.argv[1:]:
        pid = os.fork()
        if pid == 0:
            if not name.startswith("%s"):
                sys.meta_path.insert(0, Block())
            try:
                importlib.import_module(name)
            except BaseException as e:
                print(f"{name}: {type(e).__name__}: {e}", flush=True)
                os._exit(1)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        if status:
            failed.append(name)
    sys.exit(1 if failed else 0)
""") % DISTRIBUTED


@pytest.mark.slow
def test_every_module_imports_alone_and_without_the_distributed_stack_outside_distributed():
    env = {**os.environ, "THIRD_PARTY": ",".join(third_party_imports(SOURCES))}
    res = subprocess.run([sys.executable, "-c", _IMPORT_EACH, *sorted(SOURCES)], capture_output=True, text=True,
                         timeout=600, cwd=ROOT, env=env)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]


def test_size_budget():
    too_long = []
    for m, src in SOURCES.items():
        if src.count("\n") > 400:
            too_long.append(f"{m}: {src.count(chr(10))} lines")
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                too_long.append(f"{m}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert too_long == []


def test_extension_names_are_picked_only_inside_their_registries():
    assert names_outside_registries(SOURCES, registered_names()) == []


def test_scripts_pick_no_model_family_by_name():
    """A benchmark configures entries by name as a user does (`advantage_estimator=gae`), but what it
    does for a family comes from the family's spec, not from its name."""
    families = {"asr_rl.models.families": registered_names()["asr_rl.models.families"]}
    assert names_outside_registries(SCRIPTS, families) == []


def test_scripts_use_only_public_names():
    assert private_names_in_scripts(SCRIPTS) == []


def test_the_product_names_no_file_outside_the_repository():
    assert outside_references(_product_files()) == []


# ---------------------------------------------------------------------------------- planted faults
def test_a_planted_back_arrow_inside_the_trainer_is_caught():
    planted = dict(SOURCES)
    planted["asr_rl.trainer.rollout.experience"] += "\nfrom asr_rl.trainer.driver.loop import RLTrainer\n"
    assert back_arrows(planted) == ["asr_rl.trainer.rollout.experience -> asr_rl.trainer.driver.loop"]
    relative = dict(SOURCES)
    relative["asr_rl.trainer.configs.rl"] += "\nfrom ..update import ppo\n"
    assert back_arrows(relative) == ["asr_rl.trainer.configs.rl -> asr_rl.trainer.update.ppo"]
    dynamic = dict(SOURCES)
    dynamic["asr_rl.models.loading"] += "\nimport importlib\nimportlib.import_module('asr_rl.trainer.recipes.rl')\n"
    assert back_arrows(dynamic) == ["asr_rl.models.loading -> asr_rl.trainer.recipes.rl"]
    assert cycles(planted) != []  # the loop imports the experience: the planted arrow also closes a cycle


def test_a_planted_family_subscript_and_other_picks_by_name_are_caught():
    owners = registered_names()
    for planted, what in [('spec = FAMILIES["qwen3_asr"]\n', "'qwen3_asr'"),
                          ('if cfg.model_type == "glmasr":\n    pass\n', "'glmasr'"),
                          ('SIZES = {"voxtral": 1}\n', "'voxtral'"),
                          ('match name:\n    case "gae":\n        pass\n', "'gae'"),
                          ('ok = engine.startswith("vllm")\n', "'vllm'")]:
        found = names_outside_registries({"asr_rl.evaluation.report": planted}, owners)
        assert len(found) == 1 and what in found[0], (planted, found)


def test_a_planted_comment_naming_the_design_notes_is_caught():
    planted = {"asr_rl/trainer/driver/loop.py": "x = 1  # see DESIGN.md, 'Interfaces'\n",
               "pyproject.toml": "# pins measured (../shared/ENVIRONMENT.md)\n"}
    assert len(outside_references(planted)) == 2


def test_a_planted_private_import_in_a_script_is_caught():
    found = private_names_in_scripts({"scripts.bench_x": "from asr_rl.algos.advantages import _reinforce_style\n"})
    assert found == ["scripts.bench_x:1 imports _reinforce_style from asr_rl.algos.advantages"]
