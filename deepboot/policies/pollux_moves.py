"""The local-search moves of the Pollux search, and their vectorized specification.

:func:`best_move_reference` scores every move of a (J, V) matrix with NumPy arrays,
recomputing everything from the matrix. It is the specification the fast incremental
search (:class:`deepboot.policies.pollux_state.SearchState`) must match bit for bit
(gain, kind and cells; ``tests/policies/test_pollux_state.py`` holds them equal), and
that search falls back on it for a problem with a non-finite cost, whose NaN ties the
scalar code does not reproduce.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from deepboot.policies.pollux_fitness import BoolArray, FloatArray, IntArray, PolluxProblem

_INF = np.inf


class MoveKind(enum.IntEnum):
    """Local-search moves; on equal gain the lower value wins."""

    GROW = 0
    SHRINK = 1
    TRANSFER = 2
    MOVE = 3
    SWAP = 4
    CONSOLIDATE = 5


@dataclass(frozen=True, slots=True)
class Move:
    """One candidate move: its cost change (negative improves) and its cells.

    ``cells`` are (job, node, +1 or -1) GPU changes, applied in order.
    """

    gain: float
    kind: MoveKind
    cells: tuple[tuple[int, int, int], ...]


def replica_floor(problem: PolluxProblem) -> IntArray:
    """(J,) fewest GPUs a running job may hold: max(min_replicas, 1)."""
    return np.maximum(problem.min_replicas, 1)


def best_move_reference(
    problem: PolluxProblem,
    m: IntArray,
    tabu: BoolArray | None = None,
    aspiration: float = -_INF,
) -> Move | None:
    """The feasible move of lowest cost change from ``m`` (not modified).

    Args:
        problem: The round's problem.
        m: A feasible (J, V) matrix.
        tabu: (J, V) cells no move may change, unless its gain is below ``aspiration``.
        aspiration: Gain below which a tabu move is allowed.

    Returns:
        The best move (ties: lower :class:`MoveKind`), or None when no move is feasible.
    """
    cfg = problem.config
    base, cap = problem.base, problem.capacity
    num_jobs, num_nodes = m.shape
    low, high = replica_floor(problem), problem.max_replicas
    outside = problem.base_outside
    jobs = np.arange(num_jobs)

    k = m.sum(axis=1)
    n = np.count_nonzero(m, axis=1)
    free = cap - m.sum(axis=0)
    on = m > 0
    absdiff = np.abs(m - base)
    diff = absdiff.sum(axis=1)
    cost = problem.matrix_cost(m)

    if cfg.interference_avoidance:
        dist_cells = on & (n > 1)[:, None]
        other = dist_cells.sum(axis=0)[None, :] - dist_cells  # other distributed jobs
        conflict = np.any(on & (other > 0), axis=1)
    else:
        other = np.zeros_like(m)
        conflict = np.zeros(num_jobs, dtype=bool)

    def delta(jj: IntArray, nn: IntArray, kk: IntArray, dd: IntArray, ok: BoolArray) -> FloatArray:
        """Cost change of jobs ``jj`` taking (nn, kk) with |row - base| sum ``dd``."""
        nn = np.where(ok, nn, 0)
        kk = np.where(ok, kk, 0)
        changed = (dd > 0) | outside[jj]
        new = problem.costs(jj, nn, kk, changed)
        return np.where(ok, new - cost[jj], _INF)

    def allowed(values: FloatArray, blocked: BoolArray | None) -> FloatArray:
        if blocked is None:
            return values
        return np.where(blocked & ~(values < aspiration), _INF, values)

    tb = tabu if tabu is not None else None
    jj_full = np.broadcast_to(jobs[:, None], m.shape)
    # Add one GPU of job j on node v (capacity checked by each move that adds).
    k_add = np.broadcast_to((k + 1)[:, None], m.shape)
    n_add = n[:, None] + (~on)
    d_add = diff[:, None] - absdiff + np.abs(m + 1 - base)
    ok_add = (k_add >= low[:, None]) & (k_add <= high[:, None]) & (n_add <= cfg.max_nodes_per_job)
    ok_add &= (n_add == 1) | (~conflict[:, None] & (other == 0))
    c_add = delta(jj_full, n_add, k_add, d_add, ok_add)
    # Remove one GPU of job j from node v.
    k_rem = np.broadcast_to((k - 1)[:, None], m.shape)
    n_rem = n[:, None] - (m == 1)
    d_rem = diff[:, None] - absdiff + np.abs(m - 1 - base)
    ok_rem = on & ((k_rem == 0) | (k_rem >= low[:, None]))
    c_rem = delta(jj_full, n_rem, k_rem, d_rem, ok_rem)

    moves: list[Move] = []

    grow = allowed(np.where(free[None, :] > 0, c_add, _INF), tb)
    j, v = _argmin2(grow)
    moves.append(Move(float(grow[j, v]), MoveKind.GROW, ((j, v, 1),)))

    shrink = allowed(c_rem, tb)
    j, v = _argmin2(shrink)
    moves.append(Move(float(shrink[j, v]), MoveKind.SHRINK, ((j, v, -1),)))

    cell_j, cell_v = np.nonzero(on)
    if len(cell_j):
        cells_idx = np.arange(len(cell_j))
        cell_tabu = None if tb is None else tb[cell_j, cell_v]
        # Transfer: job a gives one GPU on node v to job b.
        transfer = c_rem[cell_j, cell_v][:, None] + c_add[:, cell_v].T  # (C, J)
        transfer[cells_idx, cell_j] = _INF
        blocked = None if tb is None or cell_tabu is None else cell_tabu[:, None] | tb[:, cell_v].T
        transfer = allowed(transfer, blocked)
        c, b = _argmin2(transfer)
        src_j, src_v = int(cell_j[c]), int(cell_v[c])
        moves.append(
            Move(float(transfer[c, b]), MoveKind.TRANSFER, ((src_j, src_v, -1), (b, src_v, 1)))
        )
        # Move one GPU of job a from node v to node w.
        a, src = cell_j, cell_v
        leaves = (m[a, src] == 1).astype(np.int64)
        n_mv = n[a][:, None] - leaves[:, None] + (~on[a])  # (C, V)
        n_mv[cells_idx, src] = n[a]  # w == v is no move
        d_mv = (
            diff[a][:, None]
            + (np.abs(m[a, src] - 1 - base[a, src]) - absdiff[a, src])[:, None]
            + (np.abs(m[a] + 1 - base[a]) - absdiff[a])
        )
        ok_mv = np.ones_like(n_mv, dtype=bool)
        ok_mv[cells_idx, src] = False
        ok_mv &= n_mv <= cfg.max_nodes_per_job
        ok_mv &= (n_mv == 1) | (~conflict[a][:, None] & (other[a] == 0))
        aa = np.broadcast_to(a[:, None], n_mv.shape)
        c_mv = delta(aa, n_mv, np.broadcast_to(k[a][:, None], n_mv.shape), d_mv, ok_mv)
        mv_blocked = None if tb is None or cell_tabu is None else cell_tabu[:, None] | tb[a]
        move = allowed(np.where(free[None, :] > 0, c_mv, _INF), mv_blocked)
        c, w = _argmin2(move)
        aj, av = int(a[c]), int(src[c])
        moves.append(Move(float(move[c, w]), MoveKind.MOVE, ((aj, av, -1), (aj, w, 1))))
        # Swap: job a's GPU on v goes to w and job b's GPU on w goes to v.
        swap = c_mv[:, src].copy()  # [c1, c2] = a1 moves v1 -> v2
        swap += swap.T  # + a2 moves v2 -> v1
        same = (a[:, None] == a[None, :]) | (src[:, None] == src[None, :])
        both_dist = (n_mv[:, src] > 1) & (n_mv[:, src] > 1).T
        swap[same | (both_dist & cfg.interference_avoidance)] = _INF
        if mv_blocked is not None:
            into = mv_blocked[:, src]  # a1's cell on v1, or a1's cell on v2
            swap = allowed(swap, into | into.T)
        c1, c2 = _argmin2(swap)
        a1, v1, a2, v2 = int(a[c1]), int(src[c1]), int(a[c2]), int(src[c2])
        swap_cells = ((a1, v1, -1), (a1, v2, 1), (a2, v2, -1), (a2, v1, 1))
        moves.append(Move(float(swap[c1, c2]), MoveKind.SWAP, swap_cells))

    # Consolidate a multi-node job onto the best-fitting single node.
    room = free[None, :] + m  # (J, V)
    fits = (room >= k[:, None]) & (n > 1)[:, None] & (k[:, None] > 0)
    if np.any(fits):
        target = np.argmin(np.where(fits, room, np.iinfo(np.int64).max), axis=1)
        can = np.any(fits, axis=1)
        same_as_base = (base[jobs, target] == k) & (base.sum(axis=1) == k)
        d_con = np.where(same_as_base, 0, 1)
        c_con = delta(jobs, np.ones_like(k), k, d_con, can)
        c_con = allowed(c_con, None if tb is None else np.any(tb & (on | (room > 0)), axis=1))
        j = int(np.argmin(c_con))
        to = int(target[j])
        kj = int(k[j])
        cells = tuple((j, int(v), -int(m[j, v])) for v in np.flatnonzero(m[j]) if v != to)
        cells += ((j, to, kj - int(m[j, to])),)
        moves.append(Move(float(c_con[j]), MoveKind.CONSOLIDATE, cells))

    best = min(moves, key=lambda mv: (mv.gain, mv.kind))
    return best if np.isfinite(best.gain) else None


def _argmin2(a: FloatArray) -> tuple[int, int]:
    """Row and column of the first minimum of a 2-D array."""
    r, c = np.unravel_index(int(np.argmin(a)), a.shape)
    return int(r), int(c)
