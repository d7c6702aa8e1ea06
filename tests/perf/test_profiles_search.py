"""The blocked brute-force simplex search picks the simplex the one-pass search picks.

``_Linear3D._brute_force`` tests simplices in blocks and stops at the first block with
a hit; the answer must be the one of testing them all at once (scipy's
``_find_simplex_bruteforce``, as the code before the speed-up wrote it, below), on
queries that land on the grid's flat slivers as well as between them.
"""

from __future__ import annotations

import numpy as np
import pytest

from deepboot.perf.profiles import _EPS, _EPS_BROAD, ProfiledApplication, _Linear3D

from .builders import PROFILES

needs_traces = pytest.mark.skipif(not PROFILES.is_dir(), reason="reference traces not present")


def one_pass(interp: _Linear3D, x: np.ndarray) -> int:
    """The brute-force search over every simplex at once (the reference form)."""
    if np.any(x < interp._min - _EPS) or np.any(x > interp._max + _EPS):
        return -1
    d = x[None, :] - interp._origin
    c3 = np.sum(interp._inv * d[:, None, :], axis=2)
    c = np.column_stack([c3, 1.0 - c3.sum(axis=1)])
    ok = interp._valid
    direct = ok & np.all((c >= -_EPS) & (c <= 1 + _EPS), axis=1)
    nbs = interp._neighbors
    idx = np.arange(nbs.shape[0])
    nb = np.where(nbs >= 0, nbs, 0)
    nb_c = c[nb]
    towards = nbs[nb] == idx[:, None, None]
    lower = np.where(towards, -_EPS_BROAD, -_EPS)
    nb_in = np.all((nb_c >= lower) & (nb_c <= 1 + _EPS), axis=2)
    via = (~ok)[:, None] & (nbs >= 0) & ok[nb] & nb_in
    hit = direct | via.any(axis=1)
    if not np.any(hit):
        return -1
    s = int(np.argmax(hit))
    if direct[s]:
        return s
    return int(nbs[s, int(np.argmax(via[s]))])


def queries(interp: _Linear3D, rng: np.random.Generator, count: int) -> np.ndarray:
    """Measured points, midpoints of pairs of them, random points in the box, and points
    in the flat simplices (where a flat simplex defers to a neighbour), some moved off
    them by less than the neighbour's leeway."""
    points = interp.points
    pick = rng.integers(0, points.shape[0], (count, 2))
    mids = (points[pick[:, 0]] + points[pick[:, 1]]) / 2.0
    lo, hi = points.min(axis=0), points.max(axis=0)
    box = lo + (hi - lo) * rng.random((count, 3))
    box[: count // 2] = np.round(box[: count // 2])  # integer nodes, replicas and batch
    flat = rng.choice(np.flatnonzero(~interp._valid), count)
    weights = rng.dirichlet(np.ones(4), count)
    slivers = np.einsum("qv,qvd->qd", weights, points[interp._simplices[flat]])
    slivers[count // 2 :] += 1e-10 * rng.normal(size=(count - count // 2, 3)) * (hi - lo)
    return np.concatenate([points[rng.integers(0, points.shape[0], count)], mids, box, slivers])


def test_blocked_search_on_a_small_grid() -> None:
    grid = np.array(
        [(n, k, m) for n in (1, 2, 4) for k in (1, 3, 4) for m in (4, 8, 16)], dtype=np.float64
    )
    interp = _Linear3D(grid, np.zeros((grid.shape[0], 2)))
    for x in queries(interp, np.random.default_rng(1), 200):
        assert interp._brute_force(x) == one_pass(interp, x), x


@needs_traces
@pytest.mark.parametrize("model", ["bert", "ncf"])
def test_blocked_search_on_the_profiles(model: str) -> None:
    interp = ProfiledApplication.from_dir(PROFILES / model)._build_interp()
    for x in queries(interp, np.random.default_rng(2), 40):
        assert interp._brute_force(x) == one_pass(interp, x), x
