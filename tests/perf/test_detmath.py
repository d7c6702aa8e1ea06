"""detmath: accurate, and the same bits on every machine and SIMD level.

CI runs this file under several ``NPY_DISABLE_CPU_FEATURES`` settings
(``make test-determinism``); the digests below must hold under each.
"""

from __future__ import annotations

import ast
import hashlib
import math
from pathlib import Path

import numpy as np
import pytest

from deepboot.perf import detmath
from deepboot.perf.goodput import combine_times

PACKAGE = Path(__file__).resolve().parents[2] / "deepboot"


def grid(lo: float, hi: float, n: int) -> np.ndarray:
    """n points from lo to hi, by plain arithmetic (no dispatched kernel)."""
    return lo + (hi - lo) * (np.arange(n, dtype=np.float64) / (n - 1))


def digest(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
    return h.hexdigest()[:16]


EXP_IN = np.concatenate([grid(-745.0, 709.7, 20011), grid(-1.0, 1.0, 2003)])
LOG_IN = np.concatenate([detmath.exp(grid(-700.0, 700.0, 20011)), grid(0.5, 2.0, 2003)])


def ulps(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    return np.abs(got - ref) / np.spacing(np.abs(ref))


def test_exp_is_within_one_ulp_of_libm() -> None:
    ref = np.array([math.exp(v) for v in EXP_IN])
    normal = ref > 1e-300  # subnormal results have coarser absolute spacing
    assert ulps(detmath.exp(EXP_IN), ref)[normal].max() <= 1.0


def test_log_is_within_one_ulp_of_libm() -> None:
    ref = np.array([math.log(v) for v in LOG_IN])
    nonzero = ref != 0.0
    assert ulps(detmath.log(LOG_IN), ref)[nonzero].max() <= 1.0
    assert detmath.log(1.0) == 0.0


@pytest.mark.parametrize(
    ("fn", "inp", "expected"),
    [
        (detmath.exp, [np.inf, -np.inf, 800.0, -800.0, 0.0], [np.inf, 0.0, np.inf, 0.0, 1.0]),
        (detmath.log, [0.0, np.inf, 1.0], [-np.inf, np.inf, 0.0]),
    ],
    ids=["exp", "log"],
)
def test_special_values(fn: object, inp: list[float], expected: list[float]) -> None:
    got = fn(np.array(inp))  # type: ignore[operator]
    np.testing.assert_array_equal(got, expected)


def test_nan_and_negative_inputs() -> None:
    assert np.isnan(detmath.exp(np.nan))
    assert np.isnan(detmath.log(-1.0)) and np.isnan(detmath.log(np.nan))
    assert math.isnan(detmath.log_scalar(-1.0))


def test_scalar_forms_give_the_array_bits() -> None:
    np.testing.assert_array_equal(
        [detmath.exp_scalar(float(v)) for v in EXP_IN], detmath.exp(EXP_IN)
    )
    np.testing.assert_array_equal(
        [detmath.log_scalar(float(v)) for v in LOG_IN], detmath.log(LOG_IN)
    )
    x, y = LOG_IN[:500], grid(-3.0, 3.0, 500)
    np.testing.assert_array_equal(
        [detmath.pow_scalar(float(a), float(b)) for a, b in zip(x, y, strict=True)],
        detmath.pow(x, y),
    )


def test_logaddexp_and_geomspace() -> None:
    a, b = grid(-50.0, 50.0, 101), grid(30.0, -30.0, 101)
    np.testing.assert_allclose(detmath.logaddexp(a, b), np.logaddexp(a, b), rtol=1e-15)
    assert detmath.logaddexp(-np.inf, -np.inf) == -np.inf
    g = detmath.geomspace(np.array([1.0, 3.0]), np.array([1000.0, 3.0]), 50)
    assert g.shape == (50, 2)
    assert g[0, 0] == 1.0 and g[-1, 0] == 1000.0 and np.all(g[:, 1] == 3.0)
    np.testing.assert_allclose(g[:, 0], np.geomspace(1.0, 1000.0, 50), rtol=1e-14)


def test_solve_spd() -> None:
    a = [[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]]
    x = detmath.solve_spd(a, [1.0, 2.0, 3.0])
    assert x is not None
    np.testing.assert_allclose(np.array(a) @ np.array(x), [1.0, 2.0, 3.0], rtol=1e-14)
    assert detmath.solve_spd([[1.0, 2.0], [2.0, 1.0]], [1.0, 1.0]) is None


def test_the_same_bits_on_every_machine() -> None:
    """Digests of a fixed workload: they change only if the algorithms change."""
    tg = grid(0.01, 2.0, 4001)
    ts = grid(2.0, 0.0, 4001)
    got = digest(
        detmath.exp(EXP_IN),
        detmath.log(LOG_IN),
        detmath.pow(LOG_IN[:2000], 1.7),
        combine_times(tg, ts, 2.3),
        detmath.geomspace(grid(1.0, 64.0, 64), 4096.0, 50),
    )
    assert got == "eb7dca805f51476d"


# Functions whose results depend on the CPU (NumPy's SIMD dispatch, SVML, BLAS/LAPACK)
# or on the C library's transcendental functions.
BANNED_NUMPY = {
    "exp", "log", "log2", "log10", "log1p", "expm1", "exp2", "power", "float_power",
    "logaddexp", "logaddexp2", "geomspace", "logspace", "dot", "vdot", "inner", "matmul",
    "tensordot", "einsum", "linalg", "sin", "cos", "tan", "tanh", "arctan", "arctan2",
    "cbrt", "hypot",
}  # fmt: skip
BANNED_MATH = {"exp", "log", "log2", "log10", "log1p", "expm1", "pow", "sin", "cos", "tan"}
DECISION_LAYERS = ("core", "perf", "policies", "scheduler", "sim")


def banned_uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        where = f"{path.relative_to(PACKAGE.parent)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "np" and node.attr in BANNED_NUMPY:
                found.append(f"{where}: np.{node.attr}")
            if node.value.id == "math" and node.attr in BANNED_MATH:
                found.append(f"{where}: math.{node.attr}")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            found.append(f"{where}: @")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            found.append(f"{where}: **")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("scipy"):
            # Delaunay (qhull): no BLAS, no dispatch. The Sia reference's program: HiGHS
            # (milp: compiled code, no BLAS, no dispatch) over sparse 0/1 matrices.
            allowed = {"scipy.spatial"}
            if path.name == "sia.py":
                allowed |= {"scipy.optimize", "scipy"}
            if node.module not in allowed:
                found.append(f"{where}: from {node.module}")
        elif isinstance(node, ast.Import):
            found += [f"{where}: import {a.name}" for a in node.names if a.name == "scipy"]
        elif (
            # numba's fast-math reassociates sums and contracts multiply-adds (FMA).
            isinstance(node, ast.keyword)
            and node.arg == "fastmath"
            and not (isinstance(node.value, ast.Constant) and node.value.value is False)
        ):
            found.append(f"{where}: fastmath")
    return found


def test_decision_layers_use_no_cpu_dependent_arithmetic() -> None:
    """What a decision compares is computed without CPU-dispatched kernels or BLAS:
    detmath's functions and plain IEEE arithmetic only (docs/perf.md)."""
    files = [
        f
        for layer in DECISION_LAYERS
        for f in sorted((PACKAGE / layer).rglob("*.py"))
        if f.name != "detmath.py"
    ]
    assert files
    assert [u for f in files for u in banned_uses(f)] == []


def test_the_guard_finds_what_it_bans(tmp_path: Path) -> None:
    src = PACKAGE / "perf" / "_guard_probe.py"
    sample = "import numpy as np\nimport math\nx = np.log(2.0) + math.exp(1.0) + 2.0 ** 0.5\n"
    sample += "y = np.ones(2) @ np.ones(2)\nfrom scipy.optimize import minimize\n"
    sample += "import numba\nf = numba.njit(fastmath=True)(len)\n"
    try:
        src.write_text(sample)
        kinds = [u.split(": ", 1)[1] for u in banned_uses(src)]
    finally:
        src.unlink()
    assert sorted(kinds) == sorted(
        ["np.log", "math.exp", "**", "@", "from scipy.optimize", "fastmath"]
    )
