"""Where a new replica that spans several GPUs of one node goes (``gpus_per_replica``
= k > 1), and what a set of reclaims costs training.

A replica of k GPUs needs k GPUs of **one node**, all moving together. The rule
ATS-I follows for it (:func:`node_sets`, :func:`place_multi`), in its own order of
steps, each over whole node sets:

1. **Warm reuse**: the same service's idle replica (by its lead GPU), as for one GPU.
2. **FREE** (COLD_FREE): a node whose FREE GPUs alone give k; the inference pool,
   then the training pool.
3. **Evict** (COLD_EVICT): a node whose FREE GPUs plus whole SLEEP replicas of other
   services give k (the smallest replicas first, lowest lead GPU among equals; a
   replica is evicted whole even when the task needs only part of it); same pools.
4. **Reclaim** (COLD_RECLAIM, only with ``state.lending``): a node whose FREE GPUs,
   evictable replicas and LENT GPUs give k. It takes its FREE GPUs, then evicts, and
   reclaims only the m LENT GPUs still missing: those whose reclaim loses training
   the least (:func:`set_loss`; a job's GPUs on one node are interchangeable, so
   every split of m among the node's jobs is tried, the lowest indexes taken of
   each). Among nodes: the least loss, then the artifact's job order, then node id.

The replica's GPUs are the node's FREE ones (index order), then the evicted ones,
then the reclaimed ones: the first k, sorted. Within steps 2 and 3 nodes are ordered
by the cold key of ATS-I (:func:`~deepboot.policies.inference.candidates.cold_key`)
of their first GPU. With ``prefer_host`` a node whose host memory holds the model
goes first within each step, and before it the exact GPU set of a sleeping server
of the service (``InferenceState.sleeping``), when that set can be had in the step.

A job that loses m GPUs shrinks by m workers (AFE): the control loop's
``reclaim_ops`` turns the reclaims into one ``Resize`` per job.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from deepboot.core.cluster import Pool
from deepboot.core.gpu import GpuId, GpuState, GpuView
from deepboot.core.modes import JobMode
from deepboot.core.state import InferenceState
from deepboot.perf.speedup import SpeedupFn
from deepboot.policies.allocation import fair_replicas, fair_share_base, reference_order
from deepboot.policies.inference.base import InferencePlacement, PlaceAction
from deepboot.policies.inference.candidates import (
    PlacementConfig,
    _speedup_of,
    cold_key,
    job_counts,
    pools_in_order,
    warm_replicas,
)


class SetLoss:
    """The speedup training loses when sets of LENT GPUs are taken back.

    ``loss(S) = sum over jobs j of speedup_j(N, K) - speedup_j(N', K - m_j)``, over
    the fair-share base, with N, K job j's nodes and GPUs now, m_j the GPUs of S it
    holds and N' its nodes without them: the loss of taking several GPUs from one
    job is its speedup before minus after, not the sum of one-GPU losses. For one
    GPU it is :func:`~deepboot.policies.inference.candidates.reclaim_losses`'s.
    Speedups are cached per (job, nodes, GPUs).

    Args:
        state: The snapshot; never mutated.
        mode: Job mode of the speedup functions.
    """

    def __init__(self, state: InferenceState, mode: JobMode = JobMode.ADAPTIVE) -> None:
        self._counts = job_counts(state)
        self._views = {j.name: j for j in state.jobs}
        usable = sum(1 for g in state.gpus if g.state not in (GpuState.RUNNING, GpuState.PROTECT))
        self._fair = fair_replicas(usable, max(len(self._views), len(self._counts), 1))
        self._mode = mode
        self._fns: dict[str, tuple[SpeedupFn, float]] = {}
        self._memo: dict[tuple[str, int, int], float] = {}

    def _speedup(self, job: str, n: int, k: int) -> float:
        key = (job, n, k)
        if key not in self._memo:
            if job not in self._fns:
                fn = _speedup_of(self._views.get(job), self._mode)
                self._fns[job] = (fn, fair_share_base(fn, self._fair))
            fn = self._fns[job][0]
            self._memo[key] = float(fn(np.array([n]), np.array([k]))[0])
        return self._memo[key]

    def job_loss(self, job: str, removed: Mapping[int, int]) -> float:
        """Speedup ``job`` loses when it gives up ``removed[node]`` GPUs per node."""
        per_node = self._counts.get(job) or Counter(dict(removed))
        k = max(sum(per_node.values()), 1)
        n = max(len(per_node), 1)
        after = {node: c - removed.get(node, 0) for node, c in per_node.items()}
        k_after = max(k - sum(removed.values()), 0)
        n_after = sum(1 for c in after.values() if c > 0)
        before = self._speedup(job, n, k)
        base = self._fns[job][1]
        loss = (before - self._speedup(job, n_after, k_after)) / base
        return loss if math.isfinite(loss) else 0.0

    def __call__(self, taken: Sequence[GpuView]) -> float:
        """The loss of taking every GPU of ``taken`` (LENT GPUs, each with its job)."""
        removed: dict[str, Counter[int]] = defaultdict(Counter)
        for g in taken:
            removed[g.job or ""][g.node_id] += 1
        return sum(self.job_loss(job, r) for job, r in sorted(removed.items()))


def set_loss(
    state: InferenceState, taken: Sequence[GpuView], mode: JobMode = JobMode.ADAPTIVE
) -> float:
    """The speedup training loses if every GPU of ``taken`` is reclaimed (:class:`SetLoss`)."""
    return SetLoss(state, mode)(taken)


@dataclass(frozen=True, slots=True)
class NodeSet:
    """A way to get k GPUs of one node for a new replica.

    Attributes:
        node_id: The node.
        pool: Its pool.
        gpus: The replica's GPUs, in index order.
        evicts: Every GPU of the SLEEP replicas evicted (whole replicas).
        reclaims: The LENT GPUs taken back, with their jobs.
        loss: The speedup training loses by ``reclaims`` (:class:`SetLoss`).
        exact: It is a sleeping server's own GPU set (``InferenceState.sleeping``).
    """

    node_id: int
    pool: Pool
    gpus: tuple[GpuId, ...]
    evicts: tuple[GpuId, ...] = ()
    reclaims: tuple[GpuView, ...] = ()
    loss: float = 0.0
    exact: bool = False

    @property
    def action(self) -> PlaceAction:
        """The latest step the set needs."""
        if self.reclaims:
            return PlaceAction.COLD_RECLAIM
        return PlaceAction.COLD_EVICT if self.evicts else PlaceAction.COLD_FREE

    def placement(self) -> InferencePlacement:
        """The placement of a task on this set."""
        return InferencePlacement(
            self.gpus[0],
            self.action,
            reclaims=tuple((g.gpu_id, g.job or "") for g in self.reclaims),
            evicts=self.evicts,
            gpus=self.gpus,
        )


def _evictable_replicas(node: Sequence[GpuView], service: str) -> list[tuple[GpuId, ...]]:
    """The SLEEP replicas of other services on one node, smallest first, then by lead."""
    groups = {g.members for g in node if g.state is GpuState.SLEEP and g.service != service}
    return sorted(groups, key=lambda m: (len(m), m))


def _least_loss_lent(
    lent: Sequence[GpuView], m: int, loss: SetLoss
) -> tuple[tuple[GpuView, ...], float]:
    """The m GPUs of ``lent`` (one node's) whose reclaim loses the least: every split
    of m among its jobs, the lowest indexes of each job; ties by the split's order."""
    by_job: dict[str, list[GpuView]] = defaultdict(list)
    for g in sorted(lent, key=lambda g: g.index):
        by_job[g.job or ""].append(g)
    jobs = sorted(by_job)
    best: tuple[tuple[GpuView, ...], float] | None = None
    ranges = [range(min(len(by_job[j]), m) + 1) for j in jobs]
    for split in itertools.product(*ranges):
        if sum(split) != m:
            continue
        taken = tuple(g for j, c in zip(jobs, split, strict=True) for g in by_job[j][:c])
        value = loss(taken)
        if best is None or value < best[1]:
            best = (taken, value)
    assert best is not None  # len(lent) >= m
    return best


def node_set(
    state: InferenceState,
    service: str,
    node: Sequence[GpuView],
    k: int,
    loss: SetLoss,
    want: Sequence[GpuId] | None = None,
) -> NodeSet | None:
    """How one node gives a new replica of ``service`` its k GPUs (the module's rule),
    or None when it cannot.

    Args:
        state: The snapshot (``lending`` says whether LENT GPUs may be taken).
        service: The task's service (its own SLEEP replicas are never evicted).
        node: The node's GPUs, in index order.
        k: GPUs the replica needs.
        loss: The reclaim loss of the snapshot.
        want: Exactly these GPUs (a sleeping server's set), or None: any k.
    """
    pick = list(node) if want is None else [g for g in node if g.gpu_id in set(want)]
    if want is not None and len(pick) != len(want):
        return None
    free = [g.gpu_id for g in pick if g.state is GpuState.FREE]
    chosen = list(free)
    evicts: list[GpuId] = []
    if len(chosen) < k:
        wanted = {g.gpu_id for g in pick}
        for members in _evictable_replicas(node, service):
            if want is not None and not set(members) & wanted:
                continue
            evicts.extend(members)
            chosen.extend(m for m in members if m in wanted)
            if len(chosen) >= k:
                break
    reclaims: tuple[GpuView, ...] = ()
    value = 0.0
    if len(chosen) < k:
        lent = [g for g in pick if g.state is GpuState.LENT and g.job is not None]
        missing = k - len(chosen)
        if not state.lending or len(lent) < missing:
            return None
        reclaims, value = _least_loss_lent(lent, missing, loss)
        chosen.extend(g.gpu_id for g in reclaims)
    if want is not None and sorted(chosen) != sorted(want):
        return None
    first = node[0]
    return NodeSet(
        first.node_id,
        first.pool,
        tuple(sorted(chosen[:k])),
        tuple(sorted(evicts)),
        reclaims,
        value,
        want is not None,
    )


def node_sets(
    state: InferenceState, service: str, k: int, cfg: PlacementConfig, loss: SetLoss
) -> list[NodeSet]:
    """Every node's way to a new replica of ``service`` (:func:`node_set`), in node
    order, the exact sets of the service's sleeping servers first (with
    ``cfg.prefer_host``); only the pools ``cfg`` allows now."""
    pools = set(pools_in_order(state, cfg))
    by_node: dict[int, list[GpuView]] = defaultdict(list)
    for g in state.gpus:
        if g.pool in pools:
            by_node[g.node_id].append(g)
    out: list[NodeSet] = []
    if cfg.prefer_host:
        for ids in state.sleeping_sets(service):
            if len(ids) == k and ids[0][0] in by_node:
                found = node_set(state, service, by_node[ids[0][0]], k, loss, ids)
                if found is not None:
                    out.append(found)
    for node_id in sorted(by_node):
        found = node_set(state, service, by_node[node_id], k, loss)
        if found is not None:
            out.append(found)
    return out


def place_multi(
    state: InferenceState,
    service: str,
    cfg: PlacementConfig,
    warm: Callable[[list[GpuView]], GpuView],
    host: frozenset[int],
) -> InferencePlacement | None:
    """ATS-I's placement of a task whose replica spans ``state.gpus_per_replica`` GPUs
    (the module's rule), or None when no node can give them. With
    ``state.host_first``, when the placement found is a new replica off the caching
    nodes, the steps over the caching nodes alone go first (a host start in any of
    them beats a FREE node elsewhere).

    Args:
        state: The snapshot; never mutated.
        service: The task's service.
        cfg: Pools, speedup mode, cold order.
        warm: Picks among the same service's idle replicas (ATS-I: most hits).
        host: Nodes whose host memory holds the model (empty: no preference).
    """
    placed = _place_multi(state, service, cfg, warm, host)
    if placed is None or placed.action.warm or not (host and state.host_first):
        return placed
    if placed.gpu[0] in host:
        return placed
    near = replace(state, gpus=tuple(g for g in state.gpus if g.node_id in host))
    return _place_multi(near, service, cfg, warm, host) or placed


def _place_multi(
    state: InferenceState,
    service: str,
    cfg: PlacementConfig,
    warm: Callable[[list[GpuView]], GpuView],
    host: frozenset[int],
) -> InferencePlacement | None:
    """:func:`place_multi` without the caching nodes' second pass."""
    replicas = warm_replicas(state, service)
    if replicas:
        g = warm(replicas)
        action = PlaceAction.WARM_PROTECT if g.state is GpuState.PROTECT else PlaceAction.WARM_SLEEP
        return InferencePlacement(g.gpu_id, action, gpus=g.replica_gpus)
    k = state.gpus_per_replica
    loss = SetLoss(state, cfg.speedup_mode)
    sets = node_sets(state, service, k, cfg, loss)
    if not sets:
        return None
    key = cold_key(state, cfg.cold_order)
    views = {g.gpu_id: g for g in state.gpus}
    rank = {job.name: i for i, job in enumerate(reference_order(state.jobs))}

    def cold(s: NodeSet) -> tuple[object, ...]:
        return (not s.exact, s.node_id not in host, *key(views[s.gpus[0]]))

    def reclaim(s: NodeSet) -> tuple[object, ...]:
        first = min((rank.get(g.job or "", len(rank)) for g in s.reclaims), default=len(rank))
        return (not s.exact, s.node_id not in host, s.loss, first, s.node_id)

    pools = pools_in_order(state, cfg)
    for action in (PlaceAction.COLD_FREE, PlaceAction.COLD_EVICT):
        for pool in pools:
            step = [s for s in sets if s.action is action and s.pool is pool]
            if step:
                return min(step, key=cold).placement()
    step = [s for s in sets if s.action is PlaceAction.COLD_RECLAIM]
    return min(step, key=reclaim).placement() if step else None
