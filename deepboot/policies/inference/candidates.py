"""What every inference-placement policy shares: its config, and the candidate GPUs of
each step of ATS-I's order on an :class:`InferenceState`.

The steps, in order (DeepBoot §2.2):

1. warm reuse: a PROTECT or SLEEP replica of the same service;
2. a FREE GPU: the inference pool, then (when allowed) the training pool;
3. another service's SLEEP replica, evicted: same pool order;
4. a LENT GPU taken back from training (only when ``state.lending``).

Policies differ only in how they pick within a step and what a reclaim takes back.
"""

from __future__ import annotations

import enum
import math
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from deepboot.core.cluster import Pool
from deepboot.core.gpu import TRAINABLE, GpuState, GpuView
from deepboot.core.modes import JobMode
from deepboot.core.state import InferenceState, JobView
from deepboot.perf.speedup import SpeedupFn, linear_speedup, speedup_fn
from deepboot.policies.allocation import fair_replicas, fair_share_base
from deepboot.policies.inference.base import InferencePlacement, PlaceAction

FloatArray = npt.NDArray[np.float64]

_WARM = (GpuState.PROTECT, GpuState.SLEEP)


class ColdOrder(enum.Enum):
    """Which FREE GPU (or evictable SLEEP replica) of a pool a cold start takes.

    FEWEST_WORKERS: the node with the fewest training workers first (the artifact's
        ``node_priority``): it spares the nodes training is using now, but it breaks
        up a node that has just gone wholly free.
    PACK: the node with the fewest GPUs training could use (FREE, SLEEP, TRAINING,
        LENT) first: best fit for inference, so replicas fill the nodes inference
        already fragments and whole nodes stay whole for multi-GPU jobs.
    """

    FEWEST_WORKERS = "fewest-workers"
    PACK = "pack"


@dataclass(frozen=True, slots=True)
class PlacementConfig:
    """Parameters shared by the inference-placement policies.

    Attributes:
        use_training_pool: After the inference pool's FREE GPUs (and SLEEP replicas),
            use the training pool's (DeepBoot's order).
        isolate_pools_without_lending: When ``state.lending`` is False, never use the
            training pool: the training-pool-only baseline, where inference runs on
            the inference pool alone.
        speedup_mode: Job mode of the speedups a reclaim's loss is measured with
            (DeepBoot: ADAPTIVE; pass the training policy's mode to match it).
        cold_order: How ATS-I and Lyra placement pick a cold start's GPU within a
            pool (the artifact: fewest training workers).
        prefer_host: ATS-I takes a GPU of a node whose host memory holds the task's
            model first, in each step that starts a new replica (a host start
            instead of a cold one; no effect without a host cache).
    """

    use_training_pool: bool = True
    isolate_pools_without_lending: bool = True
    speedup_mode: JobMode = JobMode.ADAPTIVE
    cold_order: ColdOrder = ColdOrder.FEWEST_WORKERS
    prefer_host: bool = True


def pools_in_order(state: InferenceState, cfg: PlacementConfig) -> tuple[Pool, ...]:
    """The pools a task may cold-start in, in preference order."""
    training = cfg.use_training_pool and (state.lending or not cfg.isolate_pools_without_lending)
    return (Pool.INFERENCE, Pool.TRAINING) if training else (Pool.INFERENCE,)


def warm_replicas(state: InferenceState, service: str) -> list[GpuView]:
    """Idle (PROTECT or SLEEP) replicas of ``service``, in GPU order; a replica of
    several GPUs once, by its lead GPU."""
    return [g for g in state.gpus if g.state in _WARM and g.service == service and g.lead]


def free_gpus(state: InferenceState, pool: Pool) -> list[GpuView]:
    """FREE GPUs of ``pool``, in GPU order."""
    return [g for g in state.gpus if g.pool is pool and g.state is GpuState.FREE]


def evictable(state: InferenceState, service: str, pool: Pool) -> list[GpuView]:
    """SLEEP replicas of other services in ``pool``, in GPU order."""
    return [
        g
        for g in state.gpus
        if g.pool is pool and g.state is GpuState.SLEEP and g.service != service
    ]


def lent_gpus(state: InferenceState) -> list[GpuView]:
    """LENT GPUs (a training worker on an inference GPU) with their job, in GPU order.

    Empty when ``state.lending`` is False: nothing may be reclaimed then.
    """
    if not state.lending:
        return []
    return [g for g in state.gpus if g.state is GpuState.LENT and g.job is not None]


def training_workers(state: InferenceState) -> Counter[int]:
    """Training workers (TRAINING or LENT GPUs) per node id."""
    return Counter(g.node_id for g in state.gpus if g.state in (GpuState.TRAINING, GpuState.LENT))


def job_counts(state: InferenceState) -> dict[str, Counter[int]]:
    """GPUs per node of every job holding GPUs, from the GPU views (TRAINING + LENT)."""
    out: dict[str, Counter[int]] = defaultdict(Counter)
    for g in state.gpus:
        if g.job is not None and g.state in (GpuState.TRAINING, GpuState.LENT):
            out[g.job][g.node_id] += 1
    return dict(out)


