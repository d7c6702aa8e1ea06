"""DeepBoot ATS-T: exact group-knapsack GPU counts, then best-fit placement (§2.4).

Faithful to the reference artifact's ``dp.py`` (czq693497091/DeepBoot):

* Jobs in the reference order: pinned (``min_replicas > 0`` with GPUs) first, then
  ascending attained service, then submission time (and name, for determinism).
* Group j = job j; item k = "j gets k GPUs", weight k, for k = max(min_replicas, 1) ..
  max_replicas (capped by the GPUs available); "0 GPUs" is always allowed.
* value_j(k) = speedup_j(N_k, k) * penalty_j(k), the speedup over the job's goodput at
  its fair share (1 node, ceil(GPUs / jobs) replicas), as the artifact re-bases it; a
  job without a model scales linearly, ``k / fair``.
* penalty_j(k) = max(age - restarts * delta, 0) / (age + delta) when k differs from the
  job's current GPU count (a queued job's count is 0), 1 otherwise; delta = 10 s, or
  the job's own resize cost where its view has a larger one (``JobView.restart_cost``,
  e.g. a ``resize="restart"`` job's cold delay; ``per_job_delta=false`` ignores it).
* Ties go as in the artifact: the forward pass keeps the first maximum, and the
  backtrack takes the smallest k that reaches the optimum, preferring an item over
  "0 GPUs" (so a job whose value is 0, e.g. a brand-new one, still gets spare GPUs).
* Counts become placements in ascending count order: unchanged counts keep their
  placement (when it still fits), the others are best-fitted: the node with the fewest
  free GPUs that holds the rest of the job, else the node with the most free GPUs and
  continue (:attr:`~deepboot.policies.packing.Packing.BEST_FIT`).

Beyond the artifact, off by default: ``objective = "power-mean"`` makes value_j(k) Pollux's
per-job term of its p-power mean of speedups instead of the speedup itself (see
:func:`power_mean_values`): the paper's sum gives GPUs to the jobs that scale almost
linearly and queues the many small ones (1.09x Pollux's average JCT on ``middle.csv``
with no inference, 1.02x with this objective: docs/benchmarks.md, "Why DeepBoot's
allocator trails Pollux's").

Deviations from the artifact (all noted in the report):

* N_k, the node count the speedup of k GPUs is taken at, is the fewest nodes of the
  *available* capacities that hold k GPUs (the artifact divides by the node size,
  which is the same when every node is fully available); for the job's current count
  it is its current node count.
* ``hysteresis`` (default 0, i.e. off) additionally scales the value of a changed count
  by ``1 - hysteresis``: a knob against restart thrash.
* A kept placement must fit the capacity of this round (the artifact never checks).

The DP is O(J * G * K) time with NumPy rows: for each job one ``(K, G + 1)`` add of
shifted views of the previous row and one max over K. Rows only span the GPUs the jobs
so far can use, and items past a job's first maximal value are dropped (a larger k
with no more value can never be the smallest optimal choice), both exactly. The rows
are kept for the backtrack: J x (G + 1) floats at most (65 MB at 2,000 x 4,096).
Placement buckets nodes by free GPUs, so best fit costs O(C + log V) a step instead of
a scan of the V nodes. ``bench/ats_t_scale.py`` times it all.
"""

from __future__ import annotations

import enum
import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, TypeAlias

import numpy as np
import numpy.typing as npt

from deepboot.core.modes import JobMode
from deepboot.core.placement import Allocation, Placement, freeze_allocation
from deepboot.core.state import ClusterState, JobView
from deepboot.perf import detmath
from deepboot.perf.speedup import SpeedupProvider, adaptive_speedup, speedup_rows
from deepboot.policies.allocation import (
    capacity_profile,
    fair_replicas,
    fair_share_base,
    group_knapsack,
    nodes_for,
    realloc_factor,
    reference_order,
    restart_delta,
)
from deepboot.policies.knapsack_core import core_knapsack_matrix
from deepboot.policies.packing import Packing, fits, free_map, keep_or_pack
from deepboot.policies.registration import MAX_DELAY_S, require

FloatArray: TypeAlias = npt.NDArray[np.float64]
IntArray: TypeAlias = npt.NDArray[np.int64]


