"""DESIGN.md's layers: nothing imports upward.

Each package of ``deepboot`` may import only the packages listed for it (itself
included), at module level or inside a function alike; the top-level modules
(``api``, ``matrix``) and ``cli`` sit above them all.
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
    "sim": _BASE | {"perf", "policies", "scheduler", "sim"},
    "report": _BASE | {"perf", "policies", "scheduler", "sim", "report"},
    "elastic": _BASE | {"perf", "elastic"},
    "runtime": _BASE | {"perf", "policies", "scheduler", "elastic", "runtime"},
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
