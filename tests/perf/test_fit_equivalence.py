"""The compiled throughput fit gives the bits of the straightforward one (fit_reference.py).

``fit_perf_params`` runs its solver in a numba kernel (deepboot/perf/_fitkernel.py)
that must perform the same IEEE operations in the same order as the NumPy
formulation, on every CPU; nothing may change a bit of the result (CONTRIBUTING.md: a
speed-up keeps every golden). These tests replay the simulator's pattern, each
measurement set refitted from the fit of the set without its newest point, on
measurement sets that exercise every pinning rule; check the kernel's pieces (exp,
log, NumPy's pairwise sum, the Cholesky solve) against their Python twins; and rerun
the replay with numba generating code for this machine's CPU instead of the generic
target.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from llvmlite import binding as llvm

from deepboot.core.params import PerfParams
from deepboot.perf import _fitkernel, detmath
from deepboot.perf.fit import fit_perf_params
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


def replay_digest(seeds: list[int], count: int) -> str:
    """Digest of the fits of a replay (as in the test above)."""
    h = hashlib.sha256()
    for seed in seeds:
        for n, k, m, comp, step in measurement_sets(seed, count):
            start = None
            for size in range(max(1, n.size - 3), n.size + 1):
                args = (n[:size], k[:size], m[:size], comp[:size], step[:size])
                start = fit_perf_params(*args, start=start)
                h.update(b"".join(bits(start)))
    return h.hexdigest()


def test_the_kernel_targets_a_generic_cpu_without_fma() -> None:
    """The kernel is compiled for the generic x86-64 CPU (no FMA, no AVX), so LLVM
    cannot fuse a multiply and an add into one rounding (_fitkernel's docstring)."""
    if "NUMBA_CPU_NAME" in os.environ and os.environ["NUMBA_CPU_NAME"] != "generic":
        pytest.skip("NUMBA_CPU_NAME overridden")
    assert _fitkernel.numba.config.CPU_NAME == "generic"
    assert _fitkernel.numba.config.CPU_FEATURES == ""
    fit_perf_params([1, 2], [2, 4], [32.0, 16.0], [0.1, 0.05], [0.2, 0.15])  # compiled
    _triple, cpu, features = _fitkernel._lm.targetctx.codegen().magic_tuple()
    assert (cpu, features) == ("generic", "")


def test_the_same_bits_with_code_for_this_cpu() -> None:
    """Compiled for this machine's CPU (its name and features: FMA and AVX where it
    has them) the fits keep their bits: the kernel's arithmetic does not depend on the
    target (nothing may fuse or reorder an operation)."""
    host = llvm.get_host_cpu_name()
    tests = str(Path(__file__).resolve().parents[1])
    code = (
        f"import sys, json; sys.path.insert(0, {tests!r});"
        "from perf.test_fit_equivalence import replay_digest;"
        "print(json.dumps(replay_digest([1, 2], 10)))"
    )
    # numba caches the code per target: compiled once for this CPU, then reused.
    env = dict(os.environ, NUMBA_CPU_NAME=host)
    env.pop("NUMBA_CPU_FEATURES", None)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == replay_digest([1, 2], 10)


EXP_IN = np.concatenate(
    [
        np.linspace(-746.0, 710.0, 20011),
        np.linspace(-1.0, 1.0, 2003),
        [np.inf, -np.inf, np.nan, 0.0, -0.0, 709.78, -745.13, 1e-300, -1e-300],
    ]
)
LOG_IN = np.concatenate(
    [
        detmath.exp(np.linspace(-744.0, 709.0, 20011)),
        np.linspace(0.5, 2.0, 2003),
        [0.0, -0.0, np.inf, -1.0, np.nan, 5e-324, 1.7976931348623157e308],
    ]
)


def test_kernel_exp_and_log_are_detmaths() -> None:
    got = [_fitkernel._exp(float(v)) for v in EXP_IN]
    want = [detmath.exp_scalar(float(v)) for v in EXP_IN]
    assert np.array(got).tobytes() == np.array(want).tobytes()
    got = [_fitkernel._log(float(v)) for v in LOG_IN]
    want = [detmath.log_scalar(float(v)) for v in LOG_IN]
    assert np.array(got).tobytes() == np.array(want).tobytes()


def test_kernel_cholesky_is_solve_spd() -> None:
    rng = np.random.default_rng(5)
    for n in range(1, 8):
        base = rng.normal(size=(n, n))
        jtj = base @ base.T
        for mu in [0.0, 1e-3, 1.0, 1e300, np.inf]:
            a = jtj + np.diag(mu * np.diag(jtj))
            if mu == 1.0:
                a[0, 0] = -1.0  # not positive definite
            b = rng.normal(size=n)
            want = detmath.solve_spd(a.tolist(), b.tolist())
            x = np.zeros(n)
            with np.errstate(all="ignore"):
                ok = _fitkernel._solve_spd(a, b, n, np.zeros((n, n)), x)
            assert ok == (want is not None)
            if want is not None:
                assert x.tobytes() == np.array(want).tobytes()


def test_kernel_sum_is_numpys() -> None:
    rng = np.random.default_rng(9)
    for size in [*range(0, 300), 511, 512, 513, 1000, 1031, 4099]:
        values = rng.normal(size=size) * 10.0 ** rng.integers(-8, 8, size)
        assert struct.pack("<d", _fitkernel.np_sum(values)) == struct.pack(
            "<d", float(np.sum(values))
        )
