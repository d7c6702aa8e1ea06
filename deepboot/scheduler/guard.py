"""The SLO guard of a tick: hold what each service needs, pre-warm what is missing.

Given each service's need (:func:`deepboot.policies.slo.service_needs`: ``warm``
replicas to keep loaded, ``hold`` GPUs to keep from lending), the guard decides, on
the inference pool only and in sorted service order:

1. **Held** (left out of the training round's capacity): each service's idle SLEEP
   replicas, in GPU order, up to ``hold`` minus its loaded RUNNING and PROTECT
   replicas (those are not lendable anyway; one still loading does not count: a
   request now would wait for its load, and lending the loaded one meanwhile made
   a runtime ramp wait 10 s); then, for the relaxed regime's ``hold`` above
   what is loaded, FREE GPUs in GPU order. A held replica stays SLEEP: between
   ticks another service's cold start may still evict it when no GPU is FREE
   (protecting it instead left such requests queued behind a full pool, and made
   most reclaims reactive on ``genai-day.csv``).
2. **Pre-warmed** (``WarmReplica``): ``warm`` minus the replicas loaded or loading,
   on FREE GPUs first (GPU order), then on SLEEP replicas of other services that
   nothing holds (``EvictReplica`` first), then on LENT GPUs taken back ahead of
   demand (``Reclaim(proactive=True)``): ATS-I's least-loss choice, one GPU at a time
   (each choice sees the jobs as the previous reclaims left them), then one
   ``Resize`` (or ``Preempt``) per job that lost GPUs: AFE's shrink.
3. **Idle** (the relaxed regime's shared pool, ``idle`` GPUs,
   :func:`deepboot.policies.slo.idle_need`): after the pre-warms, SLEEP replicas
   nothing holds (GPU order: a request of their service reuses them; another
   service's cold start evicts them), then FREE GPUs, then LENT GPUs reclaimed ahead
   as in 2 and left FREE.

A pre-warmed replica is PROTECT until ``until`` (a cold start plus one interval from
now); at the next tick the guard holds it again if it is still needed. Pure.

A service whose replica spans k > 1 GPUs of one node (``gpus_per_replica``): its
replicas are counted once each (by their lead GPU; needs are in replicas), a held
replica keeps all of its GPUs, and a pre-warm takes a whole node set by ATS-I's rule
for several GPUs (:func:`deepboot.policies.inference.multi.place_multi`: FREE GPUs of
one node, then whole SLEEP replicas evicted, then the node whose reclaimed GPUs lose
training the least). 4. **Idle sets** (``idle_sets``, per size k:
:func:`deepboot.policies.slo.idle_need_multi`): after the one-GPU idle pool,
unheld SLEEP replicas of k GPUs (GPU order), then node sets of k FREE GPUs, then of
FREE and reclaimed ones (least loss), held.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence

from deepboot.core.cluster import ClusterSpec, Pool
from deepboot.core.errors import InvalidDecisionError
from deepboot.core.gpu import GpuId, GpuState, GpuView
from deepboot.core.placement import EMPTY, Placement
from deepboot.core.service import ServiceSpec
from deepboot.core.state import InferenceState, JobView
from deepboot.policies.inference.ats_i import least_loss, most_hits
from deepboot.policies.inference.base import InferencePlacement
from deepboot.policies.inference.candidates import PlacementConfig
from deepboot.policies.inference.multi import place_multi
from deepboot.policies.slo import ServiceNeed
from deepboot.scheduler.decision import Preempt, Resize
from deepboot.scheduler.operations import AnyOperation, EvictReplica, Reclaim, WarmReplica


@dataclasses.dataclass(frozen=True, slots=True)
class Guard:
    """What the guard decided.

    Attributes:
        ops: Evictions, proactive reclaims with their shrinks, and pre-warms, in the
            order they must be applied.
        held: Idle inference GPUs (SLEEP or FREE) the training round must not use.
    """

    ops: tuple[AnyOperation, ...] = ()
    held: frozenset[GpuId] = frozenset()


def guard(
    needs: Mapping[str, ServiceNeed],
    gpus: Sequence[GpuView],
    jobs: Sequence[JobView],
    services: Mapping[str, ServiceSpec],
    cluster: ClusterSpec,
    now: float,
    interval: float,
    idle: int = 0,
    cached: Mapping[int, frozenset[str]] | None = None,
    loading: frozenset[GpuId] = frozenset(),
    idle_sets: Mapping[int, int] | None = None,
) -> Guard:
    """The ops and the held GPUs of ``needs`` and ``idle`` (see the module docstring).

    Args:
        needs: Each service's need (sorted names).
        gpus: Every GPU, sorted by (node_id, index).
        jobs: The active training jobs (placements for the reclaims' shrinks).
        services: The services' specs (cold starts, for ``until``).
        cluster: The cluster.
        now: Current time.
        interval: Seconds between ticks.
        idle: Idle GPUs the relaxed services share (SLEEP or FREE; reclaimed if
            short).
        cached: The models each node's host memory holds (a snapshot's): the idle
            pool keeps the SLEEP and FREE GPUs of the nodes that hold the most first,
            so that a request served from it starts from host memory (None or empty:
            GPU order, as without a cache).
        loading: RUNNING GPUs whose replica is still loading: they count as loading
            (no second pre-warm for them), not as loaded (the SLEEP replicas held
            do not count on them).
        idle_sets: Idle replicas the relaxed services of each size k > 1 share
            (node sets of k GPUs; None or empty: none).
    """
    if not needs and idle <= 0 and not idle_sets:
        return Guard()
    pool = [g for g in gpus if g.pool is Pool.INFERENCE]
    busy: Counter[str] = Counter()
    starting: Counter[str] = Counter()
    sleeping: dict[str, list[GpuView]] = {}
    for g in pool:
        if g.service is None or not g.lead:
            continue
        if g.state is GpuState.RUNNING and g.gpu_id in loading:
            starting[g.service] += 1
        elif g.state in (GpuState.RUNNING, GpuState.PROTECT):
            busy[g.service] += 1
        elif g.state is GpuState.SLEEP:
            sleeping.setdefault(g.service, []).append(g)
    held: list[GpuId] = []
    missing: list[tuple[str, int]] = []
    keep_free = 0
    for name, need in needs.items():
        mine = sleeping.get(name, [])
        # A replica still loading is no warm one: the loaded SLEEP ones are held
        # as if it were not there (a request now would wait for its load).
        keep = max(need.hold - busy[name], 0)
        held.extend(gpu for g in mine[:keep] for gpu in g.members)
        loaded = busy[name] + starting[name] + len(mine)
        if need.warm > loaded:
            missing.append((name, need.warm - loaded))
        keep_free += max(need.hold - max(loaded, need.warm), 0)
    taken = set(held)
    free = [g for g in pool if g.state is GpuState.FREE]
    evictable = [g for g in pool if g.state is GpuState.SLEEP and g.gpu_id not in taken]
    lent = [g for g in pool if g.state is GpuState.LENT]
    ops: list[AnyOperation] = []
    warms: list[AnyOperation] = []
    reclaimed: list[GpuView] = []
    views = list(jobs)

    def take_back() -> GpuId:
        # ATS-I's least loss, seeing the jobs as the previous reclaims left them.
        nonlocal views
        state = InferenceState(now, cluster, tuple(gpus), tuple(views))
        pick = least_loss(state, lent, PlacementConfig())
        lent.remove(pick)
        reclaimed.append(pick)
        views = _without(views, pick)
        return pick.gpu_id

    def take_set(service: str, k: int, evict: bool) -> InferencePlacement | None:
        # ATS-I's rule for k GPUs of one node, over what is left of the inference
        # pool: the FREE GPUs, the unheld SLEEP replicas of other services
        # (``evict``) and the LENT GPUs not reclaimed yet; anything else reads as busy.
        nonlocal views, free
        left = {g.gpu_id for g in free} | {g.gpu_id for g in lent}
        if evict:
            left |= {g.gpu_id for g in evictable if g.service != service}
        # Training workers stay (the reclaim loss counts them); a replica on the
        # training pool reads as busy too (a pre-warm is on the inference pool only).
        seen = tuple(
            g
            if g.gpu_id in left or g.state is GpuState.TRAINING
            else dataclasses.replace(g, state=GpuState.RUNNING, job=None)
            for g in gpus
        )
        state = InferenceState(now, cluster, seen, tuple(views), gpus_per_replica=k)
        cfg = PlacementConfig(use_training_pool=False)
        p = place_multi(state, service, cfg, most_hits, frozenset())
        if p is None:
            return None
        byid = {g.gpu_id: g for g in gpus}
        done: set[GpuId] = set()
        for gpu in p.evicts:
            if gpu not in done:
                whole = byid[gpu].members
                done.update(whole)
                warms.append(EvictReplica(whole[0], byid[gpu].replica_gpus))
        evictable[:] = [g for g in evictable if g.gpu_id not in done]
        for gpu, _ in p.reclaims:
            g = byid[gpu]
            lent.remove(g)
            reclaimed.append(g)
            views = _without(views, g)
        used = set(p.members)
        spare_free = [
            dataclasses.replace(byid[g], state=GpuState.FREE, service=None, replica_gpus=())
            for g in sorted(done - used)
        ]
        free = sorted(
            [g for g in free if g.gpu_id not in used] + spare_free, key=lambda g: g.gpu_id
        )
        taken.update(used)
        return p

    for name, count in missing:
        cold = services[name].cold_start_s or 0.0
        until = now + cold + interval
        size = services[name].gpus_per_replica
        for _ in range(count):
            if size > 1:
                placed = take_set(name, size, evict=True)
                if placed is None:
                    break  # no node has k GPUs to spare
                warms.append(WarmReplica(placed.gpu, name, until, placed.gpus))
                continue
            if free:
                gpu = free.pop(0).gpu_id
            elif evictable:
                victim = evictable.pop(0)
                gpu = victim.gpu_id
                if victim.replica_gpus:  # a replica of several GPUs goes whole
                    warms.append(EvictReplica(victim.replica_gpus[0], victim.replica_gpus))
                    rest = [m for m in victim.replica_gpus if m != gpu]
                    evictable[:] = [g for g in evictable if g.gpu_id not in rest]
                else:
                    warms.append(EvictReplica(gpu))
            elif lent:
                gpu = take_back()
            else:
                break  # every inference GPU is serving: nothing more to warm
            warms.append(WarmReplica(gpu, name, until))
            taken.add(gpu)
    # The "in between" regime's FREE GPUs, after the pre-warms took theirs.
    kept = free[:keep_free]
    held.extend(g.gpu_id for g in kept)
    free = free[len(kept) :]

    # The relaxed services' idle pool: unheld sleeping replicas, FREE GPUs, reclaims
    # (least loss, wherever: a reclaim's choice is training's). With a host cache the
    # SLEEP and FREE GPUs of the nodes that hold the most models go first (stable: GPU
    # order among equals, and without a cache).
    def models(g: GpuView) -> int:
        return len(cached.get(g.node_id, ())) if cached else 0

    evictable.sort(key=lambda g: -models(g))
    free.sort(key=lambda g: -models(g))
    spare = [g.gpu_id for g in evictable if g.gpu_id not in taken][:idle]
    spare += [g.gpu_id for g in free][: idle - len(spare)]
    while len(spare) < idle and lent:
        spare.append(take_back())
    held.extend(spare)
    taken.update(spare)
    free = [g for g in free if g.gpu_id not in taken]
    for k, count in sorted((idle_sets or {}).items()):
        sets = [
            g for g in evictable if g.lead and len(g.members) == k and not taken & set(g.members)
        ][:count]
        for g in sets:
            held.extend(g.members)
            taken.update(g.members)
        evictable[:] = [g for g in evictable if g.gpu_id not in taken]
        for _ in range(count - len(sets)):
            placed = take_set("", k, evict=False)
            if placed is None:
                break
            held.extend(placed.members)
    pairs = [(g.gpu_id, g.job or "") for g in reclaimed]
    ops.extend(reclaim_ops(pairs, jobs, proactive=True))
    ops.extend(warms)
    return Guard(tuple(ops), frozenset(held))


def _without(jobs: list[JobView], gpu: GpuView) -> list[JobView]:
    """``jobs`` with one worker of ``gpu``'s job gone from ``gpu``'s node."""
    out = []
    for j in jobs:
        if j.name == gpu.job:
            ids = list(j.placement.node_ids)
            ids.remove(gpu.node_id)
            j = dataclasses.replace(j, placement=Placement.of(ids) if ids else EMPTY)
        out.append(j)
    return out


def reclaim_ops(
    reclaims: Sequence[tuple[GpuId, str]], jobs: Sequence[JobView], proactive: bool = False
) -> list[AnyOperation]:
    """A ``Reclaim`` of each ``(GPU, job)``, then one ``Resize`` per job that lost
    GPUs, to the ones it keeps (``Preempt`` when none): AFE's shrink.

    Raises:
        InvalidDecisionError: a job lacks a GPU on a reclaimed GPU's node.
    """
    ops: list[AnyOperation] = []
    lost: dict[str, list[int]] = {}
    for gpu, job in reclaims:
        ops.append(Reclaim(gpu, job, proactive=proactive))
        lost.setdefault(job, []).append(gpu[0])
    views = {j.name: j for j in jobs}
    for job, nodes in lost.items():
        old = views[job].placement if job in views else EMPTY
        ids = list(old.node_ids)
        for node in nodes:
            if node not in ids:
                raise InvalidDecisionError(f"reclaim from {job!r} on node {node}, which it lacks")
            ids.remove(node)
        new = Placement.of(ids)
        ops.append(Resize(job, old, new) if new else Preempt(job, old))
    return ops
