"""Allocation helpers shared by the training policies (pure functions).

The job order of the reference artifacts, the fair share speedups are re-based on,
the capacity profile of the free GPUs per node, and the exact group knapsack that
DeepBoot's ATS-T and Lyra solve (see :mod:`deepboot.policies.deepboot` for the tie
rules it follows).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TypeAlias

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import as_strided

from deepboot.core.state import JobView
from deepboot.perf.speedup import SpeedupFn

FloatArray: TypeAlias = npt.NDArray[np.float64]
IntArray: TypeAlias = npt.NDArray[np.int64]


def reference_order(jobs: Sequence[JobView]) -> list[JobView]:
    """Jobs in the artifact's order: pinned, attained service, submission, name."""

    def pinned(job: JobView) -> bool:
        return job.min_replicas > 0 and bool(job.placement)

    return sorted(jobs, key=lambda j: (not pinned(j), j.attained_service, j.submit_time, j.name))


def restart_delta(job: JobView, default: float, per_job: bool = True) -> float:
    """The delta (seconds one resize costs) a restart penalty charges ``job``.

    ``max(default, job.restart_cost)`` when the job has a ``restart_cost`` and
    ``per_job`` is set, else ``default`` (the policy's ``restart_delay``). The default
    is the least any job is charged: it is what the policy assumes of a job whose cost
    it does not know (an AFE job in the simulator), so a job known to be dearer (a
    ``resize="restart"`` job's cold delay) is resized less eagerly than those, and none
    more eagerly; it also keeps a job with a near-free measured resize from being
    moved every round. ``per_job=False`` is the uniform-cost ablation: ``default``
    for every job.
    """
    cost = job.restart_cost
    return default if cost is None or not per_job else max(default, cost)


def realloc_factor(age: float, restarts: float, delta: float) -> float:
    """``max(age - restarts * delta, 0) / (age + delta)``: Pollux's realloc factor and
    DeepBoot's restart penalty, in [0, 1] for ``delta > 0``."""
    return max(age - restarts * delta, 0.0) / (age + delta)


def fair_replicas(total_gpus: int, num_jobs: int) -> int:
    """The fair share in GPUs: ``ceil(total_gpus / num_jobs)``, at least 1."""
    if num_jobs <= 0:
        return 1
    return max(math.ceil(total_gpus / num_jobs), 1)


def fair_share_base(fn: SpeedupFn, fair: int) -> float:
    """``fn`` at the fair share (1 node, ``fair`` replicas): the value speedups are
    divided by.

    When that point has no feasible batch (the model returns 0 or a non-finite value)
    linear scaling from one GPU is assumed instead, and ``fair`` when even that fails.
    """
    one = np.ones(1, dtype=np.int64)
    value = float(fn(one, one * fair)[0])
    if math.isfinite(value) and value > 0:
        return value
    single = float(fn(one, one)[0])
    return single * fair if math.isfinite(single) and single > 0 else float(fair)


def capacity_profile(capacities: Iterable[int]) -> IntArray:
    """Cumulative GPUs of the nodes, largest first: entry i holds the i + 1 largest.

    Returns:
        Shape (V,) for the V nodes with capacity > 0.
    """
    return np.cumsum(sorted((c for c in capacities if c > 0), reverse=True), dtype=np.int64)


def nodes_for(counts: IntArray, profile: IntArray) -> IntArray:
    """Fewest nodes that hold each GPU count (never more nodes than GPUs).

    Args:
        counts: GPU counts, shape (M,), each >= 1.
        profile: :func:`capacity_profile` of the free GPUs per node.

    Returns:
        Node counts, shape (M,); counts beyond the total get every node.
    """
    if profile.size == 0:
        return np.zeros_like(counts)
    need = np.searchsorted(profile, counts, side="left") + 1
    return np.minimum(np.minimum(need, profile.size), counts).astype(np.int64)


def group_knapsack(values: Sequence[FloatArray], low: Sequence[int], capacity: int) -> list[int]:
    """Exact group knapsack: at most one item per group, item weight = GPU count.

    Args:
        values: ``values[i][t]`` is the value of giving group i ``low[i] + t`` GPUs;
            shape (M_i,), M_i may be 0 (the group can only get 0). Finite.
        low: Smallest GPU count of each group's items (>= 1).
        capacity: GPUs available (>= 0).

    Returns:
        GPU count per group: 0 or in ``[low[i], low[i] + M_i - 1]``, summing to at most
        ``capacity``, maximizing the total value (a group at 0 adds 0). Among optimal
        choices, the one the reference backtrack finds (see the module docstring).

    Raises:
        ValueError: lengths differ, a value is not finite, ``low`` < 1 or
            ``capacity`` < 0.
    """
    if len(values) != len(low):
        raise ValueError(f"{len(values)} value arrays but {len(low)} lows")
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0; got {capacity}")
    items: list[tuple[int, FloatArray]] = []
    for vals, lo in zip(values, low, strict=True):
        v = np.asarray(vals, dtype=np.float64).ravel()
        if lo < 1:
            raise ValueError(f"item counts start at 1 or more; got {lo}")
        if not np.all(np.isfinite(v)):
            raise ValueError("knapsack values must be finite")
        # Drop items past the first maximum, and those that cannot fit at all: exact,
        # since a larger count with no more value is never the smallest optimal one.
        if v.size:
            v = v[: int(np.argmax(v)) + 1]
        v = v[: max(capacity - lo + 1, 0)]
        items.append((lo, v))

    rows: list[FloatArray] = [np.zeros(1)]
    widest = max((v.size for _, v in items), default=0)
    top = max((lo + v.size - 1 for lo, v in items if v.size), default=0)
    buffer = np.empty((max(widest, 1), capacity + 1), dtype=np.float64)
    # padded[top + c] holds the previous row at c (extended past its width with its last
    # value); everything before ``top`` stays -inf, so c - k < 0 is never chosen.
    padded = np.full(top + capacity + 1, -np.inf)
    step = padded.strides[0]
    # shifted[k, c] = padded[top - k + c]: the previous row at c - k, for every k at once.
    shifted = as_strided(
        padded[top:], shape=(top + 1, capacity + 1), strides=(-step, step), writeable=False
    )
    for lo, v in items:
        prev = rows[-1]
        if v.size == 0:
            rows.append(prev)
            continue
        hi = lo + v.size - 1
        # Row width: the GPUs this group and the earlier ones can use at most. Beyond
        # it a row is constant (the DP is "at most c GPUs"), which the backtrack uses.
        width = min(capacity, prev.size - 1 + hi)
        padded[top : top + prev.size] = prev
        padded[top + prev.size : top + width + 1] = prev[-1]
        sums = buffer[: v.size, : width + 1]
        np.add(shifted[lo : hi + 1, : width + 1], v[:, None], out=sums)
        rows.append(np.maximum(padded[top : top + width + 1], sums.max(axis=0)))

    counts = [0] * len(items)
    c = capacity
    for i in range(len(items) - 1, -1, -1):
        lo, v = items[i]
        row, prev = rows[i + 1], rows[i]
        c = min(c, row.size - 1)
        if v.size == 0 or c < lo:
            continue
        ks = np.arange(lo, min(lo + v.size - 1, c) + 1)
        before = prev[np.minimum(c - ks, prev.size - 1)]
        hit = np.flatnonzero(before + v[ks - lo] == row[c])
        if hit.size:
            counts[i] = int(ks[hit[0]])
            c -= counts[i]
    return counts
