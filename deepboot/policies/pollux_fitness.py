"""The Pollux objective: config, per-round problem arrays, and the fitness function.

The fitness is the reference's (petuum/adaptdl ``simulator/pollux.py``, ``Problem``):

* Jobs are ordered as the reference orders them: pinned first (``min_replicas > 0``
  with a current placement), then ascending attained service, then submission time
  (and name, for determinism). Only ties in the search depend on this order.
* A job's speedup on (N nodes, K replicas) is its goodput there over its goodput at
  the *fair share*: 1 node and ``ceil(total GPUs / jobs)`` replicas. A job without a
  fitted model has ``K / fair_replicas`` (linear).
* Speedups are scaled by ``nodes / total GPUs`` (the reference's dominant share times
  the node count: a node's worth of GPUs is 1).
* A job whose allocation row (GPUs per node) differs from its current one is
  multiplied by the realloc factor ``max(age - restarts * delta, 0) / (age + delta)``;
  delta is ``restart_delay``, or the job's own resize cost where its view has a
  larger one (``JobView.restart_cost``; ``per_job_delta=false`` ignores it).
* Power mean over **all** jobs, those with 0 GPUs included (as speedup 0):
  ``(sum((x + 1e-3) ** p) / J) ** (1 / p)``; for ``p == 0`` the geometric mean of
  ``max(x, 1e-3)``.
* A job holding fewer than ``min_replicas`` GPUs counts as holding none (the
  reference's repair zeroes such rows before every evaluation).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from deepboot.core.placement import EMPTY, Allocation
from deepboot.core.state import ClusterState
from deepboot.perf import detmath
from deepboot.perf.speedup import (
    FixedBatchSpeedup,
    SpeedupFn,
    SpeedupModel,
    SpeedupProvider,
    adaptive_speedup,
    linear_speedup,
)
from deepboot.policies.allocation import fair_share_base, reference_order, restart_delta
from deepboot.policies.registration import MAX_DELAY_S, require

FloatArray: TypeAlias = npt.NDArray[np.float64]
IntArray: TypeAlias = npt.NDArray[np.int64]
BoolArray: TypeAlias = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class PolluxConfig:
    """Parameters of the Pollux policy (reference values as defaults).

    Attributes:
        p: Power-mean exponent; more negative is fairer. Reference: -1.
        restart_delay: delta of the realloc factor, seconds. Reference: 30. > 0.
        per_job_delta: A job whose view has a ``restart_cost`` above
            ``restart_delay`` gets it as its delta (a restart job is reallocated less
            eagerly than an AFE one; :func:`~deepboot.policies.allocation.restart_delta`);
            False: ``restart_delay`` for every job (the uniform-cost ablation).
        speedup_floor: The 1e-3 added to each scaled speedup in the power mean (used
            as a floor for p == 0). > 0.
        interference_avoidance: At most one distributed (multi-node) job per node.
        max_nodes_per_job: Most nodes one job may span (the reference repair's 16).
        max_search_rounds: Knapsack/packing rounds: each round re-solves the knapsack
            with the costs packing really achieved for jobs that missed their plan.
        max_search_moves: Safety cap on local-search moves per candidate start.
        tabu_moves: Moves of the final tabu search (run only while the result misses
            the knapsack lower bound); 0 disables it.
        tabu_tenure: Moves during which a changed (job, node) cell may not change back.
    """

    p: float = -1.0
    restart_delay: float = 30.0
    speedup_floor: float = 1e-3
    per_job_delta: bool = True
    interference_avoidance: bool = True
    max_nodes_per_job: int = 16
    max_search_rounds: int = 6
    max_search_moves: int = 10_000
    tabu_moves: int = 60
    tabu_tenure: int = 4

    def __post_init__(self) -> None:
        # Ranges keep every term of the fitness finite: x^p of a speedup in
        # [1e-3, 64] stays within double range for |p| <= 10 (p = 1000 underflowed
        # every fitness to 0 and stopped all scheduling).
        require(-10.0 <= self.p <= 1.0, "p", f"must be in [-10, 1]; got {self.p}")
        require(
            math.isfinite(self.restart_delay) and 0 < self.restart_delay <= MAX_DELAY_S,
            "restart_delay",
            f"must be in (0, {MAX_DELAY_S:g}] seconds; got {self.restart_delay}",
        )
        require(
            1e-9 <= self.speedup_floor <= 1.0,
            "speedup_floor",
            f"must be in [1e-9, 1]; got {self.speedup_floor}",
        )
        require(
            self.max_nodes_per_job >= 1,
            "max_nodes_per_job",
            f"must be >= 1; got {self.max_nodes_per_job}",
        )
        require(
            self.max_search_rounds >= 1,
            "max_search_rounds",
            f"must be >= 1; got {self.max_search_rounds}",
        )
        require(self.tabu_moves >= 0, "tabu_moves", f"must be >= 0; got {self.tabu_moves}")
        require(self.tabu_tenure >= 0, "tabu_tenure", f"must be >= 0; got {self.tabu_tenure}")
        require(
            self.max_search_moves >= 0,
            "max_search_moves",
            f"must be >= 0; got {self.max_search_moves}",
        )


class PolluxProblem:
    """Arrays of one scheduling round, and cached speedups. Built per ``allocate`` call.

    Attributes (J jobs in reference order, V nodes with capacity > 0, ascending id):
        jobs: The jobs, in reference order.
        node_ids: (V,) node ids.
        capacity: (V,) GPUs per node.
        base: (J, V) current GPUs per node (GPUs on other nodes are not in it).
        base_outside: (J,) the job holds GPUs on a node without capacity now, so any
            allocation changes it.
        min_replicas, max_replicas: (J,) bounds; ``max_replicas`` also capped by the
            GPUs of the ``max_nodes_per_job`` largest nodes (0 = cannot run).
        factor: (J,) realloc factor, clamped at 0.
        scale: nodes / total GPUs.
        fair_replicas: ceil(total GPUs / J).

    The speedup table, the per-job cost memo (:meth:`cost_memo`) and the search's
    memos (``search_memo`` of :mod:`~deepboot.policies.pollux_search`, ``row_memo`` of
    :mod:`~deepboot.policies.pollux_state`) are filled lazily and are the only mutable
    parts; the problem is private to one ``allocate`` call.
    """

    def __init__(
        self,
        state: ClusterState,
        config: PolluxConfig,
        speedup: SpeedupProvider = adaptive_speedup,
    ) -> None:
        self.config = config
        self.jobs = reference_order(state.jobs)
        nodes = [(n, c) for n, c in sorted(state.capacity.items()) if c > 0]
        self.node_ids: IntArray = np.array([n for n, _ in nodes], dtype=np.int64)
        self.capacity: IntArray = np.array([c for _, c in nodes], dtype=np.int64)
        num_jobs, num_nodes = len(self.jobs), len(nodes)
        total = int(self.capacity.sum())
        self.total_gpus = total
        self.scale = num_nodes / total if total > 0 else 0.0
        self.fair_replicas = max(math.ceil(total / num_jobs), 1) if num_jobs else 1
        col = {int(n): i for i, n in enumerate(self.node_ids)}

        self.base: IntArray = np.zeros((num_jobs, num_nodes), dtype=np.int64)
        self.base_outside: BoolArray = np.zeros(num_jobs, dtype=bool)
        for j, job in enumerate(self.jobs):
            for node, count in job.placement.counts().items():
                if node in col:
                    self.base[j, col[node]] += count
                else:
                    self.base_outside[j] = True

        reach = int(np.sort(self.capacity)[::-1][: config.max_nodes_per_job].sum())
        self.min_replicas: IntArray = np.array([j.min_replicas for j in self.jobs], np.int64)
        max_r = np.array([j.max_replicas for j in self.jobs], np.int64)
        max_r = np.minimum(max_r, reach)
        max_r = np.where(max_r >= np.maximum(self.min_replicas, 1), max_r, 0)
        self.max_replicas: IntArray = max_r.astype(np.int64)

        delta = np.array(
            [restart_delta(j, config.restart_delay, config.per_job_delta) for j in self.jobs],
            dtype=np.float64,
        )
        age = np.array([j.age(state.now) for j in self.jobs], dtype=np.float64)
        restarts = np.array([j.num_restarts for j in self.jobs], dtype=np.float64)
        self.factor: FloatArray = np.maximum(age - restarts * delta, 0.0) / (age + delta)
        self._factor_list: list[float] = self.factor.tolist()

        self._fns = [speedup(job) for job in self.jobs]
        self.two_level = all(
            fn is linear_speedup or isinstance(fn, SpeedupModel | FixedBatchSpeedup)
            for fn in self._fns
        )
        """Every job's speedup depends on its node count only through whether it spans
        more than one node: true of the perf layer's functions (their sync time is
        intra- or inter-node), unknown of another provider's (False)."""
        # Per job, its speedups on one node and on several, by replica count (see
        # two_level_rows); fetched on the job's first query.
        self._levels: list[tuple[list[float], list[float]] | None] = [None] * len(self.jobs)
        self._norm = np.array([self._fair_goodput(fn) for fn in self._fns], dtype=np.float64)
        self._norm_list: list[float] = self._norm.tolist()
        self._max_n = max(min(num_nodes, config.max_nodes_per_job), 1)
        self._max_k = max(int(self.max_replicas.max(initial=0)), 1)
        # _table[j, n, k]: speedup over the fair share, -1 until computed.
        self._table: FloatArray = np.full((num_jobs, self._max_n + 1, self._max_k + 1), -1.0)
        self._table[:, 0, 0] = 0.0
        # _memo[j][(n, k)] = (cost unchanged, cost changed): the scalar search's lookups.
        self._memo = [_CostMemo(self, j) for j in range(num_jobs)]
        self.costs_finite = True
        """False once any memoized cost is NaN or infinite (see :meth:`fill_costs`)."""
        self.search_memo: dict[tuple[object, ...], IntArray] = {}
        """Results of pure search steps on this problem, keyed by their inputs."""
        self.row_memo: dict[tuple[object, ...], object] = {}
        """The incremental search's per-problem values (see pollux_state)."""

    @property
    def num_jobs(self) -> int:
        return len(self.jobs)

    @property
    def num_nodes(self) -> int:
        return len(self.node_ids)

    def _fair_goodput(self, fn: SpeedupFn) -> float:
        # Without a feasible batch at the fair share (the reference would divide by
        # zero) fair_share_base assumes linear scaling up to it. Its queries go through
        # the raw-speedup memo (the same values; most were asked in earlier rounds).
        def memoized(n: npt.ArrayLike, k: npt.ArrayLike) -> FloatArray:
            nodes, reps = np.asarray(n, dtype=np.int64), np.asarray(k, dtype=np.int64)
            raw = raw_speedups(fn, nodes.ravel().tolist(), reps.ravel().tolist())
            return np.array(raw, dtype=np.float64).reshape(reps.shape)

        return fair_share_base(memoized, self.fair_replicas)

    def speedup(self, jobs: IntArray, nodes: IntArray, replicas: IntArray) -> FloatArray:
        """Speedup over the fair share, for index arrays of one shape (0 where K == 0).

        Args:
            jobs: Job indices.
            nodes: Node counts N (0 <= N <= K, N == 0 iff K == 0).
            replicas: Replica counts K.

        Returns:
            Float array of the same shape.
        """
        j = np.asarray(jobs, dtype=np.int64).ravel()
        n = np.asarray(nodes, dtype=np.int64).ravel()
        k = np.asarray(replicas, dtype=np.int64).ravel()
        if j.size and int(n.max()) <= self._max_n and int(k.max()) <= self._max_k:
            # Every query inside the table (the usual case): gather, fill, gather.
            vals = self._table[j, n, k]
            missing = vals < 0
            if missing.any():
                self._fill(j[missing], n[missing], k[missing])
                vals = self._table[j, n, k]
            return vals.reshape(np.shape(jobs))
        out = np.zeros(j.shape, dtype=np.float64)
        inside = (n <= self._max_n) & (k <= self._max_k)
        ji, ni, ki = j[inside], n[inside], k[inside]
        vals = self._table[ji, ni, ki]
        missing = vals < 0
        if np.any(missing):
            self._fill(ji[missing], ni[missing], ki[missing])
            vals = self._table[ji, ni, ki]
        out[inside] = vals
        if not np.all(inside):
            for idx in np.flatnonzero(~inside):
                out[idx] = self._direct(int(j[idx]), int(n[idx]), int(k[idx]))
        return out.reshape(np.shape(jobs))

    def _fill(self, j: IntArray, n: IntArray, k: IntArray) -> None:
        """Compute the table entries (j, n, k): each job's raw speedups (see
        :func:`raw_speedups`) over its fair-share goodput."""
        size_n, size_k = self._max_n + 1, self._max_k + 1
        codes = np.unique((j * size_n + n) * size_k + k)
        per_job = size_n * size_k
        job_of = codes // per_job
        rest = codes - job_of * per_job
        n_of = rest // size_k
        k_of = rest - n_of * size_k
        cuts = [0, *(np.flatnonzero(job_of[1:] != job_of[:-1]) + 1).tolist(), len(codes)]
        for lo, hi in zip(cuts[:-1], cuts[1:], strict=False):
            job = int(job_of[lo])
            pn, pk = n_of[lo:hi], k_of[lo:hi]
            raw = self._raw(job, pn.tolist(), pk.tolist())
            self._table[job, pn, pk] = np.array(raw, dtype=np.float64) / self._norm[job]

    def _raw(self, job: int, nodes: list[int], reps: list[int]) -> list[float]:
        """``raw_speedups`` of the job's function (the same values). With
        :attr:`two_level` speedups they come from the job's :func:`two_level_rows`
        (every replica count up to its max_replicas in one call, where single
        queries cost a call each); other counts and functions go through
        :func:`raw_speedups`."""
        if not self.two_level:
            return raw_speedups(self._fns[job], nodes, reps)
        rows = self._levels[job]
        if rows is None:
            size = max(int(self.max_replicas[job]), 1)
            rows = self._levels[job] = two_level_rows(self._fns[job], size)
        one, many = rows
        if max(reps, default=0) >= len(one):
            return raw_speedups(self._fns[job], nodes, reps)
        # The functions' own check (they raise on these; the rows would not).
        if any(n > k or n < (k > 0) for n, k in zip(nodes, reps, strict=True)):
            raise ValueError("speedup needs 0 <= num_nodes <= num_replicas, both 0 or both > 0")
        return [many[k] if n > 1 else one[k] for n, k in zip(nodes, reps, strict=True)]

    def _direct(self, j: int, n: int, k: int) -> float:
        if k <= 0:
            return 0.0
        arr = np.array([n], dtype=np.int64), np.array([k], dtype=np.int64)
        return float(self._fns[j](*arr)[0]) / float(self._norm[j])

    def costs(
        self, jobs: IntArray, nodes: IntArray, replicas: IntArray, changed: BoolArray
    ) -> FloatArray:
        """Per-job cost (lower is better) whose sum orders allocations as the fitness.

        cost = (x + floor)^p for p < 0, -(x + floor)^p for p > 0, -log(max(x, floor))
        for p == 0, with x = speedup * scale * (factor if changed else 1).

        Returns:
            Float array of the shape of the arguments.
        """
        s = self.speedup(jobs, nodes, replicas)
        mult = np.where(changed, self.factor[np.asarray(jobs, dtype=np.int64)], 1.0)
        return self.cost_of_scaled(s * self.scale * mult)

    def fill_costs(self, entries: list[tuple[int, int, int]]) -> None:
        """Memoize the costs of the ``(job, nodes, replicas)`` entries not memoized yet,
        both changed and unchanged, in one vectorized call.

        The values are those of :meth:`costs` element by element (its arithmetic is
        elementwise, so batching does not change a bit). Sets ``costs_finite`` to
        False when one of them is NaN or infinite.
        """
        jobs: list[int] = []
        nodes: list[int] = []
        reps: list[int] = []
        for j, n, k in entries:
            if (n, k) not in self._memo[j]:
                jobs.append(j)
                nodes.append(n)
                reps.append(k)
        if jobs:
            self._memoize(jobs, nodes, reps)

    def _memoize(self, jobs: list[int], nodes: list[int], reps: list[int]) -> None:
        size = len(jobs)
        if self.config.p == -1:
            # costs() for p == -1 is 1 / (s * scale * mult + floor) with s = raw speedup
            # / norm (0 at 0 GPUs), each operation rounded once in IEEE double: the same
            # operations on Python floats give the same bits (mult == 1.0 is exact), at a
            # fraction of NumPy's overhead.
            factor, floor, scale = self._factor_list, self.config.speedup_floor, self.scale
            pairs = []
            for job, s in zip(jobs, self._speedup_list(jobs, nodes, reps), strict=True):
                x = s * scale
                same, moved = x + floor, x * factor[job] + floor
                if same == 0.0 or moved == 0.0:  # NumPy gives inf; Python would raise
                    break
                pairs.append((1.0 / same, 1.0 / moved))
            else:
                if not all(math.isfinite(a) and math.isfinite(b) for a, b in pairs):
                    self.costs_finite = False
                for i, pair in enumerate(pairs):
                    self._memo[jobs[i]][nodes[i], reps[i]] = pair
                return
        j = np.array(jobs + jobs, dtype=np.int64)
        n = np.array(nodes + nodes, dtype=np.int64)
        k = np.array(reps + reps, dtype=np.int64)
        changed = np.arange(2 * size) >= size
        values = self.costs(j, n, k, changed)
        if not np.all(np.isfinite(values)):
            self.costs_finite = False
        same, moved = values[:size].tolist(), values[size:].tolist()
        for i in range(size):
            self._memo[jobs[i]][nodes[i], reps[i]] = (same[i], moved[i])

    def memo_costs(
        self, jobs: list[int], nodes: list[int], reps: list[int], changed: bool
    ) -> FloatArray:
        """``costs(jobs, nodes, reps, changed)`` for 1-D lists, through the memo (the
        same values; missing ones filled in one call)."""
        self.fill_costs(list(zip(jobs, nodes, reps, strict=True)))
        memo = self._memo
        return np.array(
            [memo[j][n, k][changed] for j, n, k in zip(jobs, nodes, reps, strict=True)],
            dtype=np.float64,
        )

    def _speedup_list(self, jobs: list[int], nodes: list[int], reps: list[int]) -> list[float]:
        """:meth:`speedup` of 1-D lists, as Python floats (the same values: raw / norm,
        or 0.0 at 0 GPUs)."""
        by_job: dict[int, list[int]] = {}
        for i, k in enumerate(reps):
            if k > 0:
                by_job.setdefault(jobs[i], []).append(i)
        out = [0.0] * len(jobs)
        for job, at in by_job.items():
            raw = self._raw(job, [nodes[i] for i in at], [reps[i] for i in at])
            norm = self._norm_list[job]
            for i, value in zip(at, raw, strict=True):
                out[i] = value / norm
        return out

    def cost_memo(self, j: int) -> dict[tuple[int, int], tuple[float, float]]:
        """Job ``j``'s memo: (nodes, replicas) -> (cost unchanged, cost changed), the
        values of :meth:`costs`. Filled by :meth:`fill_costs`; an entry not filled is
        computed alone on first lookup (correct, only slower) while the problem lives
        (the memo refers to it weakly; afterwards such a lookup raises KeyError)."""
        return self._memo[j]

    def cost_of_scaled(self, x: FloatArray) -> FloatArray:
        """Cost of scaled speedups ``x`` (see :meth:`costs`)."""
        p, floor = self.config.p, self.config.speedup_floor
        # detmath and plain division, not np.log / **: NumPy's kernels for those
        # depend on the CPU, and the search compares these costs.
        if p == 0:
            return np.asarray(-detmath.log(np.maximum(x, floor)), dtype=np.float64)
        if p == -1:
            return np.asarray(1.0 / (x + floor), dtype=np.float64)
        powered = detmath.pow(x + floor, p)
        return powered if p < 0 else -powered

    def fitness_of_total(self, total_cost: float) -> float:
        """The power mean given the summed cost of all jobs (0.0 with no jobs)."""
        if self.num_jobs == 0:
            return 0.0
        p = self.config.p
        mean = total_cost / self.num_jobs
        if p == 0:
            return detmath.exp_scalar(-mean)
        base = mean if p < 0 else -mean
        if p == -1:
            return 1.0 / base
        return detmath.pow_scalar(base, 1.0 / p)

    def matrix_of(self, allocation: Allocation) -> IntArray:
        """(J, V) GPUs per job and node of ``allocation`` (nodes without capacity dropped)."""
        col = {int(n): i for i, n in enumerate(self.node_ids)}
        out = np.zeros((self.num_jobs, self.num_nodes), dtype=np.int64)
        for j, job in enumerate(self.jobs):
            for node, count in allocation.get(job.name, EMPTY).counts().items():
                if node in col:
                    out[j, col[node]] += count
        return out

    def allocation_of(self, matrix: IntArray) -> dict[str, tuple[int, ...]]:
        """Job name -> node ids (one per GPU) of a (J, V) matrix; empty rows left out."""
        out: dict[str, tuple[int, ...]] = {}
        for j, job in enumerate(self.jobs):
            row = matrix[j]
            if row.sum() > 0:
                out[job.name] = tuple(
                    int(node) for node, c in zip(self.node_ids, row, strict=True) for _ in range(c)
                )
        return out

    def matrix_cost(self, matrix: IntArray) -> FloatArray:
        """(J,) per-job costs of a (J, V) matrix (rows below min_replicas count as 0)."""
        k = matrix.sum(axis=1)
        n = np.count_nonzero(matrix, axis=1)
        short = k < self.min_replicas
        k = np.where(short, 0, k)
        n = np.where(short, 0, n)
        changed = np.any(matrix != self.base, axis=1) | self.base_outside
        return self.costs(np.arange(self.num_jobs), n, k, changed)


