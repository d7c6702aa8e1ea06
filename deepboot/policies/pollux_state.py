"""The Pollux local search's allocation, updated incrementally, and its best move.

:func:`deepboot.policies.pollux_moves.best_move_reference` rebuilds a dozen (J, V),
(C, V) and (C, C) arrays (C: occupied cells) from the matrix for every move, ~100
NumPy calls on arrays of a few dozen elements, and the search asks for ~50,000 moves
in a simulation. :class:`SearchState` keeps the matrix as Python lists with per-job
aggregates (GPUs, nodes, distance to the current row, cost, node sets as bit masks)
that a move updates for the 1-2 jobs it touches, and finds the same best move with
scalar code:

* A job's cost change depends on a cell only through a few bits (is the job on that
  node; does the cell hold one GPU; is it above or below the current row), so a job's
  cells fall into a few groups of equal value, and the first cell of a group is the
  lowest bit of a mask. A row's aggregates and groups are memoized per problem (the
  searches meet the same rows again and again); node capacities and the interference
  rule, which depend on the other rows, apply when a move is scored.
* Kinds are scored in :class:`~deepboot.policies.pollux_moves.MoveKind` order and a
  later kind wins only with a strictly lower gain, so each kind is searched only
  below the best gain so far; transfers and swaps prune rows and pairs by lower
  bounds (``fl(x + y)`` is monotone in each argument, so a bound computed from lower
  values is a true bound).

The result is the reference's bit for bit: the same gains (the same IEEE operations
on the same memoized costs) and the same cells (the first minimum in the reference's
row-major order: rows by job then node, ties among equal gains to the lower index).
A problem with a NaN or infinite cost falls back on the reference, whose NaN ties
this code does not reproduce.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from deepboot.policies.pollux_fitness import IntArray, PolluxProblem
from deepboot.policies.pollux_moves import Move, MoveKind, best_move_reference

_INF = math.inf


def _bits(mask: int) -> list[int]:
    """Indices of the set bits of ``mask``, ascending."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def _first(mask: int) -> int:
    """Index of the lowest set bit of a non-zero ``mask``."""
    return (mask & -mask).bit_length() - 1


class ProblemView:
    """What the search reads of a problem, as Python values (built once per problem,
    see :func:`problem_view`)."""

    __slots__ = (
        "num_jobs", "num_nodes", "whole", "top", "base", "base_k", "out", "min_rep", "low",
        "high", "max_nodes", "avoid", "memo", "cap", "rows", "fewest_nodes",
    )  # fmt: skip

    def __init__(self, problem: PolluxProblem) -> None:
        self.num_jobs, self.num_nodes = problem.num_jobs, problem.num_nodes
        self.whole = (1 << self.num_nodes) - 1
        self.max_nodes = problem.config.max_nodes_per_job
        self.top = min(self.num_nodes, self.max_nodes)
        self.base: list[list[int]] = problem.base.tolist()
        self.base_k = [sum(row) for row in self.base]
        self.out: list[bool] = problem.base_outside.tolist()
        self.min_rep: list[int] = problem.min_replicas.tolist()
        self.low = [max(r, 1) for r in self.min_rep]
        self.high: list[int] = problem.max_replicas.tolist()
        self.avoid = problem.config.interference_avoidance
        self.memo = [problem.cost_memo(j) for j in range(self.num_jobs)]
        self.cap: list[int] = problem.capacity.tolist()
        # (job, row) -> its aggregates: a row's are the same in every state.
        self.rows: dict[tuple[int, tuple[int, ...]], _Row] = {}
        # Holding nothing (a shrink to 0 GPUs, a row below min_replicas).
        problem.fill_costs([(j, 0, 0) for j in range(self.num_jobs)])
        # fewest_nodes[k]: nodes_for(capacity, k) for 0 <= k <= every GPU + 1.
        running = list(itertools.accumulate(sorted(self.cap, reverse=True)))
        self.fewest_nodes = [
            min(bisect.bisect_left(running, k) + 1, self.num_nodes) if k > 0 else 0
            for k in range(sum(self.cap) + 2)
        ]


