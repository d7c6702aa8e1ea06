"""The compiled throughput rows against their NumPy formulation, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from deepboot.perf._goodputkernel import throughput_rows
from deepboot.perf.goodput import NUM_CANDIDATES, combine_times


def _reference(p, atomic, accum, total, retro, multi, r, i):
    """_CandidateTable.throughput's rows as they were written in NumPy."""
    ac, bc, an, bn, ar, br, gamma = p
    m = atomic[r]
    t_grad = ac + bc * m
    rt = retro[r]
    intra = np.where(multi[r], ar + br * rt, 0.0)
    t_sync = np.where(i > 0, an + bn * rt, intra)[:, None]
    step = combine_times(t_grad, np.broadcast_to(t_sync, t_grad.shape), gamma)
    return total[r] / (step + accum[r] * t_grad)


@pytest.mark.parametrize("seed", range(30))
def test_matches_numpy_formulation(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows_n = int(rng.integers(2, 40))
    atomic = np.floor(rng.uniform(1.0, 512.0, size=(rows_n, NUM_CANDIDATES)))
    accum = np.floor(rng.uniform(0.0, 8.0, size=(rows_n, NUM_CANDIDATES)))
    ks = np.arange(rows_n, dtype=np.float64)
    total = ks[:, None] * atomic * (accum + 1)
    retro = np.maximum(ks - 2, 0)
    multi = ks > 1
    scale = 10.0 ** rng.uniform(-6, 1, size=7)
    p = rng.uniform(0.0, 1.0, size=7) * scale
    p[6] = 1.0 + rng.exponential(3.0) * (seed % 4)  # gamma >= 1, sometimes exactly 1
    if seed % 5 == 0:
        p[2:6] = 0.0  # no sync time at all
    if seed % 7 == 0:
        p[6] = 1e3  # a large gamma: (min/max)^gamma underflows
    q = int(rng.integers(1, 3 * rows_n))
    r = rng.integers(0, rows_n, size=q)
    i = rng.integers(0, 2, size=q).astype(np.int8)
    out = np.empty((q, NUM_CANDIDATES))
    throughput_rows(p, atomic, accum, total, retro, multi, r, i, out)
    with np.errstate(divide="ignore", invalid="ignore"):
        ref = _reference(p.tolist(), atomic, accum, total, retro, multi, r, i)
    assert out.tobytes() == np.ascontiguousarray(ref).tobytes()
