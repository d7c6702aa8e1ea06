"""The runtime as a world of the driver: its snapshot, its facts, and how it applies a
step of the control loop (every GPU change through the ledger; replicas started, woken
and killed; every job whose GPU set changed handed to its next generation)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from deepboot.core.cluster import ClusterSpec
from deepboot.core.errors import InvalidDecisionError
from deepboot.core.gpu import GpuState
from deepboot.core.placement import Placement
from deepboot.policies.forecast import ArrivalHistory
from deepboot.policies.lending import ServiceLoad
from deepboot.runtime.controller.eventlog import EventLog
from deepboot.runtime.controller.faults import CrashPoints
from deepboot.runtime.controller.generations import Generations
from deepboot.runtime.controller.hostcaches import HostCaches
from deepboot.runtime.controller.jobrecords import JobRec, gpu_name
from deepboot.runtime.controller.replicas import Replicas
from deepboot.runtime.controller.service_catalog import ServiceCatalog
from deepboot.runtime.controller.shared import Post, Requests
from deepboot.runtime.store.jobstore import LogKind
from deepboot.scheduler.control import ROUND_KINDS, ControlLoop, PendingTask, Snapshot, Step
from deepboot.scheduler.decision import Preempt, Resize, Start, new_placement
from deepboot.scheduler.events import Event, EventKind
from deepboot.scheduler.operations import (
    Bind,
    EvictReplica,
    GpuOperation,
    Lend,
    ProtectReplica,
    Reclaim,
    Release,
    SleepReplica,
    StartReplica,
    WarmReplica,
)
from deepboot.world.driver import is_stale
from deepboot.world.gpus import GpuBoard, apply_gpu_op

_APPLIED = (Bind, Lend, Release, Reclaim, EvictReplica, StartReplica, WarmReplica,
            ProtectReplica, SleepReplica, Start, Resize, Preempt)  # fmt: skip
"""The operations this world applies (every one the control loop makes)."""


def check_applicable(ops: Sequence[object]) -> None:
    """Refuse, before any of it is applied, a step with an operation this world does
    not know (a new operation must be added here, not dropped silently).

    Raises:
        InvalidDecisionError: naming the operation; nothing of the step was applied.
    """
    for op in ops:
        if not isinstance(op, _APPLIED):
            raise InvalidDecisionError(
                f"the runtime does not know how to apply {op!r}; nothing of the step was applied"
            )


def next_tick(now: float, origin: float, interval: float) -> float:
    """The first tick ``origin + k x interval`` (k >= 1) later than ``now``: ticks stay
    on their grid whatever the polls' jitter (``now + interval`` drifted by each
    iteration's lateness), and an iteration later than a whole interval skips the
    ticks it missed instead of running them back to back."""
    k = math.floor((now - origin) / interval) + 1
    return origin + max(k, 1) * interval


class RayBackend:
    """The control loop's second world: jobs, GPUs and replicas on a Ray cluster.

    ``snapshot`` reports the world as the loop sees it; ``apply`` records the GPU
    operations, starts, wakes and kills replicas, and hands every job whose GPU set
    changed (or, after a training round, that lost a worker) to the controller, which
    starts its next generation. A ``WarmReplica`` starts a replica with no request
    (:meth:`~.replicas.Replicas.warm_replica`). It refuses a step with
    an operation it does not know, before applying any of it.
    """

    def __init__(
        self,
        loop: ControlLoop,
        cluster: ClusterSpec,
        board: GpuBoard,
        jobs: dict[str, JobRec],
        requests: Requests,
        catalog: ServiceCatalog,
        replicas: Replicas,
        generations: Generations,
        log: EventLog,
        crash: CrashPoints,
        post: Post,
        interval: float,
        clock: Callable[[], float],
        caches: HostCaches,
    ) -> None:
        self.caches = caches
        self.loop, self.cluster, self.board, self.jobs = loop, cluster, board, jobs
        self.requests, self.catalog, self.replicas = requests, catalog, replicas
        self.generations, self.log, self.crash, self.post = generations, log, crash, post
        self.interval, self.clock = interval, clock
        self.tick0: float | None = None  # the first tick: the origin of the grid

    def snapshot(self, event: Event) -> Snapshot:
        board, requests, replicas = self.board, self.requests, self.replicas
        jobs = tuple(
            j.view(board, self.loop.training.job_mode)
            for j in sorted(self.jobs.values(), key=lambda j: (j.row.submitted, j.name))
            if j.active
        )
        gpus = board.views()
        waiting = tuple(PendingTask(t, s) for t, s in requests.waiting.items())
        now = self.clock()
        loads: dict[str, ServiceLoad] = {}
        arrivals: dict[str, ArrivalHistory] = {}
        settings = self.loop.settings
        rounds = event.kind in ROUND_KINDS or event.kind is EventKind.TOP_UP
        if rounds and requests.arrivals is not None:
            # SLO-guarded lending (it replaces the reserve): the guard's forecast reads
            # the binned arrivals and the mean run times, as the simulator's does.
            loads = requests.arrivals.loads()
            arrivals = requests.arrivals.histories(now)
        elif rounds and settings.lending and settings.reserve.enabled:
            loads = requests.demand.loads(now, settings.reserve.window_s)
        # Only a round's guard reads it (Snapshot.loading: TICK only, as the simulator).
        loading = frozenset(
            g.gpu_id
            for g in gpus
            if rounds
            and g.state is GpuState.RUNNING
            and replicas.is_loading(g.gpu_id, board.get(g.gpu_id).replica)
        )
        return Snapshot(
            now, self.cluster, jobs, gpus, waiting, MappingProxyType(loads),
            services=self.catalog.specs, replicas=replicas.warming_loads(),
            arrivals=MappingProxyType(arrivals), cached=self.caches.cached_models(),
            loading=loading, sleeping=replicas.sleeping(),
        )  # fmt: skip

    def record(self, now: float, event: Event) -> bool:
        """The facts of ``event`` (the controller recorded a message's on receipt):
        a replica's protect timer or idle report that no longer matches its GPU is
        moot, and so is an arrival the router withdrew; the first tick is the origin
        of the grid."""
        kind = event.kind
        if is_stale(self.board, event):
            return False
        if kind is EventKind.INFERENCE_ARRIVAL and event.job not in self.requests.arrived:
            # Withdrawn before the loop got to it: a replica that freed up took the
            # request (the router posts an arrival while every replica is busy).
            # Placing it anyway reclaimed a lent GPU for a request already served.
            return False
        if kind is EventKind.INFERENCE_DONE:
            assert event.gpu is not None
            return self.board.get(event.gpu).state is GpuState.RUNNING
        if kind is EventKind.TICK and self.tick0 is None:
            self.tick0 = now
        return True

    def after_tick(self, now: float) -> float:
        """The next tick, on the grid from the first one."""
        assert self.tick0 is not None
        return next_tick(now, self.tick0, self.interval)

    def after_event(self, now: float, event: Event) -> None:
        """Nothing: the controller flushes once per turn of its loop."""

    def apply(self, step: Step) -> None:
        """Apply ``step``: its GPU operations on the ledger (replicas around them),
        then each job operation (``Start``/``Resize``/``Preempt``), the intent its
        GPU operations carried out: the job's next generation goes on the GPUs the
        ledger says it holds, which must match the operation's placement.

        Raises:
            InvalidDecisionError: an operation this world cannot apply (before
                anything ran), an illegal GPU transition, or GPU operations that do
                not carry out their job's operation.
        """
        check_applicable(step.ops)
        touched: list[str] = []
        intents: dict[str, Placement] = {}
        for op in step.ops:
            if isinstance(op, Start | Resize | Preempt):
                intents[op.job] = new_placement(op)  # carried out below, once its GPUs moved
            elif isinstance(op, StartReplica):
                self.replicas.start_replica(op)  # through the ledger, around the actors
            elif isinstance(op, WarmReplica):
                self.replicas.warm_replica(op)  # likewise, with no request
            else:
                touched += self._apply_gpu_op(op)
        for u in step.unplaced:
            if u.inference and u.name in self.requests.arrived:
                self.requests.waiting.setdefault(u.name, self.requests.arrived[u.name])
        self._carry_out(intents, touched)
        if step.round:
            # A job that lost a worker and that the round left where it stands (the
            # survivors' GPUs: no operation of it) re-forms there: the round decided
            # its size; without one its group stays broken.
            for rec in self.jobs.values():
                if rec.lost and rec.name not in intents:
                    self.generations.retarget(rec)

    def _apply_gpu_op(self, op: GpuOperation) -> list[str]:
        """Apply one GPU operation on the ledger (which checks it), then what follows
        it around the replicas and the log; the job it moved a GPU of, if any."""
        gpu = self.board.get(op.gpu)
        replica, service = gpu.replica, gpu.service
        apply_gpu_op(self.board, op)  # every GPU change: the ledger checks it
        if isinstance(op, Bind | Lend | Release | Reclaim):
            ahead = isinstance(op, Reclaim) and op.proactive
            self.log.gpu(op.gpu, type(op).__name__.lower(), op.job, proactive=ahead)
            if isinstance(op, Reclaim):
                self.crash.hit("reclaim.applied")
            return [op.job]
        if isinstance(op, EvictReplica):
            # Its GPU leaves serving (lent, or free): a server that can sleep sleeps.
            self.replicas.replica_gone(op.gpu, replica, service, sleep=True, gpus=op.gpus)
        elif isinstance(op, ProtectReplica):
            # Not logged (every idle moment of a replica); SLEEP, when its GPU becomes
            # lendable, is. Its expiry is on the one queue.
            expiry = Event(EventKind.PROTECT_EXPIRED, seq=gpu.version, gpu=op.gpu)
            self.post(expiry, at=op.until)
        elif (
            isinstance(op, SleepReplica)
            and replica
            and self.replicas.first_sleep(op.gpu, replica, service)
        ):
            # Once per replica: its next sleeps follow warm reuses, not logged.
            self.log.note(LogKind.REPLICA, gpu=gpu_name(op.gpu), service=service, op="sleep")
        return []

    def _carry_out(self, intents: Mapping[str, Placement], touched: list[str]) -> None:
        """Start each job's next generation on the GPUs the ledger says it holds, once
        every GPU operation ran; they must match its operation's placement."""
        for job in dict.fromkeys(touched):
            if job not in intents:
                raise InvalidDecisionError(
                    f"GPUs of job {job} moved with no Start, Resize or Preempt of it"
                )
        for job, want in intents.items():
            held = Placement.of(g.node_id for g in self.board.held(job))
            if held != want:
                raise InvalidDecisionError(
                    f"{job}: its operation places it on nodes {want.counts()}, its GPU "
                    f"operations on {held.counts()}"
                )
            self.generations.retarget(self.jobs[job])