_RAW: dict[int, tuple[SpeedupFn, dict[tuple[int, int], float]]] = {}
"""id(fn) -> (fn, its (nodes, replicas) -> value): see :func:`raw_speedups`."""

_RAW_FUNCTIONS = 4096
"""Functions :data:`_RAW` holds before it starts afresh."""


def raw_speedups(fn: SpeedupFn, nodes: list[int], replicas: list[int]) -> list[float]:
    """``fn(nodes, replicas)`` as Python floats, memoized per function object.

    A speedup function is pure and evaluates element by element (the contract of
    :data:`~deepboot.perf.speedup.SpeedupFn`), so a value does not depend on the pairs
    it was computed with. The functions of fitted jobs are shared across scheduling
    rounds (``speedup_fn`` caches them by parameters), so each round's problem finds
    most values here instead of calling them again. The memo holds each function
    (so its id stays its own) and starts afresh past ``_RAW_FUNCTIONS`` functions.
    """
    entry = _RAW.get(id(fn))
    if entry is None or entry[0] is not fn:
        if len(_RAW) >= _RAW_FUNCTIONS:
            _RAW.clear()
        entry = _RAW[id(fn)] = (fn, {})
    values = entry[1]
    missing = [p for p in zip(nodes, replicas, strict=True) if p not in values]
    if missing:
        todo = list(dict.fromkeys(missing))
        n = np.array([p[0] for p in todo], dtype=np.int64)
        k = np.array([p[1] for p in todo], dtype=np.int64)
        got = np.asarray(fn(n, k), dtype=np.float64).tolist()
        values.update(zip(todo, got, strict=True))
    return [values[p] for p in zip(nodes, replicas, strict=True)]