class Objective(enum.Enum):
    """What ATS-T's knapsack maximizes."""

    SUM = "sum"
    """The paper's: the sum of the jobs' (penalised) speedups."""
    POWER_MEAN = "power-mean"
    """Pollux's: their ``p``-power mean, separable, so the knapsack maximizes it
    exactly (:func:`power_mean_values`)."""


class Solver(enum.Enum):
    """How ATS-T's knapsack is solved."""

    DP = "dp"
    """The reference DP (:func:`group_knapsack`): the artifact's choice among ties."""
    CORE = "core"
    """The Lagrangian reduction to a small core, then that DP
    (:func:`~deepboot.policies.knapsack_core.core_knapsack_matrix`): the same optimal
    value, several times faster at thousands of jobs; ties may go otherwise."""


SPEEDUP_FLOOR = 1e-3
"""The floor added to a scaled speedup in the power mean (Pollux's)."""


@dataclass(frozen=True, slots=True)
class DeepBootConfig:
    """Parameters of :class:`DeepBootPolicy` (reference values as defaults).

    Attributes:
        restart_delay: delta of the restart penalty, seconds. Reference: 10. > 0.
        per_job_delta: A job whose view has a ``restart_cost`` above
            ``restart_delay`` is penalised with it as its delta (a restart job is
            resized less eagerly than an AFE one; :func:`restart_delta`); False:
            ``restart_delay`` for every job (the uniform-cost ablation).
        hysteresis: Extra discount of a changed GPU count, in [0, 1): its value is
            multiplied by ``1 - hysteresis`` on top of the penalty. Reference: 0.
        packing: How a job whose count changed is placed (reference: best fit).
        objective: What the knapsack maximizes: the paper's ``sum`` of speedups
            (reference), or Pollux's ``power-mean`` of them (:class:`Objective`).
        p: The power mean's exponent, in [-10, 0] (0: the geometric mean; Pollux's
            -1 favours the jobs furthest behind). Only with ``power-mean``.
        solver: How the knapsack is solved (:class:`Solver`): the reference ``dp``,
            or ``core``, exact in value and faster on large clusters.
    """

    restart_delay: float = 10.0
    hysteresis: float = 0.0
    per_job_delta: bool = True
    packing: Packing = Packing.BEST_FIT
    objective: Objective = Objective.SUM
    p: float = -1.0
    solver: Solver = Solver.DP

    def __post_init__(self) -> None:
        require(
            math.isfinite(self.restart_delay) and 0 < self.restart_delay <= MAX_DELAY_S,
            "restart_delay",
            f"must be in (0, {MAX_DELAY_S:g}] seconds; got {self.restart_delay}",
        )
        require(
            0.0 <= self.hysteresis < 1.0,
            "hysteresis",
            f"must be in [0, 1); got {self.hysteresis}",
        )
        require(
            math.isfinite(self.p) and -10.0 <= self.p <= 0.0,
            "p",
            f"must be in [-10, 0] (decreasing returns in a job's speedup); got {self.p}",
        )


def restart_penalty(job: JobView, now: float, delta: float) -> float:
    """``max(age - restarts * delta, 0) / (age + delta)`` of ``job`` at ``now``."""
    return realloc_factor(job.age(now), job.num_restarts, delta)


