"""Placement helpers shared by the fixed-size policies (FIFO, Tiresias, Optimus).

They turn a GPU count into node ids on a mutable ``free`` map (node id -> free GPUs)
that the calling policy owns for the duration of one ``allocate`` call.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Mapping

from deepboot.core.placement import Placement
from deepboot.core.state import ClusterState, JobView


class Packing(enum.Enum):
    """How a new job's GPUs are chosen among the free ones.

    MOST_FREE: repeatedly take the node with the most free GPUs (ties: lowest id) and
        as many of its GPUs as needed: the reference Tiresias/Optimus rule.
    BEST_FIT: one node if any fits the whole job (the one with the fewest free GPUs
        that does); otherwise the fewest nodes, the remainder best-fitted.
    """

    MOST_FREE = "most_free"
    BEST_FIT = "best_fit"


def free_map(state: ClusterState) -> dict[int, int]:
    """A fresh ``{node_id: GPUs training may use}`` map, nodes with 0 left out."""
    return {node: cap for node, cap in sorted(state.capacity.items()) if cap > 0}


def take(free: dict[int, int], placement: Placement) -> None:
    """Subtract ``placement``'s GPUs from ``free`` (the caller checked it fits)."""
    for node, count in placement.counts().items():
        free[node] -= count


def fits(free: Mapping[int, int], placement: Placement) -> bool:
    """Whether every node of ``placement`` has that many GPUs free."""
    # Counter, not counts(): the order of the nodes does not matter here.
    return all(free.get(node, 0) >= count for node, count in Counter(placement.node_ids).items())


def pack(num_gpus: int, free: dict[int, int], rule: Packing) -> Placement | None:
    """Choose ``num_gpus`` GPUs from ``free`` and subtract them.

    Args:
        num_gpus: GPUs wanted (>= 1).
        free: Free GPUs per node; updated in place when a placement is returned.
        rule: The packing rule.

    Returns:
        The placement, or None (``free`` untouched) when fewer GPUs are free in total.
    """
    if num_gpus <= 0 or sum(free.values()) < num_gpus:
        return None
    counts = _most_free(num_gpus, free) if rule is Packing.MOST_FREE else _best_fit(num_gpus, free)
    placement = Placement.from_counts(counts)
    take(free, placement)
    return placement


def _most_free(num_gpus: int, free: Mapping[int, int]) -> dict[int, int]:
    left = dict(free)
    counts: dict[int, int] = {}
    need = num_gpus
    while need > 0:
        # Most free first, lowest id on ties (as Counter.most_common on id-ordered keys).
        node = min(left, key=lambda n: (-left[n], n))
        got = min(left[node], need)
        counts[node] = counts.get(node, 0) + got
        left[node] -= got
        need -= got
    return counts


def _best_fit(num_gpus: int, free: Mapping[int, int]) -> dict[int, int]:
    left = {n: c for n, c in free.items() if c > 0}
    counts: dict[int, int] = {}
    need = num_gpus
    while need > 0:
        fitting = [n for n, c in left.items() if c >= need]
        if fitting:
            node = min(fitting, key=lambda n: (left[n], n))
            counts[node] = need
            break
        # No single node holds the rest: take the fullest node whole; this uses the
        # fewest nodes overall.
        node = min(left, key=lambda n: (-left[n], n))
        counts[node] = left.pop(node)
        need -= counts[node]
    return counts


def requested_replicas(job: JobView) -> int:
    """GPUs a fixed-size job runs with: its request, within [min_replicas, max_replicas].

    A job without a request asks for ``max(min_replicas, 1)``. Returns 0 when the
    bounds leave no valid count (the job cannot run).
    """
    want = job.target_num_replicas if job.target_num_replicas is not None else 1
    want = max(want, job.min_replicas, 1)
    return want if want <= job.max_replicas else 0


def keep_or_pack(
    order: Iterable[tuple[JobView, int]],
    free: dict[int, int],
    rule: Packing,
) -> dict[str, Placement]:
    """Place jobs with known GPU counts, keeping current placements that still fit.

    First every job whose current placement has exactly its count and still fits keeps
    it (in ``order``); then the others are packed with ``rule`` in ``order``.

    Args:
        order: ``(job, gpus)`` pairs in placement priority order; gpus >= 1.
        free: Free GPUs per node; updated in place.
        rule: Packing rule for jobs that move.

    Returns:
        Job name -> placement for every job that could be placed.
    """
    pairs = list(order)
    out: dict[str, Placement] = {}
    for job, gpus in pairs:
        current = job.placement
        if current.num_replicas == gpus and fits(free, current):
            take(free, current)
            out[job.name] = current
    for job, gpus in pairs:
        if job.name in out:
            continue
        placement = pack(gpus, free, rule)
        if placement is not None:
            out[job.name] = placement
    return out