_LEVELS: dict[int, tuple[SpeedupFn, list[float], list[float]]] = {}
"""id(fn) -> (fn, its speedups on one node, on several): see :func:`two_level_rows`."""


def two_level_rows(fn: SpeedupFn, size: int) -> tuple[list[float], list[float]]:
    """A two-level function's speedups for 0..``size`` replicas (at least), on one node
    and on more than one, as Python floats; memoized per function object.

    For a function whose value depends on the node count N only through N > 1 (see
    :attr:`PolluxProblem.two_level`), ``one[k] == fn(1, k)`` and ``many[k] == fn(N, k)``
    for every 2 <= N <= k, bit for bit: computed by one call of the function on (1, k)
    and (2, k) for every k, since a speedup function evaluates element by element
    (:func:`raw_speedups`). Index 0 holds 0.0 (no replica); ``many[1]`` is NaN (one
    replica spans one node). Like :data:`_RAW`, the memo holds each function and starts
    afresh past ``_RAW_FUNCTIONS`` functions.
    """
    entry = _LEVELS.get(id(fn))
    if entry is not None and entry[0] is fn and len(entry[1]) > size:
        return entry[1], entry[2]
    if len(_LEVELS) >= _RAW_FUNCTIONS:
        _LEVELS.clear()
    ks = np.arange(1, size + 1, dtype=np.int64)
    nodes = np.concatenate((np.ones(size, dtype=np.int64), np.full(size - 1, 2, dtype=np.int64)))
    values = np.asarray(fn(nodes, np.concatenate((ks, ks[1:]))), dtype=np.float64).tolist()
    one = [0.0, *values[:size]]
    many = [0.0, math.nan, *values[size:]]
    _LEVELS[id(fn)] = (fn, one, many)
    return one, many