def job_values(
    job: JobView,
    now: float,
    total: int,
    fair: int,
    profile: IntArray,
    capacity: Mapping[int, int],
    config: DeepBootConfig,
    speedup: SpeedupProvider = adaptive_speedup,
) -> tuple[int, FloatArray]:
    """The knapsack items of one job: (smallest count, value of each count from it).

    Args:
        job: The job.
        now: Current time (s), for its age.
        total: GPUs available in all.
        fair: The fair share in GPUs.
        profile: :func:`capacity_profile` of the available GPUs.
        capacity: Available GPUs per node.
        config: Penalty parameters (the job's delta: :func:`restart_delta`).
        speedup: Raw speedup function per job.

    Returns:
        ``(low, values)``: ``values[t]`` for ``low + t`` GPUs; empty when the job
        cannot run (``max_replicas`` below its minimum).
    """
    lo = max(job.min_replicas, 1)
    hi = min(job.max_replicas, total)
    if hi < lo:
        return lo, np.zeros(0)
    ks = np.arange(lo, hi + 2, dtype=np.int64)
    ns = nodes_for(ks, profile)
    current = job.placement
    cur = current.num_replicas
    if lo <= cur <= hi and fits(capacity, current):
        ns[cur - lo] = current.num_nodes
    # One call per job: the counts, then the fair share (1 node, ``fair`` GPUs) last.
    ks[-1], ns[-1] = fair, 1
    fn = speedup(job)
    raw = np.asarray(fn(ns, ks), dtype=np.float64)
    base = float(raw[-1])
    if not (math.isfinite(base) and base > 0):
        base = fair_share_base(fn, fair)
    s = raw[:-1] / base
    s = np.where(np.isfinite(s), np.maximum(s, 0.0), 0.0)
    delta = restart_delta(job, config.restart_delay, config.per_job_delta)
    change = restart_penalty(job, now, delta) * (1.0 - config.hysteresis)
    return lo, np.where(ks[:-1] == cur, s, s * change)


def power_mean_values(x: FloatArray, p: float) -> FloatArray:
    """Knapsack values whose sum is maximal where the ``p``-power mean of the scaled
    speedups ``x`` is (Pollux's fitness, with its floor :data:`SPEEDUP_FLOOR`).

    For p < 0 the mean is maximal where ``sum((x_j + floor)^p)`` is minimal, and for
    p = 0 (the geometric mean) where ``sum(log(max(x_j, floor)))`` is maximal: both are
    sums of one term per job, so a job's value for a count is its term's gain over "0
    GPUs" (whose value stays 0, as the knapsack takes it). With p = -1 a job left at 0
    costs ``1/floor``: the knapsack queues a job only when no GPU is left to give it.
    ``detmath`` and plain division, not NumPy's ``log`` and ``**``, whose kernels
    depend on the CPU: the same counts on every machine.
    """
    floor = SPEEDUP_FLOOR
    if p == 0:
        return np.asarray(
            detmath.log(np.maximum(x, floor)) - detmath.log(np.asarray([floor]))[0],
            dtype=np.float64,
        )
    if p == -1:
        return np.asarray(1.0 / floor - 1.0 / (x + floor), dtype=np.float64)
    base = float(detmath.pow(np.asarray([floor]), p)[0])
    return np.asarray(base - detmath.pow(x + floor, p), dtype=np.float64)


@dataclass(frozen=True, slots=True)
class Items:
    """ATS-T's knapsack before it is solved.

    Attributes:
        jobs: The jobs in the reference order.
        low: Each job's smallest count, shape (J,).
        values: ``values[j, t]`` is job j's value for ``low[j] + t`` GPUs (under the
            objective), ``-inf`` past its largest count; shape (J, M).
        sizes: How many counts each job has (its finite prefix), shape (J,).
        total: The GPUs available in all.
    """

    jobs: list[JobView]
    low: IntArray
    values: FloatArray
    sizes: IntArray
    total: int

    def rows(self) -> list[FloatArray]:
        """``values`` as one array per job, without the padding."""
        return [self.values[j, : int(m)] for j, m in enumerate(self.sizes)]


