"""DESIGN.md's layers: nothing imports upward, and no module imports itself back.

Each package of ``deepboot`` may import only the packages listed for it (itself
included), at module level or inside a function alike; the top-level modules
(``api``, ``matrix``) and ``cli`` sit above them all. Within and across packages, no
chain of imports leads a module back to itself, counting the imports made for the
type checker only (``if TYPE_CHECKING:``): a cycle closed that way is still a cycle
a reader walks round.

Inside the runtime (docs/runtime.md, "Where the code runs"): ``controller/`` (the
loop's thread) never imports ``http/`` (the router's event loop): the two exchange
only the message values and the port protocol of ``runtime/messages.py``;
``client/`` (what the CLI commands use) imports neither ray nor aiohttp at module
level, not even through another module; and no file name in ``deepboot/`` is used
twice with two meanings.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "deepboot"

_BASE = {"core"}
ALLOWED: dict[str, set[str]] = {
    "core": _BASE,
    "perf": _BASE | {"perf"},
    "policies": _BASE | {"perf", "policies"},
    "scheduler": _BASE | {"perf", "policies", "scheduler"},
    "world": _BASE | {"perf", "policies", "scheduler", "world"},
    "sim": _BASE | {"perf", "policies", "scheduler", "world", "sim"},
    "report": _BASE | {"perf", "policies", "scheduler", "world", "sim", "report"},
    "elastic": _BASE | {"perf", "elastic"},
    "runtime": _BASE | {"perf", "policies", "scheduler", "world", "elastic", "runtime"},
}


def _imported(path: Path) -> set[str]:
    """The ``deepboot`` subpackages ``path`` imports."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "deepboot" and len(parts) > 1:
                out.add(parts[1])
    return out


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_no_layer_imports_upward(layer: str) -> None:
    bad = []
    for path in sorted((PACKAGE / layer).rglob("*.py")):
        for target in sorted(_imported(path) - ALLOWED[layer]):
            bad.append(f"{path.relative_to(PACKAGE.parent)} imports deepboot.{target}")
    assert not bad, "\n".join(bad)


def _modules() -> dict[str, Path]:
    """Every module of ``deepboot`` by dotted name (a package by its own name)."""
    out: dict[str, Path] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _all_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree``: at module level, in a function, and under
    ``if TYPE_CHECKING:`` alike."""
    return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


def _module_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The imports that run when the module is imported: its top-level statements and
    those in top-level ``if``/``try`` blocks, but not those under ``if TYPE_CHECKING:``
    (never run) or inside a function or class body."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                found.append(node)
            elif isinstance(node, ast.If):
                if "TYPE_CHECKING" not in ast.unparse(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(tree.body)
    return found


def _import_graph(module_level_only: bool = False) -> dict[str, set[str]]:
    """Module -> the ``deepboot`` modules it imports (``from a import b`` names the
    submodule ``a.b`` when there is one, else ``a``): every import, or with
    ``module_level_only`` those that run when the module is imported."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        found = _module_level_imports(tree) if module_level_only else _all_imports(tree)
        for node in found:
            if isinstance(node, ast.Import):
                graph[name].update(a.name for a in node.names if a.name in mods)
            elif node.module and node.level == 0 and node.module.startswith("deepboot"):
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    if sub in mods:
                        graph[name].add(sub)
                    elif node.module in mods:
                        graph[name].add(node.module)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles() -> None:
    """No two modules import each other, directly or through others: at module level,
    inside a function or under ``if TYPE_CHECKING:`` alike."""
    cycles = _cycles(_import_graph())
    assert not cycles, "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_function_level_and_a_type_only_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "import deepboot.w\n"
        "if TYPE_CHECKING:\n    import deepboot.x\n"
        "def f():\n    import deepboot.y\n"
    )
    every = [a.name for n in _all_imports(tree) if isinstance(n, ast.Import) for a in n.names]
    assert every == ["deepboot.w", "deepboot.x", "deepboot.y"]
    run = [
        a.name for n in _module_level_imports(tree) if isinstance(n, ast.Import) for a in n.names
    ]
    assert run == ["deepboot.w"]


RUNTIME = "deepboot.runtime"
CONTROLLER = f"{RUNTIME}.controller"
HTTP = f"{RUNTIME}.http"
CLIENT = f"{RUNTIME}.client"


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_controller_never_imports_http() -> None:
    """The loop's thread and the router's event loop meet only in the message values
    and the port protocol of ``runtime/messages.py``: nothing under ``controller/``
    imports anything under ``http/``, not even for the type checker."""
    mods = _modules()
    assert CONTROLLER in mods and HTTP in mods, "runtime/controller/ and runtime/http/"
    bad = [
        f"{src} imports {dst}"
        for src, dsts in sorted(_import_graph().items())
        if _inside(src, CONTROLLER)
        for dst in sorted(dsts)
        if _inside(dst, HTTP)
    ]
    assert not bad, "\n".join(bad)


def _third_party_at_module_level(path: Path) -> set[str]:
    """The top-level names of the non-deepboot packages ``path`` imports when it is
    imported."""
    out = set()
    for node in _module_level_imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out - {"deepboot"}


def test_the_client_imports_neither_ray_nor_aiohttp_at_module_level() -> None:
    """A CLI command that only talks to the endpoint or reads a file starts fast and
    works without the runtime extra: no module under ``client/`` imports ray or
    aiohttp when it is imported, directly or through the deepboot modules it imports
    at module level."""
    mods = _modules()
    graph = _import_graph(module_level_only=True)
    assert CLIENT in mods, "runtime/client/"
    bad = []
    for start in sorted(m for m in mods if _inside(m, CLIENT)):
        seen, todo = {start}, [start]
        while todo:
            mod = todo.pop()
            heavy = _third_party_at_module_level(mods[mod]) & {"ray", "aiohttp"}
            if heavy:
                bad.append(f"{start} imports {sorted(heavy)} (through {mod})")
            for nxt in graph[mod] - seen:
                seen.add(nxt)
                todo.append(nxt)
    assert not bad, "\n".join(bad)


SAME_MEANING = {
    "base.py": "the base class of a kind of policy (training; inference)",
    "registry.py": "the registry of a kind of policy (training; inference)",
    "services.py": "a services file: as the simulator reads it; its CLI flag",
    "timeline.py": "a run's timeline: drawn (report); the command that draws it (cli)",
}
"""File names used in two places for the same thing, each place one side of it."""


def test_no_file_name_is_reused_with_another_meaning() -> None:
    by_name: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name not in ("__init__.py", "__main__.py"):
            by_name.setdefault(path.name, []).append(str(path.relative_to(PACKAGE.parent)))
    reused = {n: ps for n, ps in by_name.items() if len(ps) > 1 and n not in SAME_MEANING}
    assert not reused, "\n".join(f"{n}: {', '.join(ps)}" for n, ps in sorted(reused.items()))