def reclaim_losses(
    state: InferenceState, gpus: list[GpuView], mode: JobMode = JobMode.ADAPTIVE
) -> FloatArray:
    """Speedup each training job loses if one of ``gpus`` is taken back from it.

    ``loss(g) = speedup_j(N, K) - speedup_j(N', K - 1)`` for the job j holding g, with
    N, K its current nodes and GPUs and N' its nodes without g. Speedups are over the
    job's fair-share goodput (1 node, ceil(training GPUs / jobs) replicas), as the
    artifact re-bases them; a job missing from ``state.jobs`` scales linearly.

    Args:
        state: The snapshot; never mutated.
        gpus: LENT GPUs, each with its job.
        mode: Job mode of the speedup functions.

    Returns:
        Array of shape (len(gpus),).
    """
    counts = job_counts(state)
    views = {j.name: j for j in state.jobs}
    usable = sum(1 for g in state.gpus if g.state not in (GpuState.RUNNING, GpuState.PROTECT))
    fair = fair_replicas(usable, max(len(views), len(counts), 1))
    # A GPU's loss depends only on its job and on whether it is the job's last GPU on
    # its node, so each job's speedups are asked for once, all its pairs in one call
    # (a speedup function's value of a pair does not depend on the pairs asked with
    # it), instead of one call per GPU.
    by_job: dict[str, list[int]] = defaultdict(list)
    for i, g in enumerate(gpus):
        by_job[g.job or ""].append(i)
    out = np.zeros(len(gpus), dtype=np.float64)
    for name, members in by_job.items():
        fn = _speedup_of(views.get(name), mode)
        base = fair_share_base(fn, fair)
        # (n, k, n_after) of each GPU; a job unknown to the GPU views counts the GPU.
        shapes = []
        known = counts.get(name)
        if known is not None:
            k_known, n_known = max(sum(known.values()), 1), max(len(known), 1)
        for i in members:
            node = gpus[i].node_id
            if known is None:
                per_node: Counter[int] = Counter({node: 1})
                k, n = 1, 1
            else:
                per_node, k, n = known, k_known, n_known
            shapes.append((n, k, n - 1 if per_node.get(node, 0) <= 1 else n))
        pairs = sorted({(n, k) for n, k, _ in shapes} | {(a, k - 1) for _, k, a in shapes})
        values = fn(np.array([n for n, _ in pairs]), np.array([k for _, k in pairs])).tolist()
        speedup = dict(zip(pairs, values, strict=True))
        for i, (n, k, n_after) in zip(members, shapes, strict=True):
            loss = (speedup[n, k] - speedup[n_after, k - 1]) / base
            out[i] = loss if math.isfinite(loss) else 0.0
    return out


def _speedup_of(job: JobView | None, mode: JobMode) -> SpeedupFn:
    return linear_speedup if job is None else speedup_fn(job, mode)


def node_key(workers: Counter[int]) -> Callable[[GpuView], tuple[int, int, int]]:
    """Sort key of ATS-I's cold starts: the node with the fewest training workers
    first (the artifact's ``node_priority``), then GPU order."""

    def key(g: GpuView) -> tuple[int, int, int]:
        return (workers[g.node_id], g.node_id, g.index)

    return key


def cold_key(state: InferenceState, order: ColdOrder) -> Callable[[GpuView], tuple[int, int, int]]:
    """Sort key of a cold start's GPU under ``order`` (smallest first), then GPU order."""
    if order is ColdOrder.FEWEST_WORKERS:
        return node_key(training_workers(state))
    usable = Counter(g.node_id for g in state.gpus if g.state in TRAINABLE)

    def key(g: GpuView) -> tuple[int, int, int]:
        return (usable[g.node_id], g.node_id, g.index)

    return key


Pick = Callable[[list[GpuView]], GpuView]
"""Chooses one GPU of a non-empty candidate list."""

Reclaim = Callable[[list[GpuView]], tuple[GpuView, tuple[GpuView, ...]]]
"""Given the LENT GPUs (non-empty), the task's GPU and every GPU taken back (it included)."""


def place_in_order(
    state: InferenceState,
    service: str,
    cfg: PlacementConfig,
    *,
    warm: Pick,
    cold: Pick,
    reclaim: Reclaim,
) -> InferencePlacement | None:
    """ATS-I's order of steps, with the choice within each step left to the caller.

    Args:
        state: The snapshot; never mutated.
        service: The task's service.
        cfg: Pools and speedup mode.
        warm: Picks among the same service's PROTECT/SLEEP replicas.
        cold: Picks among FREE GPUs, or among evictable SLEEP replicas, of one pool.
        reclaim: Picks what to take back among the LENT GPUs.

    Returns:
        The placement, or None when no step has a candidate.
    """
    replicas = warm_replicas(state, service)
    if replicas:
        g = warm(replicas)
        action = PlaceAction.WARM_PROTECT if g.state is GpuState.PROTECT else PlaceAction.WARM_SLEEP
        return InferencePlacement(g.gpu_id, action)
    pools = pools_in_order(state, cfg)
    for pool in pools:
        free = free_gpus(state, pool)
        if free:
            return InferencePlacement(cold(free).gpu_id, PlaceAction.COLD_FREE)
    for pool in pools:
        sleeping = evictable(state, service, pool)
        if sleeping:
            g = cold(sleeping)
            # A replica of several GPUs is evicted whole (``members``: all of them).
            return InferencePlacement(g.gpu_id, PlaceAction.COLD_EVICT, evicts=g.members)
    lent = lent_gpus(state)
    if not lent:
        return None
    target, taken = reclaim(lent)
    return InferencePlacement(
        target.gpu_id,
        PlaceAction.COLD_RECLAIM,
        reclaims=tuple((t.gpu_id, t.job or "") for t in taken),
    )
