"""The shape of the package, checked: rooms that import only downwards, no import cycle (module or
function level), every module importable on its own (and without ray/deepspeed/vllm outside
`trainer/distributed/`), the size budget, and extension names compared only inside their registries."""
from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "asr_rl"
DISTRIBUTED = "asr_rl.trainer.distributed"
# room -> the rooms it may import (besides itself and the package's top-level helper modules)
ALLOWED = {
    "asr_rl.algos": set(),
    "asr_rl.data": set(),
    "asr_rl.models": {"asr_rl.data"},
    "asr_rl.rewards": {"asr_rl.data", "asr_rl.models"},
    "asr_rl.evaluation": {"asr_rl.data", "asr_rl.models", "asr_rl.rewards"},
    "asr_rl.trainer": {"asr_rl.algos", "asr_rl.data", "asr_rl.models", "asr_rl.rewards", "asr_rl.evaluation"},
}


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PKG.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        mods[name] = path
    return mods


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """asr_rl modules `name` imports, at module or function level (a cycle closed inside a function
    is still a cycle)."""
    out = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                       for a in node.names]
        for t in targets:
            while t and t not in MODULES:
                t = t.rpartition(".")[0]
            if t.startswith("asr_rl") and t != name:
                out.add(t)
    return out


def _room(name: str) -> str:
    return ".".join(name.split(".")[:2])


def test_no_import_cycle_between_modules():
    graph = {m: _imports(m) for m in MODULES}
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for dep in sorted(graph[m]):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_rooms_import_only_downwards():
    bad = []
    for m in MODULES:
        room = _room(m)
        if room not in ALLOWED:
            continue
        for dep in _imports(m):
            dep_room = _room(dep)
            if dep_room in ALLOWED and dep_room != room and dep_room not in ALLOWED[room]:
                bad.append(f"{m} -> {dep}")
    assert bad == []


def test_the_math_imports_nothing_but_torch_and_itself():
    heavy = {"ray", "deepspeed", "vllm", "transformers"}
    for m in MODULES:
        if _room(m) == "asr_rl.algos":
            tree = ast.parse(MODULES[m].read_text())
            roots = {(a.name if isinstance(n, ast.Import) else n.module or "").split(".")[0]
                     for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
            assert not roots & heavy, f"{m} imports {roots & heavy}"


_IMPORT_EACH = textwrap.dedent("""
    import importlib.abc, os, sys
    import torch, transformers  # noqa: F401  (imported once before forking: each child imports one module)

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
""").replace("importlib.abc, os, sys", "importlib, importlib.abc, os, sys") % DISTRIBUTED


@pytest.mark.slow
def test_every_module_imports_alone_and_without_the_distributed_stack_outside_distributed():
    res = subprocess.run([sys.executable, "-c", _IMPORT_EACH, *sorted(MODULES)], capture_output=True, text=True,
                         timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]


def test_size_budget():
    too_long = []
    for m, path in MODULES.items():
        src = path.read_text()
        if src.count("\n") > 400:
            too_long.append(f"{m}: {src.count(chr(10))} lines")
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                too_long.append(f"{m}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert too_long == []


def _registries() -> dict[str, set[str]]:
    """Registered names by the module that creates the registry (`X = Registry(...)`), and the model
    families by their package."""
    import importlib

    owners: dict[str, set[str]] = {}
    for m, path in MODULES.items():
        for node in ast.parse(path.read_text()).body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "Registry":
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                owners.setdefault(m, set()).update(getattr(importlib.import_module(m), target.id))
    from asr_rl.models.families import FAMILIES

    owners.setdefault("asr_rl.models.families", set()).update(FAMILIES)
    return owners


def _compared_strings(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                  for op in node.ops):
            for side in [node.left, *node.comparators]:
                elts = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                for e in elts:
                    if isinstance(e, ast.Constant) and isinstance(e.value, str):
                        yield node.lineno, e.value


def test_extension_names_are_compared_only_inside_their_registries():
    owners = _registries()
    bad = []
    for m, path in MODULES.items():
        allowed = {n for o, names in owners.items() if m == o or m.startswith(o + ".") for n in names}
        names = set().union(*owners.values()) - allowed
        for line, value in _compared_strings(ast.parse(path.read_text())):
            if value in names:
                bad.append(f"{m}:{line} compares {value!r}")
    assert bad == []
