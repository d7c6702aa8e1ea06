"""The fast throughput fit gives the bits of the straightforward one (fit_reference.py).

``fit_perf_params`` batches the Levenberg-Marquardt tries that follow a rejection,
fuses the logarithms of one evaluation and builds the Jacobian only for accepted
steps; none of that may change a bit of the result (CONTRIBUTING.md: a speed-up keeps
every golden). These tests replay the simulator's pattern, each measurement set
refitted from the fit of the set without its newest point, on measurement sets that
exercise every pinning rule.
"""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest

from deepboot.core.params import PerfParams
from deepboot.perf import detmath
from deepboot.perf.fit import _numpy_sum, fit_perf_params
from deepboot.perf.goodput import compute_time, step_time

from .fit_reference import reference_fit_perf_params

TRUE = PerfParams(
    alpha_c=0.02, beta_c=0.003, alpha_n=0.3, beta_n=0.02, alpha_r=0.05, beta_r=0.004, gamma=2.5
)


def bits(p: PerfParams) -> tuple[bytes, ...]:
    return tuple(struct.pack("<d", v) for v in dataclasses.astuple(p))


def measurement_sets(seed: int, count: int) -> list[tuple[np.ndarray, ...]]:
    """Random growing measurement sets: (nodes, replicas, local_bsz, comp, step)."""
    rng = np.random.default_rng(seed)
    shapes = [(1, 1), (1, 2), (1, 3), (1, 4), (2, 2), (2, 4), (2, 8), (3, 12), (4, 16)]
    out = []
    for _ in range(count):
        size = int(rng.integers(1, 30))
        pick = rng.integers(0, len(shapes), size)
        n = np.array([shapes[i][0] for i in pick], dtype=np.int64)
        k = np.array([shapes[i][1] for i in pick], dtype=np.int64)
        m = rng.integers(4, 256, size).astype(np.float64)
        if rng.random() < 0.2:
            m[:] = m[0]  # one batch size: alpha_c pinned
        comp = compute_time(TRUE, m) * np.exp(rng.normal(0.0, 0.05, size))
        step = np.maximum(step_time(TRUE, n, k, m) * np.exp(rng.normal(0.0, 0.05, size)), comp)
        out.append((n, k, m, comp, step))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fit_matches_the_reference_bit_for_bit(seed: int) -> None:
    for n, k, m, comp, step in measurement_sets(seed, 15):
        start = None
        for size in range(max(1, n.size - 3), n.size + 1):
            args = (n[:size], k[:size], m[:size], comp[:size], step[:size])
            want = reference_fit_perf_params(*args, start=start)
            assert bits(fit_perf_params(*args, start=start)) == bits(want)
            start = want


def test_batched_cholesky_matches_the_scalar_one() -> None:
    rng = np.random.default_rng(5)
    for n in range(1, 8):
        base = rng.normal(size=(n, n))
        jtj = base @ base.T
        mus = [1e-3 * 4.0**i for i in range(40)] + [1e300, np.inf]
        a = np.empty((n, n, len(mus)))
        a[:] = jtj[:, :, None]
        for i in range(n):
            a[i, i] = jtj[i, i] + np.array(mus) * jtj[i, i]
        a[0, 0, 3] = -1.0  # not positive definite
        b = rng.normal(size=n).tolist()
        with np.errstate(all="ignore"):
            ok, x = detmath.solve_spd_batch(a, b)
        for col in range(len(mus)):
            want = detmath.solve_spd(a[:, :, col].tolist(), b)
            assert bool(ok[col]) == (want is not None)
            if want is not None:
                assert x[:, col].tolist() == want


def test_numpy_sum_twin() -> None:
    rng = np.random.default_rng(9)
    for size in range(0, 140):
        values = (rng.normal(size=size) * 10.0 ** rng.integers(-8, 8, size)).tolist()
        assert struct.pack("<d", _numpy_sum(values)) == struct.pack(
            "<d", float(np.sum(np.array(values, dtype=np.float64)))
        )
