"""The event-time top-up: give GPUs that fell free between rounds to the jobs now.

A round decides every job's GPUs once an interval. A GPU freed in between (a job
finished, a replica went to sleep, a reclaim left a spare) would sit idle until the
next round; :func:`top_up` hands it out at once, by a cheap incremental rule, and the
next round is free to undo it (it is a policy round like any other).

The rule, a pure function of the snapshot:

* Only GPUs nobody holds are given: ``capacity`` less the jobs' current placements,
  node by node. No job shrinks or moves; a job's new placement holds its old one.
* Queued jobs start first, oldest first, at their smallest size (the user's
  replica count for a ``FIXED`` policy), on the node that holds them with the fewest
  GPUs to spare, else across the fullest nodes (best fit, as ATS-T places).
* A running job (``ADAPTIVE`` and ``FIXED_BATCH`` policies; a ``FIXED`` job keeps its
  size) may then grow, once per top-up: on its own nodes first, then on the nodes
  with the most GPUs free. Growing from speedup ``s`` to ``s'`` (the job's own
  speedup model, ``r = s' / s``) pays off when ``(r - 1) * horizon > r * cost``: what
  the larger size gains over ``horizon`` seconds outweighs the resize's pause
  (``cost``: the job's ``restart_cost`` where its view has one, else ``default_cost``).
  Growths go greedily by that net gain per GPU added, the best first, each priced
  against the GPUs still free (lazily: a popped offer is re-priced before it is
  taken). A job started above may grow so too, at no further cost (its start is
  its one pause).

The result lists only the jobs whose placement changes, so it stays small however
many jobs run.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from deepboot.core.modes import JobMode
from deepboot.core.placement import Placement
from deepboot.core.state import ClusterState, JobView
from deepboot.perf.speedup import speedup_fn


@dataclass(frozen=True, slots=True)
class TopUpConfig:
    """The top-up's knobs.

    Attributes:
        horizon: Seconds a growth is expected to last (the round's interval: the next
            round usually keeps it).
        default_cost: Seconds a resize costs a job whose view names none.
    """

    horizon: float = 60.0
    default_cost: float = 10.0


def free_gpus(state: ClusterState) -> dict[int, int]:
    """GPUs per node that training may use and no job holds (nodes with 0 left out)."""
    free = dict(state.capacity)
    for job in state.jobs:
        for node, count in job.placement.counts().items():
            free[node] = free.get(node, 0) - count
    return {node: n for node, n in sorted(free.items()) if n > 0}


def _best_fit(free: Mapping[int, int], need: int, avoid: Sequence[int] = ()) -> dict[int, int]:
    """``need`` GPUs from ``free``: the node with the fewest free that holds them all,
    else the fullest nodes in turn (``avoid``'s nodes are not used). Empty when
    ``free`` has fewer than ``need``."""
    nodes = {n: c for n, c in free.items() if c > 0 and n not in avoid}
    if sum(nodes.values()) < need:
        return {}
    fitting = [(c, n) for n, c in nodes.items() if c >= need]
    if fitting:
        _, node = min(fitting)
        return {node: need}
    out: dict[int, int] = {}
    for node, count in sorted(nodes.items(), key=lambda p: (-p[1], p[0])):
        take = min(count, need)
        out[node] = take
        need -= take
        if need == 0:
            break
    return out


def _growth_path(placement: Placement, free: Mapping[int, int], most: int) -> list[int]:
    """The nodes of each extra GPU a job on ``placement`` would take, in order, at most
    ``most``: its own nodes first (the most free first), then the others (likewise)."""
    own = set(placement.node_ids)
    ranked = sorted(free.items(), key=lambda p: (p[0] not in own, -p[1], p[0]))
    path: list[int] = []
    for node, count in ranked:
        path.extend([node] * count)
        if len(path) >= most:
            break
    return path[:most]


def _offer(
    job: JobView,
    placement: Placement,
    cost: float,
    mode: JobMode,
    free: Mapping[int, int],
    config: TopUpConfig,
) -> tuple[float, dict[int, int]] | None:
    """The best growth on ``free`` of ``job`` from ``placement`` at a resize ``cost``:
    (net gain per GPU added, extra GPUs per node), or None when no growth pays off."""
    have = placement.num_replicas
    most = min(job.max_replicas - have, sum(free.values()))
    if most <= 0:
        return None
    path = _growth_path(placement, free, most)
    base = placement.counts()
    nodes = np.empty(len(path) + 1, dtype=np.int64)
    replicas = np.arange(have, have + len(path) + 1, dtype=np.int64)
    seen = set(base)
    nodes[0] = len(seen)
    for i, node in enumerate(path, start=1):
        seen.add(node)
        nodes[i] = len(seen)
    speed = np.asarray(speedup_fn(job, mode)(nodes, replicas), dtype=np.float64)
    if not (np.isfinite(speed[0]) and speed[0] > 0):
        return None
    ratio = np.where(np.isfinite(speed[1:]), speed[1:], 0.0) / speed[0]
    net = (ratio - 1.0) * config.horizon - ratio * cost
    per_gpu = net / np.arange(1, len(path) + 1)
    # The most GPUs among the best per GPU (a tie between sizes, up to rounding: the
    # larger; a job that scales linearly takes all it may).
    top = float(per_gpu.max())
    best = int(np.flatnonzero(per_gpu >= top - 1e-9 * abs(top))[-1])
    if not per_gpu[best] > 0:
        return None
    extra: dict[int, int] = {}
    for node in path[: best + 1]:
        extra[node] = extra.get(node, 0) + 1
    return float(per_gpu[best]), extra


def _cost(job: JobView, config: TopUpConfig) -> float:
    """Seconds one resize costs ``job``: its own where its view has one."""
    return job.restart_cost if job.restart_cost is not None else config.default_cost


def top_up(state: ClusterState, mode: JobMode, config: TopUpConfig) -> dict[str, Placement]:
    """The new placements of the jobs the GPUs free now go to (see the module docstring).

    Args:
        state: The snapshot; never mutated. ``state.capacity`` is what training may
            use per node (the round's rule), the jobs' placements what they hold.
        mode: The policy's job mode (the speedup model; ``FIXED`` jobs only start).
        config: Horizon and default resize cost.

    Returns:
        Job name -> its new placement, for the jobs that start or grow only; each new
        placement holds the job's old one.
    """
    free = free_gpus(state)
    if not free:
        return {}
    out: dict[str, Placement] = {}
    queued = sorted(
        (j for j in state.jobs if not j.placement), key=lambda j: (j.submit_time, j.name)
    )
    for job in queued:
        if not free:
            break
        need = max(job.min_replicas, 1)
        if mode is JobMode.FIXED:
            need = max(need, job.target_num_replicas or 1)
        if need > job.max_replicas:
            continue
        counts = _best_fit(free, need)
        if not counts:
            continue
        for node, count in counts.items():
            free[node] -= count
        out[job.name] = Placement.from_counts(counts)
    free = {n: c for n, c in free.items() if c > 0}
    if mode is JobMode.FIXED or not free:
        return out
    # Each running job, and each job started above (its start pays its one pause: a
    # larger start costs nothing more), from where it stands.
    growing = [
        (j, out.get(j.name, j.placement), 0.0 if j.name in out else _cost(j, config))
        for j in state.jobs
        if j.placement or j.name in out
    ]
    heap: list[tuple[float, int]] = []
    for i, (job, placement, cost) in enumerate(growing):
        offer = _offer(job, placement, cost, mode, free, config)
        if offer is not None:
            heap.append((-offer[0], i))
    heapq.heapify(heap)
    while heap and free:
        _, i = heapq.heappop(heap)
        job, placement, cost = growing[i]
        offer = _offer(job, placement, cost, mode, free, config)  # free may have changed
        if offer is None:
            continue
        if heap and -heap[0][0] > offer[0]:
            heapq.heappush(heap, (-offer[0], i))  # another offer is better now
            continue
        counts = placement.counts()
        for node, count in offer[1].items():
            counts[node] = counts.get(node, 0) + count
            free[node] -= count
        free = {n: c for n, c in free.items() if c > 0}
        out[job.name] = Placement.from_counts(counts)
    return out