def ats_t_matrix(
    state: ClusterState,
    config: DeepBootConfig = DeepBootConfig(),
    speedup: SpeedupProvider = adaptive_speedup,
) -> Items:
    """ATS-T's knapsack items for every job at once.

    Row j is :func:`job_values` of job j (then :func:`power_mean_values` under
    ``power-mean``), bit for bit: the same operations element by element, on one
    (J, M) matrix instead of J small arrays, and one :func:`speedup_rows` read of the
    jobs' speedups (tests/policies/test_ats_t.py compares the two).
    """
    jobs = reference_order(state.jobs)
    capacity = free_map(state)
    total = sum(capacity.values())
    if not jobs or total == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Items(jobs, empty, np.zeros((0, 0)), empty, total)
    fair = fair_replicas(total, len(jobs))
    profile = capacity_profile(capacity.values())
    count = len(jobs)
    low = np.empty(count, dtype=np.int64)
    sizes = np.empty(count, dtype=np.int64)
    cur = np.empty(count, dtype=np.int64)
    change = np.empty(count, dtype=np.float64)
    kept: list[tuple[int, int, int]] = []  # (job, column, nodes) of a placement kept
    for j, job in enumerate(jobs):
        lo = max(job.min_replicas, 1)
        hi = min(job.max_replicas, total)
        low[j] = lo
        sizes[j] = max(hi - lo + 1, 0)
        current = job.placement
        cur[j] = c = current.num_replicas
        if lo <= c <= hi and fits(capacity, current):
            kept.append((j, c - lo, current.num_nodes))
        delta = restart_delta(job, config.restart_delay, config.per_job_delta)
        change[j] = restart_penalty(job, state.now, delta) * (1.0 - config.hysteresis)
    width = max(int(sizes.max()), 1)
    steps = np.arange(width, dtype=np.int64)
    valid = steps[None, :] < sizes[:, None]
    # Counts past a job's last are scored at 1 GPU (a valid pair), then masked.
    ks = np.where(valid, low[:, None] + steps[None, :], 1)
    ns = nodes_for(ks, profile)
    for j, col, nodes in kept:
        ns[j, col] = nodes
    # The fair share (1 node, ``fair`` GPUs) last, as job_values asks for it.
    ks = np.concatenate((ks, np.full((count, 1), fair, dtype=np.int64)), axis=1)
    ns = np.concatenate((ns, np.ones((count, 1), dtype=np.int64)), axis=1)
    fns = [speedup(job) for job in jobs]
    raw = speedup_rows(fns, ns, ks)
    base = raw[:, -1].copy()
    for row in np.flatnonzero(~(np.isfinite(base) & (base > 0))):
        base[row] = fair_share_base(fns[row], fair)
    s = raw[:, :-1] / base[:, None]
    s = np.where(np.isfinite(s), np.maximum(s, 0.0), 0.0)
    values = np.where(ks[:, :-1] == cur[:, None], s, s * change[:, None])
    if config.objective is Objective.POWER_MEAN:
        values = power_mean_values(values * (len(capacity) / total), config.p)
    values = np.where(valid, values, -np.inf)
    return Items(jobs, low, values, sizes, total)


def ats_t_items(
    state: ClusterState,
    config: DeepBootConfig = DeepBootConfig(),
    speedup: SpeedupProvider = adaptive_speedup,
) -> tuple[list[JobView], list[int], list[FloatArray], int]:
    """ATS-T's knapsack before it is solved: the jobs in the reference order, each
    one's smallest count and the values of its counts from there (under
    ``config.objective``), and the GPUs available in all (:func:`ats_t_matrix`, one
    array per job)."""
    items = ats_t_matrix(state, config, speedup)
    if items.low.size == 0:
        return items.jobs, [], [], items.total
    return items.jobs, [int(lo) for lo in items.low], items.rows(), items.total


def ats_t_counts(
    state: ClusterState,
    config: DeepBootConfig = DeepBootConfig(),
    speedup: SpeedupProvider = adaptive_speedup,
) -> dict[str, int]:
    """ATS-T's GPU count per job (0 included), before placement.

    Args:
        state: The snapshot; never mutated.
        config: Penalty parameters and the objective.
        speedup: Raw speedup function per job.

    Returns:
        Job name -> GPUs, summing to at most the total capacity of ``state``, the
        jobs in the reference order (:func:`reference_order`).
    """
    items = ats_t_matrix(state, config, speedup)
    if items.low.size == 0:
        return {j.name: 0 for j in items.jobs}
    if config.solver is Solver.CORE:
        counts = core_knapsack_matrix(items.values, items.low, items.total)
    else:
        counts = group_knapsack(items.rows(), [int(lo) for lo in items.low], items.total)
    return {job.name: k for job, k in zip(items.jobs, counts, strict=True)}


