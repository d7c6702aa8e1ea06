"""The control loop: one event and one frozen snapshot in, the operations to apply out.

:class:`ControlLoop` owns the whole scheduling round of DeepBoot's shared cluster, for
the simulator and the runtime alike:

* **TICK**: the lending reserve and the lendable capacity, the training policy's
  allocation (validated), and which concrete GPUs each job takes or gives up
  (``Bind``/``Lend``/``Release``, evicting SLEEP replicas it lends); then a retry of
  the queued inference tasks.
* **INFERENCE_ARRIVAL**: the inference policy (ATS-I or a variant) places the task, or
  it is left waiting with a reason; a placement may ``Reclaim`` lent GPUs (the job
  shrinks: ``Resize``) or evict another service's SLEEP replica. A cold start is
  refused (the task waits) while its service has ``max_replicas`` replicas loaded
  (``Snapshot.services``); warm reuse always goes ahead.
  A service whose replicas serve several tasks at once (``concurrency > 1``): the
  task first joins a RUNNING replica of its service with a free slot
  (``Snapshot.replicas``; no cold start, whatever ``max_replicas``): a loaded one
  (fewest tasks in flight, then GPU order) before asking the policy; a replica still
  in its cold start (the one ready first) only when the policy offers no warm reuse
  either, rather than a new cold start. Only a task that finds every replica full
  goes to the policy as above.
* **INFERENCE_DONE**: a replica that serves nothing more goes RUNNING -> PROTECT
  (-> SLEEP at once when its protect time is 0); one that still serves tasks
  (``Snapshot.replicas``) stays RUNNING. Then a retry.
* **PROTECT_EXPIRED**: PROTECT -> SLEEP, then a retry.
* **REPLICA_WARM**: a replica pre-warmed by ``WarmReplica`` (a cold start with no
  task) is loaded: if no task joined it meanwhile, RUNNING -> PROTECT until the
  event's ``until`` (-> SLEEP at once when that has passed), then a retry; one that
  took a task serves it and stays RUNNING. While it loads it is in
  ``Snapshot.replicas`` with no task in flight, so an arrival of its service joins it
  as above, whatever the service's ``concurrency`` (1 included).
* **JOB_FINISHED**, **REPLICA_LOST**: a retry (the world has freed the GPUs).
* **WORKER_LOST**: a training round, as at a tick (the world has freed the dead
  worker's GPU; the policy says where its job goes on, at once rather than at the
  next tick), then a retry.
* **JOB_SUBMITTED**: nothing until the next tick.

With ``LoopSettings.event_lending`` a step that may have freed GPUs (a job finished
or arrived, a replica lost or gone to sleep, a reclaim) ends with the **top-up**
(:mod:`deepboot.policies.topup`): once the retry pass is over, if a GPU training may
use is free and a job has room, a TOP_UP continuation hands the free GPUs out at
once (queued jobs start, running ones grow; none shrinks or moves), within the
capacity a round would have: the SLO guard's held GPUs (worked out again at the
event; when the guard is short, no further inference GPU) and the lending reserve
are kept. The next round may undo it.

The SLO guard of a tick (:mod:`deepboot.scheduler.guard`) makes the ``WarmReplica``
operations; every step's ``WarmReplica`` operations are checked against the snapshot
(:func:`validate_warm_replicas`) before the step is returned.

A retry tries the queued tasks in arrival order, one placement per :class:`Step`: the
world applies it and calls :meth:`ControlLoop.step` again, with a fresh snapshot and
the step's ``retry`` cursor, until the cursor is None. Once a task of a service finds
no GPU, later tasks of that service are not tried in the same pass.

:meth:`ControlLoop.step` is a pure function of its arguments (randomness from the
generator passed in); :func:`run_event` is the small driver both worlds use through
the :class:`Backend` protocol: ``snapshot(event)`` and ``apply(step)``.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np

from deepboot.core.cluster import ClusterSpec, Pool
from deepboot.core.errors import InvalidDecisionError
from deepboot.core.gpu import GpuId, GpuState, GpuView
from deepboot.core.service import ServiceSpec
from deepboot.core.state import ClusterState, InferenceState, JobView
from deepboot.policies.forecast import ArrivalHistory
from deepboot.policies.inference import InferencePlacement, PlaceAction
from deepboot.policies.lending import LendReserveConfig, ServiceLoad, reserved_gpus
from deepboot.policies.lifecycle import LifecycleConfig, protect_time
from deepboot.policies.slo import (
    SloConfig,
    host_starts,
    idle_need,
    idle_need_multi,
    service_needs,
)
from deepboot.policies.topup import TopUpConfig
from deepboot.scheduler.decision import Decision, new_placement
from deepboot.scheduler.events import Event, EventKind
from deepboot.scheduler.guard import Guard, guard, reclaim_ops
from deepboot.scheduler.inference import InferenceScheduler, lendable_capacity
from deepboot.scheduler.loop import Scheduler
from deepboot.scheduler.operations import (
    AnyOperation,
    Bind,
    EvictReplica,
    GpuOperation,
    Lend,
    ProtectReplica,
    Reclaim,
    Release,
    SleepReplica,
    StartReplica,
    Unplaced,
    WaitReason,
    WarmReplica,
    members,
)


@dataclass(frozen=True, slots=True)
class PendingTask:
    """An inference task waiting for a GPU, as the world reports it."""

    name: str
    service: str


def _no_loads() -> Mapping[str, ServiceLoad]:
    return MappingProxyType({})


def _no_services() -> Mapping[str, ServiceSpec]:
    return MappingProxyType({})


_LOADED = frozenset({GpuState.RUNNING, GpuState.PROTECT, GpuState.SLEEP})
"""States of a GPU that holds a loaded replica."""


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """What a RUNNING replica of a service with ``concurrency > 1``, or a pre-warmed
    replica still loading (``WarmReplica``), serves.

    Attributes:
        in_flight: Tasks placed on it and not finished (0 only for a pre-warmed
            replica that no task has joined yet).
        ready_at: When its cold start ends (<= now once it is loaded): a task that
            joins it starts serving then.
    """

    in_flight: int
    ready_at: float


def _no_replicas() -> Mapping[GpuId, ReplicaLoad]:
    return MappingProxyType({})


def _no_arrivals() -> Mapping[str, ArrivalHistory]:
    return MappingProxyType({})


def _no_cache() -> Mapping[int, frozenset[str]]:
    return MappingProxyType({})


def _no_host_starts() -> Mapping[str, float]:
    return MappingProxyType({})


def _no_sleeping() -> Mapping[tuple[GpuId, ...] | GpuId, str]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the world reports before a step; never mutated.

    Attributes:
        now: Current (virtual or real) time, seconds.
        cluster: The cluster.
        jobs: Active training jobs, sorted by (submit_time, name).
        gpus: Every GPU, sorted by (node_id, index).
        waiting: Queued inference tasks, oldest first.
        loads: Recent load per service (for the lending reserve; TICK only).
        services: The services' specs, by name: a placement that would cold-start a
            replica of a service with ``max_replicas`` loaded already is refused (a
            service missing here has no cap), and a task may join a replica with
            fewer than ``concurrency`` tasks in flight.
        replicas: The RUNNING replicas of services with ``concurrency > 1``, and the
            pre-warmed replicas still loading (any concurrency), by GPU, as the world
            counts their tasks. A RUNNING replica missing here takes no other task,
            and serves nothing more once an INFERENCE_DONE or REPLICA_WARM names it
            (the simulator with ``concurrency = 1``; the runtime, whose router fills
            free slots itself and reports a replica only once it is idle). The
            runtime lists its pre-warmed replicas still loading as full (its router
            queues a request on one while it has room, and only one it has no room
            for becomes an arrival), and posts REPLICA_WARM only for one that loaded
            and took no request.
        arrivals: Each service's arrival counts in fixed bins up to now, for the SLO
            guard's forecast (TICK only, and only when SLO-guarded lending is on).
        cached: The models each node's host memory holds (``deepboot.world.hostcache``):
            a new replica of one there starts from it; empty without a host cache.
        host_start_s: Seconds a new replica of each service takes on a node whose
            cache holds its model (a *host start*, instead of its cold start); empty
            without a host cache.
        loading: The RUNNING GPUs whose replica is still loading (a cold or host
            start in progress; TICK only): the SLO guard does not count them among
            the loaded replicas it holds, so that it never lets a loaded replica be
            lent while a new one loads (a request now would wait for the load).
        sleeping: The GPUs of each server process kept asleep while its GPUs are
            lent, keyed by its GPU set (or bare GPU), valued by its service
            (``InferenceState.sleeping``: ATS-I wakes a server on its own GPUs
            first); empty in the simulator, and in the runtime until it keeps them.
    """

    now: float
    cluster: ClusterSpec
    jobs: tuple[JobView, ...]
    gpus: tuple[GpuView, ...]
    waiting: tuple[PendingTask, ...] = ()
    loads: Mapping[str, ServiceLoad] = field(default_factory=_no_loads)
    services: Mapping[str, ServiceSpec] = field(default_factory=_no_services)
    replicas: Mapping[GpuId, ReplicaLoad] = field(default_factory=_no_replicas)
    arrivals: Mapping[str, ArrivalHistory] = field(default_factory=_no_arrivals)
    cached: Mapping[int, frozenset[str]] = field(default_factory=_no_cache)
    host_start_s: Mapping[str, float] = field(default_factory=_no_host_starts)
    loading: frozenset[GpuId] = frozenset()
    sleeping: Mapping[tuple[GpuId, ...] | GpuId, str] = field(default_factory=_no_sleeping)