def problem_view(problem: PolluxProblem) -> ProblemView:
    """The problem's :class:`ProblemView`, kept in its ``row_memo``."""
    found = problem.row_memo.get(("static",))
    if isinstance(found, ProblemView):
        return found
    made = ProblemView(problem)
    problem.row_memo[("static",)] = made
    return made


class _Row(NamedTuple):
    """One job's aggregates for one row (see :class:`SearchState`)."""

    k: int
    n: int
    diff: int
    on: int
    one: int
    lt: int
    gt: int
    cost: float
    moves: dict[int, _JobMoves]
    """Its move groups, at key 0 once the scorer first needs them (a dict, so that
    the immutable row can hold them)."""


class SearchState:
    """A feasible (J, V) allocation with per-job aggregates, for the local searches.

    Node sets are Python ints with bit v for node v. Per job j (``rows[j]``, a
    :class:`_Row` shared by every state with the same row): ``k`` GPUs, ``n`` nodes,
    ``diff`` = sum |row - current row|, ``cost`` (as :meth:`PolluxProblem.matrix_cost`),
    and the masks ``on`` (m > 0), ``one`` (m == 1), ``lt`` (m < current) and ``gt``
    (m > current). Per node: ``free`` GPUs and ``dist`` (distributed jobs on it).

    Args:
        problem: The round's problem; its cost memo is filled as the search goes.
        matrix: Feasible (J, V) start (copied).
    """

    __slots__ = (
        "problem", "st", "num_jobs", "num_nodes", "m", "rows", "free", "free_mask", "dist",
        "_intf", "_dist_masks",
    )  # fmt: skip

    def __init__(self, problem: PolluxProblem, matrix: IntArray) -> None:
        self.problem = problem
        self.st = st = problem_view(problem)
        self.num_jobs, self.num_nodes = st.num_jobs, st.num_nodes
        self.m: list[list[int]] = matrix.tolist()
        self.rows: list[_Row] = []
        self.free = [st.cap[v] - sum(row[v] for row in self.m) for v in range(self.num_nodes)]
        self.free_mask = sum(1 << v for v, f in enumerate(self.free) if f > 0)
        self.dist = [0] * self.num_nodes
        self._intf: list[int] | None = None
        self._dist_masks = (0, 0)
        self.rows = self._rows(range(self.num_jobs))
        for row in self.rows:
            if row.n > 1:
                for v in _bits(row.on):
                    self.dist[v] += 1

    # ------------------------------------------------------------------ bookkeeping

    @property
    def cost(self) -> list[float]:
        """Per-job costs (a new list)."""
        return [row.cost for row in self.rows]

    def _rows(self, jobs: Iterable[int]) -> list[_Row]:
        """The :class:`_Row` of each of ``jobs``, from the memo or computed (after
        memoizing, in one call, every cost a move from there can ask for)."""
        st = self.st
        out: list[_Row | None] = []
        todo: list[tuple[int, int, tuple[int, ...], tuple[int, int, int, int, int, int, int]]] = []
        wanted: list[tuple[int, int, int]] = []
        for j in jobs:
            key = (j, tuple(self.m[j]))
            row = st.rows.get(key)
            out.append(row)
            if row is not None:
                continue
            k = diff = on = one = lt = gt = 0
            for v, (x, b) in enumerate(zip(key[1], st.base[j], strict=True)):
                bit = 1 << v
                if x:
                    k += x
                    on |= bit
                    if x == 1:
                        one |= bit
                if x < b:
                    lt |= bit
                    diff += b - x
                elif x > b:
                    gt |= bit
                    diff += x - b
            n = on.bit_count()
            todo.append((len(out) - 1, j, key[1], (k, n, diff, on, one, lt, gt)))
            wanted += self._neighbourhood(j, n, k)
        if todo:
            self.problem.fill_costs(wanted)
            for at, j, cells, agg in todo:
                k, n, diff = agg[0], agg[1], agg[2]
                # As matrix_cost: a row below min_replicas counts as holding nothing.
                short = k < st.min_rep[j]
                pair = st.memo[j][(0, 0) if short else (n, k)]
                row = _Row(*agg, pair[diff > 0 or st.out[j]], {})
                st.rows[j, cells] = row
                out[at] = row
        return [row for row in out if row is not None]

    def _neighbourhood(self, j: int, n: int, k: int) -> list[tuple[int, int, int]]:
        """The (job, nodes, GPUs) costs a move of job ``j`` on (n, k) can ask for: (n, k)
        and what a one-GPU move or a consolidation reaches.

        The scorer never looks up another entry, so when these are finite, every
        value the reference computes is (see :attr:`PolluxProblem.costs_finite`).
        """
        st = self.st
        wanted = [(n, k), (n - 1, k), (n + 1, k), (1, k)]
        if st.low[j] <= k + 1 <= st.high[j]:
            wanted += [(n, k + 1), (n + 1, k + 1)]
        if k - 1 >= st.low[j]:
            wanted += [(n, k - 1), (n - 1, k - 1)]
        return [(j, a, b) for a, b in wanted if 1 <= a <= min(b, st.top)]

    def apply(self, cells: tuple[tuple[int, int, int], ...]) -> None:
        """Apply a move's (job, node, change) cells, which must keep the matrix feasible."""
        jobs = list(dict.fromkeys(j for j, _, _ in cells))
        dist = self.dist[:]
        for j in jobs:
            row = self.rows[j]
            if row.n > 1:
                for v in _bits(row.on):
                    self.dist[v] -= 1
        for j, v, change in cells:
            self.m[j][v] += change
            self.free[v] -= change
            if self.free[v] > 0:
                self.free_mask |= 1 << v
            else:
                self.free_mask &= ~(1 << v)
        for j, row in zip(jobs, self._rows(jobs), strict=True):
            self.rows[j] = row
            if row.n > 1:
                for v in _bits(row.on):
                    self.dist[v] += 1
        if self._intf is not None:
            if dist != self.dist:
                self._intf = None
            else:
                for j in jobs:
                    self._intf[j] = self._job_interference(j)

    @staticmethod
    def costs_of(problem: PolluxProblem, matrix: IntArray) -> float:
        """``float(problem.matrix_cost(matrix).sum())`` from the row memo: the same
        per-job values summed by NumPy in the same order (its pairwise sum of a
        contiguous float64 array depends only on the values and their count)."""
        view = problem_view(problem)
        rows = view.rows
        costs = []
        for j, row in enumerate(matrix.tolist()):
            found = rows.get((j, tuple(row)))
            if found is None:
                return float(SearchState(problem, matrix).total())
            costs.append(found.cost)
        return float(np.array(costs, dtype=np.float64).sum())

    def key(self) -> tuple[tuple[int, ...], ...]:
        """The matrix as a hashable value."""
        return tuple(map(tuple, self.m))

    def matrix(self) -> IntArray:
        """The (J, V) matrix (a new array)."""
        return np.array(self.m, dtype=np.int64).reshape(self.num_jobs, self.num_nodes)

    def total(self) -> float:
        """Summed cost: ``float(problem.matrix_cost(self.matrix()).sum())``, same bits.

        The same J values summed by NumPy in the same order (its pairwise sum of a
        contiguous float64 array depends only on the values and their count).
        """
        return float(np.array(self.cost, dtype=np.float64).sum())

    def interference(self) -> list[int]:
        """Per job, the nodes it may add a GPU on when it would then span > 1 node.

        With interference avoidance: none when the job shares a node with another
        distributed job (the reference's ``conflict``), else the nodes holding no
        other distributed job; without it: every node. Cached until ``dist`` changes.
        """
        if self._intf is None:
            one_dist = two_dist = 0
            for v, count in enumerate(self.dist):
                if count >= 1:
                    one_dist |= 1 << v
                    if count >= 2:
                        two_dist |= 1 << v
            self._dist_masks = (one_dist, two_dist)
            self._intf = [self._job_interference(j) for j in range(self.num_jobs)]
        return self._intf

    def _job_interference(self, j: int) -> int:
        if not self.st.avoid:
            return self.st.whole
        one_dist, two_dist = self._dist_masks
        row = self.rows[j]
        other = (two_dist | (one_dist & ~row.on)) if row.n > 1 else one_dist
        return 0 if row.on & other else self.st.whole & ~other

    # ------------------------------------------------------------------ best move

    def best_move(self, tabu: list[int] | None = None, aspiration: float = -_INF) -> Move | None:
        """The feasible move of lowest cost change: ``best_move_reference``'s result.

        Args:
            tabu: Per job, the mask of nodes whose cell no move may change unless its
                gain is below ``aspiration`` (None: no tabu cell).
            aspiration: Gain below which a tabu move is allowed.

        Returns:
            The best move (ties: lower kind, then the reference's cell order), or None
            when no move is feasible.
        """
        if not self.problem.costs_finite:
            return self._reference(tabu, aspiration)
        return _Scorer(self, tabu, aspiration).best()

    def _reference(self, tabu: list[int] | None, aspiration: float) -> Move | None:
        mask = None
        if tabu is not None:
            rows = [[bool(t >> v & 1) for v in range(self.num_nodes)] for t in tabu]
            mask = np.array(rows, dtype=bool).reshape(self.num_jobs, self.num_nodes)
        return best_move_reference(self.problem, self.matrix(), mask, aspiration)


