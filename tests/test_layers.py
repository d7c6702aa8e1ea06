"""DESIGN.md's layers: nothing imports upward, and no module imports itself back.

Each package of ``deepboot`` may import only the packages listed for it (itself
included), at module level or inside a function alike; the top-level modules
(``api``, ``matrix``) and ``cli`` sit above them all. Within and across packages, no
chain of imports leads a module back to itself.
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


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """The import statements of ``tree`` that run (at module level or in a function);
    those under ``if TYPE_CHECKING:`` are for the type checker only."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _import_graph() -> dict[str, set[str]]:
    """Module -> the ``deepboot`` modules it imports (``from a import b`` names the
    submodule ``a.b`` when there is one, else ``a``)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for node in _runtime_imports(ast.parse(path.read_text(), str(path))):
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
    """No two modules import each other, directly or through others, at module level
    or inside a function (``if TYPE_CHECKING:`` imports aside)."""
    cycles = _cycles(_import_graph())
    assert not cycles, "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_function_level_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import deepboot.x\n"
        "def f():\n    import deepboot.y\n"
    )
    names = [a.name for n in _runtime_imports(tree) if isinstance(n, ast.Import) for a in n.names]
    assert names == ["deepboot.y"]