@dataclass(frozen=True, slots=True)
class LoopSettings:
    """The control loop's knobs.

    Attributes:
        interval: Seconds between ticks (the lending reserve's horizon).
        lending: Whether training may borrow idle inference-pool GPUs.
        lifecycle: The protect-time rule of idle replicas.
        reserve: The predictive lending reserve.
        slo: SLO-guarded lending (:mod:`deepboot.policies.slo`): at each tick the
            guard (:mod:`deepboot.scheduler.guard`) holds and pre-warms each
            service's forecast need, and an emptied replica sleeps at once (the
            guard, not a protect time, decides whether it is held or lent).
            Services' ``guaranteed_replicas`` are held and pre-warmed whatever it says.
        event_lending: Hand out GPUs freed between rounds at the event that frees
            them (the top-up, module docstring) instead of at the next round.
        resize_cost: Seconds the top-up takes a resize to cost a job whose view
            names none (it grows a job only when the gain over an interval pays it).
    """

    interval: float = 60.0
    lending: bool = True
    lifecycle: LifecycleConfig = field(default_factory=LifecycleConfig)
    reserve: LendReserveConfig = field(default_factory=LendReserveConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    event_lending: bool = False
    resize_cost: float = 10.0


@dataclass(frozen=True, slots=True)
class Retry:
    """Where a retry pass over the queued tasks stands.

    Attributes:
        position: Index in the snapshot's ``waiting`` of the next task to consider
            (tasks placed earlier in the pass have left the queue).
        blocked: Services with a task that found no GPU in this pass.
        round: The tick's training round is still to run (after the SLO guard's
            operations were applied), leaving ``held`` out of its capacity; the
            world snapshots it as a tick.
        held: Idle inference GPUs the guard keeps from that round.
        lend_after: When the pass is over, see whether the top-up has GPUs to give
            (``LoopSettings.event_lending``).
        top_up: The top-up is to run; the world snapshots it as TOP_UP.
    """

    position: int = 0
    blocked: frozenset[str] = frozenset()
    round: bool = False
    held: frozenset[GpuId] = frozenset()
    lend_after: bool = False
    top_up: bool = False


@dataclass(frozen=True, slots=True)
class Step:
    """The outcome of one step, to be applied in order.

    Attributes:
        ops: Operations, in the order they must be applied.
        unplaced: Jobs and tasks left waiting, with the reason.
        retry: Call :meth:`ControlLoop.step` again (after applying ``ops``, with a
            fresh snapshot) with this cursor; None when the event is fully handled.
        round: A training round ran (the policy was consulted): the job operations
            are that round's; otherwise a ``Resize`` is a reclaim's shrink.
    """

    ops: tuple[AnyOperation, ...] = ()
    unplaced: tuple[Unplaced, ...] = ()
    retry: Retry | None = None
    round: bool = False


_GPU_FREED = frozenset({EventKind.JOB_FINISHED, EventKind.REPLICA_LOST})
"""Events after which a GPU may be free: the queued inference tasks are retried."""

ROUND_KINDS = frozenset({EventKind.TICK, EventKind.WORKER_LOST})
"""Events answered by a training round: a world's snapshot for one carries what a
tick's does (every job as of now, the services' ``loads``)."""

RETRY = Event(EventKind.RETRY)
"""The event of a retry continuation (see :class:`Step`)."""

TOP_UP = Event(EventKind.TOP_UP)
"""The event of a top-up continuation (see :class:`Retry`)."""

_FREEING = frozenset(
    {
        EventKind.JOB_FINISHED,
        EventKind.JOB_SUBMITTED,
        EventKind.REPLICA_LOST,
        EventKind.INFERENCE_DONE,
        EventKind.PROTECT_EXPIRED,
        EventKind.REPLICA_WARM,
        EventKind.INFERENCE_ARRIVAL,
    }
)
"""Events whose step may leave a GPU free for training (a job finished, one arrived
that may take a free GPU, a replica lost or put to sleep, a reclaim's shrink)."""


class ControlLoop:
    """DeepBoot's control loop over a training scheduler and an inference scheduler.

    Holds no state of the world and never reads a clock: time is ``snapshot.now``.

    Args:
        training: The training-allocation step (policy plus validation).
        inference: The inference-placement step; None when there is no inference.
        settings: Knobs of the round.
    """

    def __init__(
        self,
        training: Scheduler,
        inference: InferenceScheduler | None = None,
        settings: LoopSettings | None = None,
    ) -> None:
        self.training = training
        self.inference = inference
        self.settings = settings or LoopSettings()

    def step(
        self,
        event: Event,
        snap: Snapshot,
        rng: np.random.Generator,
        cursor: Retry | None = None,
    ) -> Step:
        """The operations ``event`` calls for on ``snap`` (see the module docstring).

        Args:
            event: What happened; ``RETRY`` continues a retry pass at ``cursor``.
            snap: The world as of the event; never mutated.
            rng: The only source of randomness, passed to the policies.
            cursor: The previous step's ``retry`` (RETRY events only).

        Raises:
            InvalidDecisionError: a policy broke an invariant (an illegal
                ``WarmReplica`` included); nothing of the step is meant to be applied.
        """
        out = self._dispatch(event, snap, rng, cursor)
        if self.settings.event_lending and event.kind in _FREEING and _frees(event.kind, out):
            nxt = out.retry
            nxt = (
                Retry(lend_after=True) if nxt is None else dataclasses.replace(nxt, lend_after=True)
            )
            out = dataclasses.replace(out, retry=nxt)
        validate_warm_replicas(out.ops, snap.gpus, snap.services)
        return out

    def _dispatch(
        self, event: Event, snap: Snapshot, rng: np.random.Generator, cursor: Retry | None
    ) -> Step:
        kind = event.kind
        if kind in ROUND_KINDS:
            return self._round(snap, rng)
        if kind is EventKind.RETRY:
            return self._retry(snap, rng, cursor or Retry())
        if kind is EventKind.INFERENCE_ARRIVAL:
            return self._arrival(event, snap, rng)
        if kind is EventKind.INFERENCE_DONE:
            return self._replica_done(event, snap)
        if kind is EventKind.PROTECT_EXPIRED:
            return self._protect_expired(event, snap)
        if kind is EventKind.REPLICA_WARM:
            return self._replica_warm(event, snap)
        if kind in _GPU_FREED:
            return Step(retry=_retry_cursor(snap))
        if kind is EventKind.JOB_SUBMITTED:
            return Step()
        raise AssertionError(f"unhandled event kind {kind}")  # pragma: no cover

    # -- training --------------------------------------------------------------------

    def kept(self, snap: Snapshot, held: frozenset[GpuId] = frozenset()) -> frozenset[GpuId]:
        """Idle inference GPUs kept from this round: ``held`` (the SLO guard's) and
        the lending reserve's."""
        s = self.settings
        if not (s.lending and s.reserve.enabled) or not any(
            n.pool is Pool.INFERENCE for n in snap.cluster.nodes
        ):
            return held
        slots = {name: spec.concurrency for name, spec in snap.services.items()}
        sizes = {n: v.gpus_per_replica for n, v in snap.services.items() if v.gpus_per_replica > 1}
        return held | reserved_gpus(snap.gpus, snap.loads, s.interval, s.reserve, slots, sizes)

    def capacity(self, snap: Snapshot, kept: frozenset[GpuId] | None = None) -> Mapping[int, int]:
        """GPUs training may use per node now: the training pool, plus the idle
        inference GPUs that lending leaves, less ``kept`` (default: :meth:`kept`)."""
        cluster = snap.cluster
        if not any(n.pool is Pool.INFERENCE for n in cluster.nodes):
            cap = {n.node_id: (n.gpus if n.pool is Pool.TRAINING else 0) for n in cluster.nodes}
            for g in snap.gpus:
                if g.state is GpuState.DOWN:  # its node left (the runtime's fact)
                    cap[g.node_id] -= 1
            return MappingProxyType(cap)
        reserved = self.kept(snap) if kept is None else kept
        return lendable_capacity(cluster, snap.gpus, self.settings.lending, reserved)

    def guard(self, snap: Snapshot) -> Guard:
        """The SLO guard of a tick: each service's need (its forecast with ``slo``
        on, and its ``guaranteed_replicas`` always), held and pre-warmed."""
        s = self.settings
        if self.inference is None or not (
            s.slo.enabled or any(v.guaranteed_replicas for v in snap.services.values())
        ):
            return Guard()
        pool = sum(1 for g in snap.gpus if g.pool is Pool.INFERENCE)
        starts = host_starts(snap.services, snap.cached, snap.host_start_s, _loaded_models(snap))
        needs = service_needs(
            snap.services, snap.arrivals, snap.loads, snap.now, s.interval, s.slo, pool, starts
        )
        # Replicas serving on the inference pool: servers of the relaxed services'
        # shared pool that rejoin it when their task ends (idle_need).
        serving = Counter(
            g.service
            for g in snap.gpus
            if g.pool is Pool.INFERENCE and g.state is GpuState.RUNNING and g.service and g.lead
        )
        idle = idle_need(
            snap.services, snap.arrivals, snap.loads, s.interval, s.slo, starts, serving
        )
        idle_sets = idle_need_multi(
            snap.services, snap.arrivals, snap.loads, s.interval, s.slo, starts, serving
        )
        return guard(
            needs, snap.gpus, snap.jobs, snap.services, snap.cluster, snap.now, s.interval, idle,
            snap.cached, snap.loading, idle_sets,
        )  # fmt: skip

    def _round(self, snap: Snapshot, rng: np.random.Generator) -> Step:
        held = self.guard(snap)
        if held.ops:
            # Apply the guard first; the round then sees the GPUs it took.
            return Step(ops=held.ops, retry=Retry(round=True, held=held.held))
        return self._training(snap, rng, held.held)

    def _training(self, snap: Snapshot, rng: np.random.Generator, held: frozenset[GpuId]) -> Step:
        if not snap.jobs:
            return Step(retry=_retry_cursor(snap))
        capacity = self.capacity(snap, self.kept(snap, held))
        state = ClusterState(snap.now, snap.cluster, snap.jobs, capacity)
        decision = self.training.decide(state, rng)
        # Only the guard's GPUs are never assigned. The lending reserve is honoured by
        # count per node, not by identity (a round may lend a replica the reserve
        # kept and leave an unkept one on the same node): its published figures were
        # measured so, and change if it is fixed (docs/slo.md).
        gpu_ops = assign_gpus(snap.gpus, decision, held)
        unplaced = _waiting_jobs(state, decision)
        return Step(
            ops=(*gpu_ops, *decision.ops),
            unplaced=unplaced,
            retry=_retry_cursor(snap),
            round=True,
        )

    # -- inference -------------------------------------------------------------------

    def _arrival(self, event: Event, snap: Snapshot, rng: np.random.Generator) -> Step:
        task, service = event.job, event.service
        ops = self._place(task, service, snap, rng)
        if ops is None:
            return Step(unplaced=(Unplaced(task, WaitReason.NO_IDLE_GPU, inference=True),))
        return Step(ops=ops)

    def _retry(self, snap: Snapshot, rng: np.random.Generator, cursor: Retry) -> Step:
        if cursor.round:
            return self._training(snap, rng, cursor.held)
        if cursor.top_up:
            return self._top_up(snap)
        blocked = set(cursor.blocked)
        unplaced: list[Unplaced] = []
        for i in range(cursor.position, len(snap.waiting)):
            task = snap.waiting[i]
            if task.service in blocked:
                unplaced.append(Unplaced(task.name, WaitReason.BEHIND_SAME_SERVICE, True))
                continue
            ops = self._place(task.name, task.service, snap, rng)
            if ops is None:
                blocked.add(task.service)
                unplaced.append(Unplaced(task.name, WaitReason.NO_IDLE_GPU, True))
                continue
            # The placed task leaves the queue: the next one is now at index i.
            nxt = Retry(i, frozenset(blocked), lend_after=cursor.lend_after)
            return Step(ops=ops, unplaced=tuple(unplaced), retry=nxt)
        if cursor.lend_after and _spare(snap, self.settings.lending):
            return Step(unplaced=tuple(unplaced), retry=Retry(top_up=True))
        return Step(unplaced=tuple(unplaced))

    def _top_up(self, snap: Snapshot) -> Step:
        """Hand the GPUs free now to the jobs (the module docstring's top-up)."""
        held = frozenset[GpuId]()
        if self.inference is not None:
            kept = self.guard(snap)
            held = kept.held
            if kept.ops:
                # The guard is short (it would pre-warm or reclaim): lend nothing more.
                held |= frozenset(
                    g.gpu_id
                    for g in snap.gpus
                    if g.pool is Pool.INFERENCE and g.state in (GpuState.FREE, GpuState.SLEEP)
                )
        capacity = self.capacity(snap, self.kept(snap, held))
        state = ClusterState(snap.now, snap.cluster, snap.jobs, capacity)
        s = self.settings
        decision = self.training.top_up(state, TopUpConfig(s.interval, s.resize_cost))
        if not decision:
            return Step()
        return Step(ops=(*assign_gpus(snap.gpus, decision, held), *decision.ops))

    def _place(
        self, task: str, service: str, snap: Snapshot, rng: np.random.Generator
    ) -> tuple[AnyOperation, ...] | None:
        if self.inference is None:
            raise InvalidDecisionError(f"inference task {task!r} but no inference policy")
        slot = _free_slot(service, snap) if snap.replicas else None
        if slot is not None and slot[1].ready_at <= snap.now:
            return (_join(slot[0], service, task),)
        host = _host_nodes(snap, service)
        spec = snap.services.get(service)
        state = InferenceState(
            snap.now, snap.cluster, snap.gpus, snap.jobs, self.settings.lending,
            host, bool(host) and _host_first(snap, service),
            1 if spec is None else spec.gpus_per_replica, snap.sleeping,
        )  # fmt: skip
        placement = self.inference.place(state, service, rng)
        if placement is not None and placement.action.warm:
            return placement_ops(placement, task, service, snap)
        if slot is not None:
            # A replica still loading has room: wait for it rather than start another.
            return (_join(slot[0], service, task),)
        if placement is None:
            return None
        if _at_cap(service, snap):
            return None  # no new replica; warm reuse stays allowed
        return placement_ops(placement, task, service, snap)

    def _replica_done(self, event: Event, snap: Snapshot) -> Step:
        gpu = _gpu(snap, event.gpu)
        if gpu.state is not GpuState.RUNNING:
            raise InvalidDecisionError(f"task {event.job!r} ended on a {gpu.state.name} GPU")
        if snap.replicas and gpu.gpu_id in snap.replicas:
            return Step(retry=_retry_cursor(snap))  # it still serves: a slot is free
        # With SLO-guarded lending it sleeps at once: the next tick's guard, not a
        # protect time, decides whether it is held or lent.
        slo = self.settings.slo.enabled
        hold = 0.0 if slo else protect_time(gpu.hits, self.settings.lifecycle)
        whole = gpu.replica_gpus
        ops: list[AnyOperation] = [ProtectReplica(gpu.gpu_id, snap.now + hold, whole)]
        if hold <= 0:
            ops.append(SleepReplica(gpu.gpu_id, whole))
        return Step(ops=tuple(ops), retry=_retry_cursor(snap))

    def _protect_expired(self, event: Event, snap: Snapshot) -> Step:
        gpu = _gpu(snap, event.gpu)
        if gpu.state is not GpuState.PROTECT:
            return Step()  # reused since: nothing expires
        return Step(ops=(SleepReplica(gpu.gpu_id, gpu.replica_gpus),), retry=_retry_cursor(snap))

    def _replica_warm(self, event: Event, snap: Snapshot) -> Step:
        gpu = _gpu(snap, event.gpu)
        if gpu.state is not GpuState.RUNNING or gpu.service != event.service:
            return Step()  # changed since (the world's seq check normally drops it)
        load = snap.replicas.get(gpu.gpu_id)
        if load is not None and load.in_flight > 0:
            return Step()  # a task joined it while it loaded: it serves that task
        # ``until`` is the warm-up's own choice: the protect-time rule (which counts
        # hits of tasks served) does not apply to a replica that served none.
        until = max(event.until, snap.now)
        whole = gpu.replica_gpus
        ops: list[AnyOperation] = [ProtectReplica(gpu.gpu_id, until, whole)]
        if until <= snap.now:
            ops.append(SleepReplica(gpu.gpu_id, whole))
        return Step(ops=tuple(ops), retry=_retry_cursor(snap))


class Backend(Protocol):
    """A world the control loop drives: the simulator, or the runtime on Ray."""

    def snapshot(self, event: Event) -> Snapshot:
        """The world as the control loop must see it for ``event``."""
        ...

    def apply(self, step: Step) -> None:
        """Carry out ``step.ops`` in order, and queue ``step.unplaced`` inference tasks."""
        ...


Observer = Callable[[Event, "Retry | None", Snapshot, dict[str, Any], Step], None]
"""A hook :func:`run_event` calls after each step: (event, retry cursor, snapshot,
the generator's state before the step, the step). A recording of them replays the
loop step by step (``deepboot.world.recording``)."""


def run_event(
    loop: ControlLoop,
    event: Event,
    backend: Backend,
    rng: np.random.Generator,
    timer: Callable[[], float] | None = None,
    observe: Observer | None = None,
) -> float | None:
    """Handle ``event`` completely: step, apply, and continue any retry pass.

    Args:
        loop: The control loop.
        event: What happened (the world has already recorded its facts).
        backend: The world.
        rng: The run's generator.
        timer: A clock for the decision latency (injected; the loop reads none).
        observe: Told of every step, before it is applied (None: nobody).

    Returns:
        Seconds the training round's decision took (by ``timer``), or None when no
        round ran or no timer was given.
    """
    t0 = timer() if timer is not None else 0.0
    snap = backend.snapshot(event)
    state: dict[str, Any] = dict(rng.bit_generator.state) if observe is not None else {}
    step = loop.step(event, snap, rng)
    spent = (timer() - t0) if (timer is not None and step.round) else None
    if observe is not None:
        observe(event, None, snap, state, step)
    backend.apply(step)
    while step.retry is not None:
        cursor = step.retry
        t0 = timer() if timer is not None else 0.0
        # A tick's training round deferred behind the SLO guard sees the world as a
        # tick does (every job as of now); a top-up as one too (TOP_UP).
        snap = backend.snapshot(event if cursor.round else TOP_UP if cursor.top_up else RETRY)
        state = dict(rng.bit_generator.state) if observe is not None else {}
        step = loop.step(RETRY, snap, rng, cursor)
        if timer is not None and step.round:
            spent = timer() - t0
        if observe is not None:
            observe(RETRY, cursor, snap, state, step)
        backend.apply(step)
    return spent


# -- pure helpers ------------------------------------------------------------------------


def _at_cap(service: str, snap: Snapshot) -> bool:
    """Whether ``service`` already has its ``max_replicas`` replicas loaded (False
    when it has no cap: then nothing is counted)."""
    spec = snap.services.get(service)
    if spec is None or not spec.max_replicas:
        return False
    loaded = sum(1 for g in snap.gpus if g.service == service and g.state in _LOADED and g.lead)
    return loaded >= spec.max_replicas


def _host_nodes(snap: Snapshot, service: str) -> frozenset[int]:
    """The nodes whose host memory holds ``service``'s model."""
    if not snap.cached:
        return frozenset()
    spec = snap.services.get(service)
    if spec is None:
        return frozenset()
    return frozenset(n for n, models in snap.cached.items() if spec.model in models)


def _loaded_models(snap: Snapshot) -> frozenset[str]:
    """The models a replica holds on an inference GPU (none without a host cache)."""
    if not snap.host_start_s:
        return frozenset()
    services = snap.services
    return frozenset(
        services[g.service].model
        for g in snap.gpus
        if g.service is not None
        and g.service in services
        and g.state in _LOADED
        and g.pool is Pool.INFERENCE  # only the inference nodes have a cache
    )


def _host_first(snap: Snapshot, service: str) -> bool:
    """Whether a host start of ``service`` meets its SLO and a cold start does not."""
    spec = snap.services.get(service)
    host = snap.host_start_s.get(service)
    if spec is None or host is None:
        return False
    return host <= spec.slo_wait_s < (spec.cold_start_s or 0.0)


def _free_slot(service: str, snap: Snapshot) -> tuple[GpuView, ReplicaLoad] | None:
    """The RUNNING replica of ``service`` a task joins: one with fewer than its
    ``concurrency`` tasks in flight (with ``concurrency = 1``, only a pre-warmed
    replica still loading, with none), ready first, then the fewest tasks, then GPU
    order; None when every replica is full (or the service is unknown)."""
    spec = snap.services.get(service)
    if spec is None:
        return None
    best: tuple[GpuView, ReplicaLoad] | None = None
    best_key: tuple[float, int] | None = None
    for g in snap.gpus:
        load = snap.replicas.get(g.gpu_id)
        if load is None or g.service != service or load.in_flight >= spec.concurrency:
            continue
        key = (max(load.ready_at, snap.now), load.in_flight)
        if best_key is None or key < best_key:
            best, best_key = (g, load), key
    return best


def _join(gpu: GpuView, service: str, task: str) -> StartReplica:
    """Task ``task`` joins the RUNNING replica on ``gpu`` (no cold start; its hit
    count stays)."""
    if gpu.state is not GpuState.RUNNING:
        raise InvalidDecisionError(f"task {task!r} joins GPU {gpu.gpu_id}, {gpu.state.name}")
    return StartReplica(gpu.gpu_id, service, task, cold=False, hits=gpu.hits, gpus=gpu.replica_gpus)


def _retry_cursor(snap: Snapshot) -> Retry | None:
    return Retry() if snap.waiting else None


def _frees(kind: EventKind, step: Step) -> bool:
    """Whether ``step`` (of an event of ``kind`` in ``_FREEING``) may leave a GPU
    free for training: an idle replica put to sleep, a reclaim; a job's end or
    arrival, a replica lost, always."""
    if kind is EventKind.INFERENCE_ARRIVAL:
        return any(isinstance(op, Reclaim) for op in step.ops)
    if kind in (EventKind.INFERENCE_DONE, EventKind.PROTECT_EXPIRED, EventKind.REPLICA_WARM):
        return any(isinstance(op, SleepReplica) for op in step.ops)
    return True


def _spare(snap: Snapshot, lending: bool) -> bool:
    """Whether the top-up may have something to do: a GPU training could use is
    idle (FREE on the training pool; FREE or SLEEP on the inference pool, with
    lending) and a job could take more GPUs. Cheap: the top-up itself decides."""
    if not any(j.placement.num_replicas < j.max_replicas for j in snap.jobs):
        return False
    for g in snap.gpus:
        if g.pool is Pool.TRAINING:
            if g.state is GpuState.FREE:
                return True
        elif lending and g.state in (GpuState.FREE, GpuState.SLEEP):
            return True
    return False


def _gpu(snap: Snapshot, gpu_id: GpuId | None) -> GpuView:
    for g in snap.gpus:
        if g.gpu_id == gpu_id:
            return g
    raise InvalidDecisionError(f"event names unknown GPU {gpu_id}")


def _waiting_jobs(state: ClusterState, decision: Decision) -> tuple[Unplaced, ...]:
    """Jobs that hold no GPU after ``decision``, with the reason."""
    after = {j.name: j.placement for j in state.jobs}
    for op in decision:
        after[op.job] = new_placement(op)
    total = state.total_capacity
    out = []
    for job in state.jobs:
        if after[job.name]:
            continue
        smallest = max(job.min_replicas, job.target_num_replicas or 1, 1)
        reason = WaitReason.INSUFFICIENT_CAPACITY if smallest > total else WaitReason.NOT_SELECTED
        out.append(Unplaced(job.name, reason))
    return tuple(out)


def assign_gpus(
    gpus: Sequence[GpuView], decision: Decision, kept: frozenset[GpuId] = frozenset()
) -> tuple[GpuOperation, ...]:
    """Which GPUs the jobs of ``decision`` give up and take, as GPU operations.

    Every changed job first releases, on each node where it holds more GPUs than its
    new placement, its highest-indexed GPUs there. Then, job by job in decision order,
    node by node, it takes FREE GPUs in index order, then SLEEP ones (``EvictReplica``
    first), never one of ``kept`` (the SLO guard's held GPUs, which the capacity
    left out); a training-pool GPU is a ``Bind``, an inference-pool one a ``Lend``.
    A SLEEP replica of several GPUs is evicted whole when the job takes any of them
    (those it does not take stay FREE).

    Raises:
        InvalidDecisionError: a node lacks the FREE and SLEEP GPUs a job needs there
            (the capacity the policy saw was wrong: a bug).
    """
    state: dict[GpuId, GpuState] = {g.gpu_id: g.state for g in gpus}
    holder: dict[GpuId, str | None] = {g.gpu_id: g.job for g in gpus}
    pool = {g.gpu_id: g.pool for g in gpus}
    whole = {g.gpu_id: g.replica_gpus for g in gpus if g.replica_gpus}
    by_node: dict[int, list[GpuId]] = {}
    for g in gpus:
        by_node.setdefault(g.node_id, []).append(g.gpu_id)
    for ids in by_node.values():
        ids.sort()
    ops: list[GpuOperation] = []
    changed = [(op.job, new_placement(op)) for op in decision]
    for job, target in changed:
        want = target.counts()
        for node, ids in sorted(by_node.items()):
            mine = [g for g in ids if holder[g] == job]
            extra = len(mine) - want.get(node, 0)
            for gpu in sorted(mine, key=lambda g: -g[1])[: max(extra, 0)]:
                ops.append(Release(gpu, job))
                state[gpu], holder[gpu] = GpuState.FREE, None
    for job, target in changed:
        for node, count in sorted(target.counts().items()):
            ids = by_node.get(node, [])
            need = count - sum(1 for g in ids if holder[g] == job)
            if need <= 0:
                continue
            free = [g for g in ids if state[g] is GpuState.FREE and g not in kept]
            sleep = [g for g in ids if state[g] is GpuState.SLEEP and g not in kept]
            pick = (free + sleep)[:need]
            if len(pick) < need:
                raise InvalidDecisionError(
                    f"job {job!r} needs {need} more GPUs on node {node}, only "
                    f"{len(free)} FREE and {len(sleep)} SLEEP"
                )
            for gpu in pick:
                if state[gpu] is GpuState.SLEEP and gpu in whole:
                    # A replica of several GPUs is evicted whole: the rest go FREE.
                    ops.append(EvictReplica(whole[gpu][0], whole[gpu]))
                    for member in whole[gpu]:
                        state[member] = GpuState.FREE
                elif state[gpu] is GpuState.SLEEP:
                    ops.append(EvictReplica(gpu))
                training = pool[gpu] is Pool.TRAINING
                ops.append(Bind(gpu, job) if training else Lend(gpu, job))
                state[gpu] = GpuState.TRAINING if training else GpuState.LENT
                holder[gpu] = job
    return tuple(ops)


def placement_ops(
    p: InferencePlacement, task: str, service: str, snap: Snapshot
) -> tuple[AnyOperation, ...]:
    """The operations of one validated inference placement, in order: reclaims and the
    shrink of each job that lost GPUs, evictions, then the task's replica."""
    ops = reclaim_ops(p.reclaims, snap.jobs)
    if p.gpus or any(g.replica_gpus for g in snap.gpus if g.gpu_id in p.evicts):
        ops.extend(_evictions(p, snap))
    else:
        for gpu in p.evicts:
            if gpu != p.gpu:
                ops.append(EvictReplica(gpu))
        if p.action is PlaceAction.COLD_EVICT:
            ops.append(EvictReplica(p.gpu))
    target = next(g for g in snap.gpus if g.gpu_id == p.gpu)
    hits = target.hits + 1 if p.action is PlaceAction.WARM_PROTECT else 0
    ops.append(StartReplica(p.gpu, service, task, cold=not p.action.warm, hits=hits, gpus=p.gpus))
    return tuple(ops)


def _evictions(p: InferencePlacement, snap: Snapshot) -> list[AnyOperation]:
    """One ``EvictReplica`` per replica among ``p.evicts`` (whole replicas, by lead),
    in the order they are first listed; the one holding ``p.gpu`` last."""
    views = {g.gpu_id: g for g in snap.gpus}
    seen: set[GpuId] = set()
    out: list[AnyOperation] = []
    last: EvictReplica | None = None
    for gpu in p.evicts:
        if gpu in seen:
            continue
        whole = views[gpu].replica_gpus
        seen.update(whole or (gpu,))
        op = EvictReplica(whole[0], whole) if whole else EvictReplica(gpu)
        if p.gpu in (whole or (gpu,)):
            last = op
        else:
            out.append(op)
    if last is not None:
        out.append(last)
    return out


def validate_warm_replicas(
    ops: Sequence[AnyOperation], gpus: Sequence[GpuView], services: Mapping[str, ServiceSpec]
) -> None:
    """Check every ``WarmReplica`` of ``ops`` against the world, with the GPU operations
    before it in ``ops`` applied (an ``EvictReplica`` or ``Reclaim`` just before frees
    its GPU).

    Rules: the GPU exists, is on the inference pool and is FREE at that point; the
    service is in ``services``; ``until`` is a number; and the service's
    ``max_replicas`` (when set) is not reached counting every replica of it loaded or
    loading at that point. Cheap when ``ops`` has no ``WarmReplica`` (the usual case).

    Args:
        ops: A step's operations, in order; never mutated.
        gpus: Every GPU, as the step's snapshot has them.
        services: The services' specs, by name (``Snapshot.services``).

    Raises:
        InvalidDecisionError: the first ``WarmReplica`` that breaks a rule, named.
    """
    if not any(isinstance(op, WarmReplica) for op in ops):
        return
    pools = {g.gpu_id: g.pool for g in gpus}
    held: dict[GpuId, tuple[GpuState, str | None]] = {g.gpu_id: (g.state, g.service) for g in gpus}
    for op in ops:
        if isinstance(op, WarmReplica):
            for gpu in members(op):
                _check_warm(op, gpu, pools, held, services)
            for gpu in members(op):
                held[gpu] = (GpuState.RUNNING, op.service)
        elif isinstance(op, Bind):
            held[op.gpu] = (GpuState.TRAINING, None)
        elif isinstance(op, Lend):
            held[op.gpu] = (GpuState.LENT, None)
        elif isinstance(op, Release | Reclaim):
            held[op.gpu] = (GpuState.FREE, None)
        elif isinstance(op, EvictReplica):
            for gpu in members(op):
                held[gpu] = (GpuState.FREE, None)
        elif isinstance(op, StartReplica):
            for gpu in members(op):
                held[gpu] = (GpuState.RUNNING, op.service)
        elif isinstance(op, ProtectReplica | SleepReplica):
            state = GpuState.PROTECT if isinstance(op, ProtectReplica) else GpuState.SLEEP
            for gpu in members(op):
                held[gpu] = (state, held.get(gpu, (state, None))[1])


def _check_warm(
    op: WarmReplica,
    gpu: GpuId,
    pools: Mapping[GpuId, Pool],
    held: Mapping[GpuId, tuple[GpuState, str | None]],
    services: Mapping[str, ServiceSpec],
) -> None:
    what = f"WarmReplica of {op.service!r} on GPU {gpu}"
    pool = pools.get(gpu)
    if pool is None:
        raise InvalidDecisionError(f"{what}: no such GPU")
    if pool is not Pool.INFERENCE:
        raise InvalidDecisionError(f"{what}: a training-pool GPU (replicas run on inference)")
    state = held[gpu][0]
    if state is not GpuState.FREE:
        raise InvalidDecisionError(
            f"{what}: it is {state.name}, not FREE (evict a SLEEP replica or reclaim a "
            "LENT GPU earlier in the step)"
        )
    spec = services.get(op.service)
    if spec is None:
        raise InvalidDecisionError(f"{what}: unknown service")
    if math.isnan(op.until):
        raise InvalidDecisionError(f"{what}: until is NaN")
    if len(members(op)) != spec.gpus_per_replica:
        raise InvalidDecisionError(
            f"{what}: the service's replica spans {spec.gpus_per_replica} GPUs, the op "
            f"names {len(members(op))}"
        )
    if spec.max_replicas:
        gpus = sum(1 for st, svc in held.values() if svc == op.service and st in _LOADED)
        loaded = gpus // spec.gpus_per_replica
        if loaded >= spec.max_replicas:
            raise InvalidDecisionError(
                f"{what}: the service has {loaded} replicas loaded or loading, its "
                f"max_replicas is {spec.max_replicas}"
            )