class _MoveCell(NamedTuple):
    """Job ``job``'s GPU on ``node`` as a move source: the reference's c_rem entry and
    c_mv row (node capacity not checked).

    Targets w fall into four classes, in this order: on the job's nodes and below its
    current row, on and not below, off and below, off and not below.
    """

    job: int
    node: int
    nodes: int
    """The job's node count after a move to a node it holds (+1 for one it does not)."""
    masks: tuple[int, int, int, int]
    """Per class, the targets allowed by the replica and node-count rules."""
    values: tuple[float, float, float, float]
    """Per class, the cost change (inf for a class without targets)."""
    bound: float
    """min(values): a lower bound of every move from this cell."""
    spread: tuple[bool, bool]
    """Whether a move to a target on / off the job's nodes leaves it on > 1 node: the
    interference rule then applies (see :meth:`SearchState.interference`)."""
    remove: float
    """The cost change of removing this GPU (inf if not allowed)."""


class _JobMoves(NamedTuple):
    """One job's move values, as (value, nodes) groups: functions of its row alone
    (see _Scorer; the interference rule and node capacities apply at use)."""

    adds: list[tuple[float, int, bool]]
    """Gaining a GPU: (cost change, nodes it may be added on, whether the interference
    rule applies)."""
    removes: list[tuple[float, int]]
    """Losing a GPU: (cost change, nodes it may be removed from)."""
    cells: list[_MoveCell]
    """Its occupied cells by ascending node."""