class _FreeNodes:
    """Free GPUs per node, bucketed by count, for best-fit placement in O(C + log V) a
    step (C = the largest node capacity) instead of a scan over the V nodes.

    Each bucket is a heap of node ids; an entry is stale once its node's count moved
    (counts only fall while placing) and is dropped when met.
    """

    __slots__ = ("free", "total", "_buckets")

    def __init__(self, free: Mapping[int, int]) -> None:
        self.free = {n: c for n, c in free.items() if c > 0}
        self.total = sum(self.free.values())
        self._buckets: list[list[int]] = [[] for _ in range(max(self.free.values(), default=0) + 1)]
        for node in sorted(self.free):
            self._buckets[self.free[node]].append(node)

    def take(self, node: int, count: int) -> None:
        left = self.free[node] - count
        self.free[node] = left
        self.total -= count
        if left > 0:
            heapq.heappush(self._buckets[left], node)

    def _lowest(self, count: int) -> int | None:
        bucket = self._buckets[count]
        while bucket and self.free[bucket[0]] != count:
            heapq.heappop(bucket)
        return bucket[0] if bucket else None

    def fitting(self, need: int) -> int | None:
        """The node with the fewest free GPUs >= ``need`` (lowest id on ties), or None."""
        for count in range(need, len(self._buckets)):
            node = self._lowest(count)
            if node is not None:
                return node
        return None

    def fullest(self) -> int:
        """The node with the most free GPUs (lowest id on ties); some must be free."""
        for count in range(len(self._buckets) - 1, 0, -1):
            node = self._lowest(count)
            if node is not None:
                return node
        raise ValueError("no free GPU left")


def best_fit_place(
    order: Sequence[tuple[JobView, int]], capacity: Mapping[int, int]
) -> dict[str, Placement]:
    """Place jobs with known GPU counts: the same result as
    ``keep_or_pack(order, capacity, Packing.BEST_FIT)``, fast on large clusters.

    First every job whose current placement has exactly its count and still fits keeps
    it (in ``order``); then the others, in ``order``, take the node with the fewest
    free GPUs that holds the rest of the job, else the node with the most free GPUs,
    and continue.

    Args:
        order: ``(job, gpus)`` in placement order; gpus >= 1.
        capacity: GPUs available per node; never mutated.

    Returns:
        Job name -> placement of every job that could be placed.
    """
    nodes = _FreeNodes(capacity)
    out: dict[str, Placement] = {}
    for job, gpus in order:
        current = job.placement
        if current.num_replicas == gpus and fits(nodes.free, current):
            for node, count in current.counts().items():
                nodes.take(node, count)
            out[job.name] = current
    for job, gpus in order:
        if job.name in out or gpus > nodes.total:
            continue
        counts: dict[int, int] = {}
        need = gpus
        while need > 0:
            fit = nodes.fitting(need)
            if fit is not None:
                counts[fit] = need
                nodes.take(fit, need)
                break
            # No node holds the rest: take the fullest whole (the fewest nodes overall).
            full = nodes.fullest()
            got = nodes.free[full]
            counts[full] = got
            nodes.take(full, got)
            need -= got
        out[job.name] = Placement.from_counts(counts)
    return out


@dataclass(frozen=True, slots=True)
class DeepBootPolicy:
    """ATS-T: the knapsack over speedups with the restart penalty, then best fit."""

    config: DeepBootConfig = DeepBootConfig()
    name: ClassVar[str] = "deepboot"
    job_mode: ClassVar[JobMode] = JobMode.ADAPTIVE

    def gpu_counts(self, state: ClusterState) -> dict[str, int]:
        """GPU count per job name (0 included), before placement."""
        return ats_t_counts(state, self.config)

    def allocate(self, state: ClusterState, rng: np.random.Generator) -> Allocation:
        """Return the allocation; ``state`` is never mutated and ``rng`` is unused."""
        del rng
        counts = self.gpu_counts(state)
        # gpu_counts lists the jobs in the reference order: its rank, without a re-sort.
        rank = {name: i for i, name in enumerate(counts)}
        order = sorted(
            ((j, counts[j.name]) for j in state.jobs if counts[j.name] > 0),
            key=lambda p: (p[1], rank[p[0].name]),
        )
        if self.config.packing is Packing.BEST_FIT:
            placed = best_fit_place(order, free_map(state))
        else:
            placed = keep_or_pack(order, free_map(state), self.config.packing)
        return freeze_allocation(placed)