class _CostMemo(dict[tuple[int, int], tuple[float, float]]):
    """One job's (nodes, replicas) -> (cost unchanged, cost changed); a missing entry
    is computed by its problem (see :meth:`PolluxProblem.cost_memo`).

    It refers to its problem weakly: the problem holds its memos, and a cycle would
    leave each round's problem, memos and search results to the garbage collector,
    which scanned them at every collection (~0.2 s of a Pollux run); without one
    they go as soon as the round's ``allocate`` returns."""

    def __init__(self, problem: PolluxProblem, job: int) -> None:
        super().__init__()
        self._problem = weakref.ref(problem)
        self._job = job

    def __missing__(self, key: tuple[int, int]) -> tuple[float, float]:
        problem = self._problem()
        if problem is None:
            raise KeyError(key)  # its problem is gone: nothing can compute it
        problem._memoize([self._job], [key[0]], [key[1]])
        return self[key]


def pollux_fitness(
    state: ClusterState,
    allocation: Allocation,
    config: PolluxConfig,
    speedup: SpeedupProvider | None = None,
) -> float:
    """The Pollux power-mean fitness of ``allocation`` on ``state`` (higher is better).

    Any allocation can be scored, feasible or not; jobs absent from it hold no GPU and
    jobs not in ``state`` are ignored. A job changes (and gets the realloc factor) when
    its placement differs from its current one.

    Args:
        state: The snapshot; never mutated.
        allocation: Job name -> placement.
        config: Exponent, restart delay and floor.
        speedup: Raw speedup per job (default: the perf layer's ADAPTIVE speedup).

    Returns:
        The power mean; 0.0 when there are no jobs.
    """
    problem = PolluxProblem(state, config, speedup or adaptive_speedup)
    if problem.num_jobs == 0:
        return 0.0
    idx = np.arange(problem.num_jobs)
    placements = [allocation.get(job.name, EMPTY) for job in problem.jobs]
    k = np.array([p.num_replicas for p in placements], dtype=np.int64)
    n = np.array([p.num_nodes for p in placements], dtype=np.int64)
    short = k < problem.min_replicas
    k = np.where(short, 0, k)
    n = np.where(short, 0, n)
    changed = np.array(
        [p != job.placement for p, job in zip(placements, problem.jobs, strict=True)], dtype=bool
    )
    total = float(problem.costs(idx, n, k, changed).sum())
    return problem.fitness_of_total(total)