def _job_moves(st: ProblemView, j: int, row: _Row) -> _JobMoves:
    """The groups of job ``j`` (the reference's c_add, c_rem and c_mv entries).

    A job's cost change depends on a cell only through a few bits: is the job on the
    node, does the cell hold one GPU, is it below / above the job's current row (which
    decides whether the row returns to the current one: "unchanged", no realloc
    factor, only when diff == 1). Adding where the row is below it, or removing where
    it is above, returns the row to the current one exactly when diff == 1.
    """
    memo, c0, k, n, on, one = st.memo[j], row.cost, row.k, row.n, row.on, row.one
    top, whole, out, diff, lt, gt = st.max_nodes, st.whole, st.out[j], row.diff, row.lt, row.gt
    adds: list[tuple[float, int, bool]] = []
    kk = k + 1
    if st.low[j] <= kk <= st.high[j]:
        back = lt if diff == 1 and not out else 0
        for nn, mask in ((n, on), (n + 1, whole & ~on)):
            if nn > top or not mask:
                continue
            pair = memo[nn, kk]
            for sub, changed in ((mask & ~back, True), (mask & back, False)):
                if sub:
                    adds.append((pair[changed] - c0, sub, nn != 1))
    removes: list[tuple[float, int]] = []
    remove_of: dict[int, float] = {}
    kk = k - 1
    if kk == 0 or (kk > 0 and kk >= st.low[j]):
        back = gt if diff == 1 and not out else 0
        for nn, mask in ((n - 1, one), (n, on & ~one)):
            pair = memo[nn, kk] if mask else (0.0, 0.0)
            for sub, changed in ((mask & ~back, True), (mask & back, False)):
                if sub:
                    val = pair[changed] - c0
                    removes.append((val, sub))
                    for v in _bits(sub):
                        remove_of[v] = val
    cells: list[_MoveCell] = []
    # Cells of one class (one GPU or more; above the current row or not) share their
    # values; the targets on the job's nodes exclude the cell's own node.
    classes: dict[int, tuple[int, int, tuple[float, float] | None, int, int, float, float]] = {}
    off_all = whole & ~on
    for v in _bits(on):
        bit = 1 << v
        kind = (2 if one & bit else 0) | (1 if gt & bit else 0)
        known = classes.get(kind)
        if known is None:
            d = diff + (-1 if kind & 1 else 1)
            ch_lt, ch_ge = out or d - 1 > 0, out or d + 1 > 0
            nodes = n - (kind >> 1)
            on_base = 0 if nodes > top else on
            on_pair = memo[nodes, k] if on_base & ~bit else None
            on_vals = None if on_pair is None else (on_pair[ch_lt] - c0, on_pair[ch_ge] - c0)
            off = 0 if nodes + 1 > top else off_all
            off_lt, off_ge = off & lt, off & ~lt
            if off:
                off_pair = memo[nodes + 1, k]
                v2 = off_pair[ch_lt] - c0 if off_lt else _INF
                v3 = off_pair[ch_ge] - c0 if off_ge else _INF
            else:
                v2 = v3 = _INF
            known = classes[kind] = (nodes, on_base, on_vals, off_lt, off_ge, v2, v3)
        nodes, on_base, on_vals, off_lt, off_ge, v2, v3 = known
        mask = on_base & ~bit
        m0, m1 = mask & lt, mask & ~lt
        v0 = v1 = _INF
        if mask:
            if on_vals is None:  # its class's first cell had no other target on its nodes
                pair = memo[nodes, k]
                d = diff + (-1 if kind & 1 else 1)
                on_vals = (pair[out or d - 1 > 0] - c0, pair[out or d + 1 > 0] - c0)
            v0 = on_vals[0] if m0 else _INF
            v1 = on_vals[1] if m1 else _INF
        cells.append(
            _MoveCell(
                j,
                v,
                nodes,
                (m0, m1, off_lt, off_ge),
                (v0, v1, v2, v3),
                min(v0, v1, v2, v3),
                (nodes != 1, nodes != 0),
                remove_of.get(v, _INF),
            )  # fmt: skip
        )
    return _JobMoves(adds, removes, cells)


class _Scorer:
    """One :meth:`SearchState.best_move` evaluation (see the module docstring).

    Kinds are scored in order against ``gain``, the best gain so far, which a later
    kind must beat strictly (on equal gains the lower kind wins). Within a kind, the
    first minimum in the reference's row-major order wins: candidates are visited in
    that order and replace the best only when strictly lower, except for a lower
    column within the same row.
    """

    def __init__(self, state: SearchState, tabu: list[int] | None, aspiration: float) -> None:
        self.s = state
        self.tabu = tabu if tabu is not None else [0] * state.num_jobs
        self.asp = aspiration
        self.intf = state.interference()
        self.jobs: list[_JobMoves] = []
        for j, row in enumerate(state.rows):
            cached = row.moves.get(0)
            if cached is None:
                cached = row.moves[0] = _job_moves(state.st, j, row)
            self.jobs.append(cached)
        self.free = state.free_mask
        self.gain = _INF
        self.move: Move | None = None

    def best(self) -> Move | None:
        self.one_cell(MoveKind.GROW)
        self.one_cell(MoveKind.SHRINK)
        cells = [cell for job in self.jobs for cell in job.cells]
        if cells:
            self.transfer(cells)
            self.move_gpu(cells)
            self.swap(cells)
        self.consolidate()
        return self.move

    def _take(self, gain: float, kind: MoveKind, cells: tuple[tuple[int, int, int], ...]) -> None:
        self.gain = gain
        self.move = Move(gain, kind, cells)

    def _first_allowed(self, val: float, mask: int, blocked: int, all_blocked: bool) -> int:
        """Lowest node of ``mask`` a move of gain ``val`` may use (-1: none): tabu
        nodes (``blocked``, or all when ``all_blocked``) only when val < aspiration."""
        if (all_blocked or mask & blocked) and not val < self.asp:
            if all_blocked:
                return -1
            mask &= ~blocked
        return _first(mask) if mask else -1

    def one_cell(self, kind: MoveKind) -> None:
        """GROW (a GPU on a node with a free one) or SHRINK (one GPU less)."""
        grow = kind is MoveKind.GROW
        if grow and not self.free:
            return
        best, bj, bv = self.gain, -1, -1
        for j, job in enumerate(self.jobs):
            t = self.tabu[j]
            groups = job.adds if grow else [(val, mask, False) for val, mask in job.removes]
            for val, mask, spread in groups:
                if val > best or (val == best and j != bj):
                    continue
                if grow:
                    mask &= self.free & (self.intf[j] if spread else -1)
                v = self._first_allowed(val, mask, t, False)
                if v >= 0 and (val < best or v < bv):
                    best, bj, bv = val, j, v
        if bj >= 0:
            self._take(best, kind, ((bj, bv, 1 if grow else -1),))

    def transfer(self, cells: list[_MoveCell]) -> None:
        """Job a gives its GPU on node v to job b (rows: cells in order; then b)."""
        intf = self.intf
        groups = sorted(
            (
                (val, b, mask & intf[b] if spread else mask)
                for b, job in enumerate(self.jobs)
                for val, mask, spread in job.adds
            ),
            key=lambda g: g[0],
        )
        if not groups:
            return
        lowest = groups[0][0]
        tabu, asp = self.tabu, self.asp
        best, found = self.gain, (-1, -1, 0.0)
        for cell in cells:
            x = cell.remove
            if not x + lowest < best:
                continue
            a, bit = cell.job, 1 << cell.node
            held = bool(tabu[a] & bit)
            # Groups come by ascending y, so x + y too (rounding is monotone): the
            # first allowed group holds the row minimum.
            for y, b, mask in groups:
                if b == a or not mask & bit:
                    continue
                val = x + y
                if not val < best:
                    break
                if (held or tabu[b] & bit) and not val < asp:
                    if held:
                        break
                    continue
                best, found = val, (a, cell.node, x)
                break
        a, v, x = found
        if a < 0:
            return
        # The first column of the row minimum (x + y may tie for different y).
        bit = 1 << v
        for b, job in enumerate(self.jobs):
            if b == a:
                continue
            for y, mask, spread in job.adds:
                val = x + y
                blocked = (tabu[a] | tabu[b]) & bit
                if spread:
                    mask &= intf[b]
                if mask & bit and val == best and (not blocked or val < asp):
                    self._take(best, MoveKind.TRANSFER, ((a, v, -1), (b, v, 1)))
                    return
        raise AssertionError("transfer: the row minimum has no column")  # pragma: no cover

    def move_gpu(self, cells: list[_MoveCell]) -> None:
        """Job a moves its GPU on node v to a node w with a free GPU."""
        free = self.free
        if not free:
            return
        best, found = self.gain, (-1, -1, -1)
        for cell in cells:
            if not cell.bound < best:
                continue
            a, v = cell.job, cell.node
            t = self.tabu[a]
            held = bool(t >> v & 1)
            for i, (val, mask) in enumerate(zip(cell.values, cell.masks, strict=True)):
                sub = mask & free
                if cell.spread[i >> 1]:
                    sub &= self.intf[a]
                if not sub or val > best or (val == best and found[:2] != (a, v)):
                    continue
                w = self._first_allowed(val, sub, t, held)
                if w >= 0 and (val < best or w < found[2]):
                    best, found = val, (a, v, w)
        a, v, w = found
        if a >= 0:
            self._take(best, MoveKind.MOVE, ((a, v, -1), (a, w, 1)))

    def move_value(self, cell: _MoveCell, w: int) -> tuple[float, int]:
        """(cost change, node count after) of ``cell``'s GPU moving to node ``w``
        (inf if not allowed; node capacity not checked)."""
        bit = 1 << w
        row = self.s.rows[cell.job]
        off = 0 if row.on & bit else 2
        i = off + (0 if row.lt & bit else 1)
        if cell.masks[i] & bit and (not cell.spread[off >> 1] or self.intf[cell.job] & bit):
            return cell.values[i], cell.nodes + (off >> 1)
        return _INF, 0

    def swap(self, cells: list[_MoveCell]) -> None:
        """Job a1's GPU on v1 goes to v2 and job a2's GPU on v2 goes to v1.

        The reference's swap matrix is symmetric, so its first minimum has c1 < c2.
        With interference avoidance a pair of cells that both stay distributed
        (``nodes`` > 1 whatever the target) is never allowed, so a distributed cell
        is bounded by the cells after it that are not.
        """
        count = len(cells)
        avoid = self.s.st.avoid
        suffix = [_INF] * (count + 1)
        single = [_INF] * (count + 1)  # over cells with nodes <= 1
        for i in range(count - 1, -1, -1):
            bound = cells[i].bound
            suffix[i] = min(bound, suffix[i + 1])
            single[i] = min(bound, single[i + 1]) if cells[i].nodes <= 1 else single[i + 1]
        tabu, asp = self.tabu, self.asp
        best, found = self.gain, (-1, -1, -1, -1)
        for i in range(count - 1):
            first = cells[i]
            low1 = first.bound
            spread = avoid and first.nodes > 1
            if not low1 + (single if spread else suffix)[i + 1] < best:
                continue
            a1, v1 = first.job, first.node
            for second in cells[i + 1 :]:
                a2, v2 = second.job, second.node
                if a2 == a1 or v2 == v1 or not low1 + second.bound < best:
                    continue
                if spread and second.nodes > 1:
                    continue
                h1, n1 = self.move_value(first, v2)
                if not h1 + second.bound < best:
                    continue
                h2, n2 = self.move_value(second, v1)
                if h2 == _INF or (avoid and n1 > 1 and n2 > 1):
                    continue
                val = h1 + h2
                if not val < best:
                    continue
                pair = (1 << v1) | (1 << v2)
                if (tabu[a1] & pair or tabu[a2] & pair) and not val < asp:
                    continue
                best, found = val, (a1, v1, a2, v2)
        a1, v1, a2, v2 = found
        if a1 >= 0:
            moves = ((a1, v1, -1), (a1, v2, 1), (a2, v2, -1), (a2, v1, 1))
            self._take(best, MoveKind.SWAP, moves)

    def consolidate(self) -> None:
        """A multi-node job moves onto the fitting node with the least room."""
        s, st = self.s, self.s.st
        best, bj, target = self.gain, -1, -1
        for j, info in enumerate(s.rows):
            k = info.k
            if info.n < 2 or k <= 0:
                continue
            pair = st.memo[j][1, k]
            c0 = info.cost
            if not min(pair[0] - c0, pair[1] - c0) < best:
                continue
            row, to, least, roomy = s.m[j], -1, 0, 0
            for v, f in enumerate(s.free):
                room = f + row[v]
                if room > 0:
                    roomy |= 1 << v
                if room >= k and (to < 0 or room < least):
                    to, least = v, room
            if to < 0:
                continue
            same = st.base[j][to] == k and st.base_k[j] == k
            val = pair[st.out[j] or not same] - c0
            if not val < best or (self.tabu[j] & (info.on | roomy) and not val < self.asp):
                continue
            best, bj, target = val, j, to
        if bj >= 0:
            row, info = s.m[bj], s.rows[bj]
            cells = tuple((bj, v, -row[v]) for v in _bits(info.on) if v != target)
            cells += ((bj, target, info.k - row[target]),)
            self._take(best, MoveKind.CONSOLIDATE, cells)
