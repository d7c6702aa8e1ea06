"""The discrete-event engine: an event heap in virtual time driving the scheduler.

Training semantics (faithful to the Pollux reference simulator, ALGORITHMS §1b):

* Scheduling ticks run at ``k * interval`` for k >= 1, only while jobs are active;
  idle stretches are skipped straight to the first tick at or after the next
  submission (nothing changes during them, so the result is the same).
* A tick builds an immutable :class:`~deepboot.core.state.ClusterState` of the
  active (submitted, unfinished) jobs, asks the :class:`~deepboot.scheduler.Scheduler`
  for a validated decision and applies it. Placements then stay fixed until the
  next tick, so every placed job is integrated in closed form up to that tick right
  away; a job that finishes inside the interval gets a ``JOB_FINISHED`` event at its
  exact completion time.
* GPUs of a finished job are only handed out to training again at the next tick,
  as in the reference (which also learns about completions only when it steps).

The shared cluster (DeepBoot, ALGORITHMS §2), when the cluster has an inference pool:

* Every GPU has a :class:`~deepboot.core.gpu.GpuState` (:mod:`deepboot.world.gpus`). A
  tick's capacity is every FREE, SLEEP, TRAINING or LENT GPU, inference-pool ones only
  when lending is on; placements on a node map to concrete GPUs, keeping the job's
  own, then FREE ones, then SLEEP ones (whose replicas are evicted).
* Inference tasks are placed at their arrival (:mod:`deepboot.sim.serving`). When
  the policy reclaims a lent GPU, the job shrinks at once with the restart model's
  scale-down cost (a ``resize="restart"`` job: its full restart) and keeps running:
  it is rolled back to its state at the last tick, integrated up to the reclaim,
  resized, and integrated again to the next tick.
* A finished job's GPUs go FREE at its completion, so inference can use them before
  the next tick.
* A ``WarmReplica`` (a replica pre-warmed with no task) is RUNNING through its cold
  start; a task of its service that arrives meanwhile joins it (warm: it starts when
  the replica is ready). A ``REPLICA_WARM`` event at the ready time lets the loop
  protect a replica no task joined. The loop has validated the step (GPU, service,
  ``max_replicas``); the engine only refuses a GPU that is not FREE.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType

import numpy as np

from deepboot.core.cluster import ClusterSpec, Pool
from deepboot.core.errors import (
    ConfigError,
    SimulationStalledError,
    UnschedulableError,
)
from deepboot.core.gpu import GpuState
from deepboot.core.jobs import Workload
from deepboot.core.modes import JobMode
from deepboot.core.placement import Placement
from deepboot.core.service import ServiceSpec
from deepboot.core.state import JobView
from deepboot.perf.application import Application
from deepboot.perf.gputypes import TypedApps, require_types
from deepboot.perf.restart import job_resize_cost
from deepboot.policies.forecast import ArrivalHistory
from deepboot.policies.inference import InferencePolicy
from deepboot.policies.references import slo_references
from deepboot.policies.slo import SloConfig
from deepboot.scheduler import Event, EventKind, Scheduler, new_placement
from deepboot.scheduler import operations as ops
from deepboot.scheduler.control import (
    ControlLoop,
    Snapshot,
    Step,
)
from deepboot.scheduler.decision import Preempt, Resize, Start
from deepboot.scheduler.inference import InferenceScheduler
from deepboot.sim.config import SimConfig
from deepboot.sim.job import GroundTruth, JobCheckpoint, SimJob
from deepboot.sim.metrics import TimelinePoint
from deepboot.sim.serving import Serving, service_specs
from deepboot.world.demand import DemandLedger
from deepboot.world.driver import REPLICA_TIMERS, Driver, VirtualClock, is_stale
from deepboot.world.gpus import GpuBoard, apply_gpu_op
from deepboot.world.hostcache import HostCache
from deepboot.world.settings import loop_settings

log = logging.getLogger(__name__)

ProgressCallback = Callable[[float, int, int], None]
"""``on_progress(now, completed_jobs, total_jobs)``, called at most once per tick."""

EventCallback = Callable[[float, Event, "Simulation"], None]
"""``on_event(now, event, sim)``, called after every handled event (a debug hook:
tests inspect ``sim.board``, ``sim.placements()`` and ``sim.waiting()``)."""


def _create_inference_policy(name: str, params: Mapping[str, object]) -> InferencePolicy:
    from deepboot.policies import inference

    return inference.create(name, **params)


_FULL_COLLECTION_TICKS = 10_000
"""Ticks between full garbage collections during a run (see :func:`_collect_per_tick`)."""


@contextlib.contextmanager
def _collect_per_tick() -> Iterator[Callable[[], None]]:
    """Collect garbage once per tick instead of whenever allocations pass a threshold.

    A scheduling round allocates many short-lived containers while its memos are
    alive; the automatic collector scanned those memos again at each of its frequent
    young collections (~5% of a Pollux run). Here it is off during the run and the
    yielded function collects the young generations once per tick (a full collection
    every ``_FULL_COLLECTION_TICKS`` ticks), so cyclic garbage still goes. Collection
    never changes a result. The collector's state is restored on exit; when it was
    off already, nothing is collected.
    """
    enabled = gc.isenabled()
    ticks = 0

    def collect() -> None:
        nonlocal ticks
        ticks += 1
        gc.collect(2 if ticks % _FULL_COLLECTION_TICKS == 0 else 1)

    if not enabled:
        yield lambda: None
        return
    gc.disable()
    try:
        yield collect
    finally:
        gc.enable()


class _JobRecord:
    """Everything the engine keeps about one training job (one record per job).

    Attributes:
        job: The job's simulated state.
        active: Submitted and not finished.
        checkpoint: Its state at the last tick, for a reclaim's rollback.
        finish_seq: Version of its predicted completion; a JOB_FINISHED event with
            another ``seq`` is stale (a reclaim moved the completion).
        view: What inference placements see of it: its view as of its last change
            (tick, reclaim, submission).
    """

    __slots__ = ("job", "active", "checkpoint", "finish_seq", "view")

    def __init__(self, job: SimJob) -> None:
        self.job = job
        self.active = False
        self.checkpoint: JobCheckpoint | None = None
        self.finish_seq = 0
        self.view: JobView | None = None


class Simulation:
    """One simulation run: the control loop's simulated world (its first backend).

    The engine turns trace rows into events, keeps the simulated cluster, advances
    virtual time and records metrics. Every scheduling decision comes from
    :class:`~deepboot.scheduler.control.ControlLoop`: the engine hands it each event
    and a frozen :class:`~deepboot.scheduler.control.Snapshot`
    (:meth:`snapshot`) and carries out the operations it returns (:meth:`apply`).

    Attributes:
        jobs: Every training job, in workload order.
        board: Every GPU's state and the GPU-seconds per state.
        serving: The inference side (None when the cluster has no inference pool or
            the workload no inference task).
        loop: The control loop.
        rounds: Scheduling rounds run (ticks where the policy was consulted).
        decision_ms: Wall-clock milliseconds of each round's decision.
        timeline: GPU counts per state after each event time; consecutive equal
            counts are merged, and the last point is at ``now``.
        now: Virtual time of the last event handled.
        start_time: Virtual time of the first event handled.
    """

    def __init__(
        self,
        workload: Workload,
        cluster: ClusterSpec,
        scheduler: Scheduler,
        apps: Mapping[str, Application],
        config: SimConfig,
        inference_policy: InferencePolicy | None = None,
        typed_apps: TypedApps | None = None,
    ) -> None:
        """Prepare a run; nothing is simulated until :meth:`run`.

        Args:
            workload: Training jobs and inference tasks to replay.
            cluster: The cluster; its inference pool (if any) serves inference.
            scheduler: The training side's decision step.
            apps: Ground truth per application name.
            config: Run settings.
            inference_policy: Places inference tasks; None builds
                ``config.inference_policy`` from the inference registry (only when
                there is inference to place).
            typed_apps: On a cluster of several GPU types, ground truth per type and
                application (every type of the cluster, every application of the
                workload); ignored on one type.

        Raises:
            ConfigError: a job names an application missing from ``apps``, the
                inference policy is unknown, or a typed cluster lacks a (type,
                application) ground truth.
        """
        self.cluster = cluster
        self.config = config
        self._has_pool = any(n.pool is Pool.INFERENCE for n in cluster.nodes)
        self._lending = config.lending and self._has_pool
        truths: dict[str, GroundTruth] = {}
        typed = self._typed_truths(workload, cluster, typed_apps)
        node_types = cluster.node_types()
        self.jobs: list[SimJob] = []
        mode = scheduler.job_mode
        for spec in workload.training:
            truth = truths.get(spec.application)
            if truth is None and spec.application in typed:
                # Before its first run a job shows the first type's model.
                truth = truths[spec.application] = typed[spec.application][cluster.gpu_types[0]]
            if truth is None:
                app = apps.get(spec.application)
                if app is None:
                    raise ConfigError(
                        f"job {spec.name!r} uses unknown application {spec.application!r}; "
                        f"known: {', '.join(sorted(apps)) or '(none)'}"
                    )
                truth = truths[spec.application] = GroundTruth(app)
            self.jobs.append(
                SimJob(
                    spec,
                    truth,
                    mode,
                    fixed_batch_size=config.adaptive_batch_size.get(spec.application),
                    app_replica_cap=config.app_max_replicas.get(spec.application),
                    global_replica_cap=config.replica_cap,
                    round_epoch_times=config.round_epoch_times,
                    runtime_bounds=config.job_bounds == "runtime",
                    grad_min_replicas=config.grad_min_replicas,
                    profile_steps=config.profile_steps,
                    restart_cost=job_resize_cost(config.restart, spec),
                    truths=typed.get(spec.application),
                    node_types=node_types,
                    slowdown=config.slowdowns.get(spec.application, 1.0),
                    model_per_type=config.model_per_type,
                )
            )
        self._records = {j.name: _JobRecord(j) for j in self.jobs}
        if len(self._records) != len(self.jobs):
            raise ConfigError(f"workload {workload.name!r} has duplicate job names")
        self._check_schedulable(scheduler)
        # Index of the active records, in submission order.
        self._active: dict[str, _JobRecord] = {}
        self._submit_times = sorted(j.spec.submit_time for j in self.jobs)
        self._submitted = 0
        self.completed = 0
        self.now = 0.0
        self.start_time: float | None = None
        self.board = GpuBoard(cluster)
        self.timeline: list[TimelinePoint] = []
        self._rng = np.random.default_rng(config.seed)
        self._horizon = 0.0
        self._tick = 0
        self._views_tuple: tuple[JobView, ...] | None = None
        self._stalled_ticks = 0
        # Why each waiting job (as of the last round) and queued task waits.
        self._job_waits: dict[str, ops.WaitReason] = {}
        self._task_waits: dict[str, ops.WaitReason] = {}
        self.serving: Serving | None = None
        inference: InferenceScheduler | None = None
        slo = SloConfig()
        if workload.inference and not self._has_pool:
            log.warning(
                "workload %s: ignoring its %d inference tasks (the cluster has no "
                "inference pool; see --inference-nodes)",
                workload.name,
                len(workload.inference),
            )
        elif workload.inference:
            policy = inference_policy or _create_inference_policy(
                config.inference_policy, config.inference_params
            )
            inference = InferenceScheduler(policy)
            services = service_specs(workload.inference, config.cold_start_of, workload.services)
            services, slo = slo_references(
                workload.inference, services, config.slo, config.slo_reference
            )
            self.serving = Serving(workload.inference, services)
            if config.host_cache.enabled:
                pool = [n.node_id for n in cluster.nodes if n.pool is Pool.INFERENCE]
                self.serving.cache_models(HostCache(config.host_cache, pool), config.model_gb)
        loop = ControlLoop(
            scheduler,
            inference,
            loop_settings(
                config.interval,
                lending=self._lending,
                lifecycle=config.lifecycle,
                reserve=config.lend_reserve,
                slo=slo,
                event_lending=config.event_lending,
            ),
        )
        guarded = loop.settings.slo
        if self.serving is not None and guarded.enabled:
            # Binned as the loop's forecast reads them (paced to the interval).
            fc = guarded.forecast
            self.serving.demand = DemandLedger(fc.bin_s, fc.history_bins)
        # The one driver (its queue, its virtual clock, the decision timer).
        self.driver = Driver(loop, self, self._rng, VirtualClock(), time.perf_counter)
        self._queue = self.driver.queue
        self._max_time = math.inf
        self._check = False
        self._collect: Callable[[], None] = _nothing
        self._on_progress: ProgressCallback | None = None
        self._on_event: EventCallback | None = None
        # Jobs resized between ticks (reclaims; the top-up's grows) roll back to the
        # last tick's checkpoint; their views as of their last change are kept.
        self._eager = config.event_lending
        self._track = (self.serving is not None and self._lending) or self._eager
        self._live_views = self.serving is not None or self._eager
        # The SLO guard holds or pre-warms replicas at ticks: they go on while
        # inference runs, jobs or not.
        self._guarded = self.serving is not None and (
            self.loop.settings.slo.enabled
            or any(v.guaranteed_replicas for v in self.serving.services.values())
        )
        self._services: Mapping[str, ServiceSpec] = (
            MappingProxyType({}) if self.serving is None else self.serving.services
        )

    def _check_schedulable(self, scheduler: Scheduler) -> None:
        """Refuse a job whose smallest size exceeds every GPU its policy may give it.

        The smallest size is the requested replica count for a policy that runs jobs
        at a fixed size (``JobMode.FIXED``), else one GPU; the most GPUs are the
        training pool's, plus the inference pool's when lending is on. Such a job
        would be retried forever.

        Raises:
            UnschedulableError: the first such job, with the numbers.
        """
        nodes = self.cluster.nodes
        training = sum(n.gpus for n in nodes if n.pool is Pool.TRAINING)
        inference = sum(n.gpus for n in nodes if n.pool is Pool.INFERENCE)
        most = training + (inference if self._lending else 0)
        fixed = scheduler.job_mode is JobMode.FIXED
        for job in self.jobs:
            smallest = job.spec.num_replicas if fixed else 1
            if smallest <= most:
                continue
            if self._lending:
                room = f"{_gpus(training)} of the training pool plus {inference} lendable"
            elif inference:
                room = f"{_gpus(training)} of the training pool (lending is off)"
            else:
                room = f"the cluster's {_gpus(training)}"
            size = "its requested size" if fixed else "at least one GPU"
            raise UnschedulableError(
                f"job {job.name!r} can never run: policy {scheduler.policy.name!r} runs it "
                f"on {smallest} GPUs ({size}), and training may use at most {most}: {room}"
            )

    # -- public views ----------------------------------------------------------------

    def placements(self) -> dict[str, Placement]:
        """Placement of every training job that holds GPUs now."""
        return {name: self._records[name].job.placement for name, _ in self.board.holders()}

    def waiting(self) -> tuple[str, ...]:
        """Inference tasks queued for a GPU, oldest first."""
        return () if self.serving is None else self.serving.waiting()

    def wait_reason(self, name: str) -> ops.WaitReason | None:
        """Why training job or inference task ``name`` holds no GPU, as the control
        loop last said (None when it runs, or was never left waiting)."""
        return self._job_waits.get(name) or self._task_waits.get(name)

    # -- the loop --------------------------------------------------------------------

    @staticmethod
    def _typed_truths(
        workload: Workload, cluster: ClusterSpec, typed_apps: TypedApps | None
    ) -> dict[str, dict[str, GroundTruth]]:
        """Application -> GPU type -> ground truth, on a cluster of several types
        (one per pair, shared by the application's jobs); empty on one type."""
        if not cluster.heterogeneous:
            return {}
        names = sorted({spec.application for spec in workload.training})
        require_types(typed_apps or {}, cluster.gpu_types, names)
        assert typed_apps is not None
        return {
            name: {t: GroundTruth(typed_apps[t][name]) for t in cluster.gpu_types} for name in names
        }

    def run(
        self, on_progress: ProgressCallback | None = None, on_event: EventCallback | None = None
    ) -> None:
        """Run the event loop until every job and task finished, or ``config.max_time``.

        Args:
            on_progress: Called once per tick with (now, completed, total jobs).
            on_event: Called after every handled event (debug hook).

        Raises:
            InvalidDecisionError: a policy broke an invariant (nothing of that
                decision was applied).
        """
        queue = self._queue
        for job in sorted(self.jobs, key=lambda j: (j.spec.submit_time, j.name)):
            queue.push(job.spec.submit_time, Event(EventKind.JOB_SUBMITTED, job.name))
        serving = self.serving
        if serving is not None:
            for at, arrival in serving.arrival_events():
                queue.push(at, arrival)
        interval = self.config.interval
        max_time = math.inf if self.config.max_time is None else self.config.max_time
        if self._guarded and serving is not None and serving.tasks:
            # The guard's first tick: two intervals before the first arrival (or 0),
            # so that it can pre-warm for it.
            first = min(t.spec.submit_time for t in serving.tasks.values())
            if self.jobs:
                first = min(first, self._submit_times[0])
            k = max(math.floor(first / interval) - 2, 0)
            queue.push(k * interval, Event(EventKind.TICK))
        elif self.jobs:
            queue.push(self._tick_at_or_after(self._submit_times[0], 1), Event(EventKind.TICK))
        self._max_time, self._check = max_time, self.config.check_invariants
        self._on_progress, self._on_event = on_progress, on_event
        with _collect_per_tick() as collect:
            self._collect = collect
            try:
                self.driver.run_due(max_time)
            finally:
                self._collect = _nothing
        if self.timeline and self.timeline[-1].t < self.now:
            # Close the step function at the end of the run (duplicates were dropped).
            self.timeline.append(dataclasses.replace(self.timeline[-1], t=self.now))

    @property
    def loop(self) -> ControlLoop:
        """The control loop the driver steps (a test may wrap it)."""
        return self.driver.loop

    @loop.setter
    def loop(self, value: ControlLoop) -> None:
        self.driver.loop = value

    @property
    def rounds(self) -> int:
        """Scheduling rounds run (ticks where the policy was consulted)."""
        return self.driver.rounds

    @property
    def decision_ms(self) -> list[float]:
        """Wall-clock milliseconds of each round's decision."""
        return self.driver.decision_ms

    # -- the driver's hooks ------------------------------------------------------------

    def record(self, now: float, event: Event) -> bool:
        """Record what ``event`` says happened; False when the event is moot."""
        if not self._record_facts(now, event):
            return False
        if event.kind is EventKind.TICK:
            interval = self.config.interval
            self._tick = tick = round(now / interval)
            self._horizon = min((tick + 1) * interval, self._max_time)
        return True

    def after_tick(self, now: float) -> float | None:
        """Stop a stalled run, report progress; the next tick (None: the run ends)."""
        self._check_progress(now)
        next_tick = self._next_tick(self._tick)
        if self._on_progress is not None:
            self._on_progress(now, self.completed, len(self.jobs))
        self._collect()
        return next_tick

    def after_event(self, now: float, event: Event) -> None:
        """Sample the timeline; the invariant check and the debug hook, if asked."""
        self._sample(now)
        if self._check:
            self.board.check(self.placements())
        if self._on_event is not None:
            self._on_event(now, event, self)

    def _record_facts(self, now: float, event: Event) -> bool:
        """Record what ``event`` says happened; False when the event is moot."""
        kind = event.kind
        serving = self.serving
        if kind in REPLICA_TIMERS:
            if self._all_done():
                return False  # nothing left to serve: idle replicas no longer matter
            if is_stale(self.board, event):
                return False  # the replica changed since (reused, or joined by a task)
        if kind is EventKind.JOB_FINISHED and event.seq != self._records[event.job].finish_seq:
            return False  # superseded: a reclaim changed the completion time
        if self.start_time is None:
            self.start_time = now
        self.now = now
        self.board.advance(now)
        if kind is EventKind.INFERENCE_ARRIVAL:
            assert serving is not None
            serving.arrived(event.job, now)
        elif kind is EventKind.INFERENCE_DONE:
            assert serving is not None
            serving.ended(event.job, now)
        elif kind is EventKind.REPLICA_WARM:
            assert serving is not None and event.gpu is not None
            serving.warmed(event.gpu)
        elif kind is EventKind.JOB_SUBMITTED:
            self._active[event.job] = self._records[event.job]
            self._records[event.job].active = True
            self._submitted += 1
            self._views_tuple = None
        elif kind is EventKind.JOB_FINISHED:
            rec = self._active.pop(event.job)
            rec.active = False
            rec.view = None
            self._views_tuple = None
            self.completed += 1
            self.board.release_job(event.job)
        return True

    def _check_progress(self, now: float) -> None:
        """Count ticks on which jobs wait, none holds a GPU and nothing but ticks is
        scheduled; stop the run after ``config.stall_ticks`` of them in a row.

        Raises:
            SimulationStalledError: the run stalled; the message names waiting jobs
                and why they wait.
        """
        board = self.board
        idle = (
            self._active
            and self._queue.only_ticks
            and board.count(GpuState.TRAINING) + board.count(GpuState.LENT) == 0
        )
        self._stalled_ticks = self._stalled_ticks + 1 if idle else 0
        if self._stalled_ticks < self.config.stall_ticks:
            return
        waiting = list(self._active)[:5]
        reasons = ", ".join(
            f"{name} ({(r.value if (r := self.wait_reason(name)) else 'no reason given')})"
            for name in waiting
        )
        more = len(self._active) - len(waiting)
        raise SimulationStalledError(
            f"no progress for {self._stalled_ticks} ticks at {now:g} s: {len(self._active)} "
            f"jobs wait, none runs, and nothing else is scheduled; waiting: {reasons}"
            + (f" and {more} more" if more > 0 else "")
        )

    def _all_done(self) -> bool:
        training = self.completed == len(self.jobs)
        return training and (self.serving is None or self.serving.all_done)

    def _sample(self, now: float) -> None:
        """Append the GPU counts after the events at ``now`` to the timeline."""
        c = self.board.counts()
        point = TimelinePoint(
            now,
            c[GpuState.TRAINING],
            c[GpuState.LENT],
            c[GpuState.RUNNING],
            c[GpuState.PROTECT],
            c[GpuState.SLEEP],
            c[GpuState.FREE],
        )
        line = self.timeline
        if line and line[-1].t == now:
            line.pop()
        if line and _same_counts(line[-1], point):
            return
        line.append(point)

    # -- the backend -----------------------------------------------------------------

    def snapshot(self, event: Event) -> Snapshot:
        """The world for ``event``: at a tick, every active job as of now and the
        services' recent load; at a top-up, that load with the jobs as of their last
        change; otherwise the jobs as of their last change (what the reference's
        inference placement sees between ticks)."""
        now = self.now
        serving = self.serving
        waiting = () if serving is None else serving.pending()
        if event.kind in _TICK_LIKE:
            if event.kind is EventKind.TICK:
                active = sorted(
                    self._active.values(), key=lambda r: (r.job.spec.submit_time, r.job.name)
                )
                jobs = tuple(r.job.view(now) for r in active)
            else:
                # A top-up between ticks: each job as of its last change (its state
                # now is integrated ahead to the next tick).
                jobs = self._job_views()
            reserve = self.config.lend_reserve
            demand = None if serving is None else serving.demand
            arrivals: Mapping[str, ArrivalHistory] = MappingProxyType({})
            if demand is not None:
                loads = demand.loads()
                arrivals = MappingProxyType(demand.histories(now))
            elif serving is not None and self._lending and reserve.enabled:
                loads = serving.service_loads(now, reserve.window_s)
            else:
                loads = {}
            snap = Snapshot(
                now,
                self.cluster,
                jobs,
                self.board.views(),
                waiting,
                MappingProxyType(loads),
                self._services,
                arrivals=arrivals,
                loading=frozenset() if serving is None else serving.loading(now),
            )
        else:
            jobs = self._job_views() if self._live_views else ()
            snap = Snapshot(
                now, self.cluster, jobs, self.board.views(), waiting, services=self._services
            )
        if serving is not None and serving.reports_replicas:
            snap = dataclasses.replace(snap, replicas=serving.replica_loads())
        if serving is not None and serving.cache is not None:
            snap = dataclasses.replace(
                snap, cached=serving.cache.view(), host_start_s=serving.host_start_s
            )
        return snap

    def apply(self, step: Step) -> None:
        """Carry out a step's operations in order (see :mod:`deepboot.scheduler.operations`).

        Raises:
            InvalidDecisionError: an operation's GPU transition is illegal, or a
                ``WarmReplica``'s GPU is not FREE (the control loop validates a step
                before it returns it; this is a guard, and may leave it half-applied).
        """
        now = self.now
        board = self.board
        serving = self.serving
        # The SLO guard's ops at a tick come before the tick's round (their step asks
        # for it): every job already stands at the tick (the last round integrated it
        # up to here), so its shrink is a plain reallocation now, like the round's own.
        # Integrating it ahead to the next tick here (``_shrink_now``, for reclaims
        # between ticks) counted that interval twice once the round resized it again.
        at_tick = step.round or (step.retry is not None and step.retry.round)
        cache = serving.cache if serving is not None else None
        for op in step.ops:
            if isinstance(op, Start | Resize | Preempt):
                if at_tick:
                    self._records[op.job].job.reallocate(
                        new_placement(op), now, self.config.restart
                    )
                else:
                    self._shrink_now(op.job, new_placement(op), now)
                continue
            # A RUNNING replica takes another task (a free slot of its concurrency, or
            # a pre-warmed replica still loading).
            joined = isinstance(op, ops.StartReplica) and board.get(op.gpu).state is _RUNNING
            loaded = board.get(op.gpu).service if cache is not None else None
            gpu = apply_gpu_op(board, op)
            assert gpu is not None
            if loaded is not None and gpu.service != loaded:
                assert serving is not None
                serving.evicted(op.gpu, loaded)  # its weights stay in the node's memory
            if isinstance(op, ops.Reclaim):
                assert serving is not None
                serving.reclaim_times.append(now)
                if op.proactive:
                    serving.proactive_reclaim_times.append(now)
            elif isinstance(op, ops.StartReplica):
                assert serving is not None
                task = serving.started(op.task, op.gpu, op.cold, now, joined)
                self._task_waits.pop(op.task, None)
                assert task.end is not None
                self._queue.push(task.end, Event(EventKind.INFERENCE_DONE, op.task, gpu=op.gpu))
            elif isinstance(op, ops.WarmReplica):
                assert serving is not None  # validated: the service is known
                ready = serving.warming(op.gpu, op.service, now)
                warm = Event(
                    EventKind.REPLICA_WARM,
                    seq=gpu.version,
                    gpu=op.gpu,
                    service=op.service,
                    until=op.until,
                )
                self._queue.push(ready, warm)
            elif isinstance(op, ops.ProtectReplica) and op.until > now:
                expiry = Event(EventKind.PROTECT_EXPIRED, seq=gpu.version, gpu=op.gpu)
                self._queue.push(op.until, expiry)
        for u in step.unplaced:
            if u.inference:
                assert serving is not None
                serving.enqueue(u.name)
                self._task_waits[u.name] = u.reason
        if step.round:
            self._job_waits = {u.name: u.reason for u in step.unplaced if not u.inference}
            self._after_round(now)

    # -- training --------------------------------------------------------------------

    def _after_round(self, now: float) -> None:
        """Placements are fixed until the next tick unless a reclaim shrinks one:
        integrate every active job up to the tick now, keeping where each was."""
        active = self._active_sorted()
        if self._live_views:
            # What inference placements see until the next change (before the jobs
            # are integrated ahead to the next tick).
            for rec in active:
                rec.view = rec.job.view(now)
            self._views_tuple = None
        for rec in active:
            if self._track:
                rec.checkpoint = rec.job.checkpoint()
            if rec.job.placement:
                self._integrate(rec, self._horizon)

    def _active_sorted(self) -> list[_JobRecord]:
        """The active jobs' records, by (submit time, name)."""
        return sorted(self._active.values(), key=lambda r: (r.job.spec.submit_time, r.job.name))

    def _integrate(self, rec: _JobRecord, until: float) -> None:
        done = rec.job.advance(until)
        if done is not None:
            self._queue.push(done, Event(EventKind.JOB_FINISHED, rec.job.name, seq=rec.finish_seq))

    def _shrink_now(self, name: str, placement: Placement, now: float) -> None:
        """Job ``name`` lost GPUs to inference at ``now``, between ticks: roll it back to
        the last tick, integrate it to now, resize it, and integrate it to the next tick."""
        rec = self._records[name]
        job = rec.job
        if rec.checkpoint is not None:
            job.rollback(rec.checkpoint)
        job.advance(now)
        # The completion predicted at the last tick no longer holds.
        rec.finish_seq += 1
        job.reallocate(placement, now, self.config.restart)
        rec.checkpoint = job.checkpoint()
        rec.view = job.view(now)
        self._views_tuple = None
        if job.placement:
            self._integrate(rec, self._horizon)

    def _job_views(self) -> tuple[JobView, ...]:
        """Active jobs as of their last change (tick, reclaim, submission), ordered by
        (submit time, name)."""
        if self._views_tuple is None:
            for rec in self._active.values():
                if rec.view is None:
                    rec.view = rec.job.view(self.now)
            ordered = sorted(
                (r.view for r in self._active.values() if r.view is not None),
                key=lambda v: (v.submit_time, v.name),
            )
            self._views_tuple = tuple(ordered)
        return self._views_tuple

    def _serving_done(self) -> bool:
        return self.serving is None or self.serving.all_done

    def _next_tick(self, tick: int) -> float | None:
        """The next tick after tick number ``tick``; None when nothing is left to do."""
        if self._active or (self._guarded and not self._serving_done()):
            # The SLO guard runs at every tick while inference may still arrive.
            return (tick + 1) * self.config.interval
        if self._submitted < len(self._submit_times):
            return self._tick_at_or_after(self._submit_times[self._submitted], tick + 1)
        return None

    def _tick_at_or_after(self, t: float, first: int) -> float:
        """The earliest tick time ``k * interval >= t`` with ``k >= first``."""
        interval = self.config.interval
        k = max(first, math.ceil(t / interval))
        if k * interval < t:
            k += 1
        return k * interval


_RUNNING = GpuState.RUNNING
_TICK_LIKE = frozenset({EventKind.TICK, EventKind.TOP_UP})
"""Snapshots with the services' loads and arrivals (what a round's guard reads)."""


def _nothing() -> None:
    pass


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _same_counts(a: TimelinePoint, b: TimelinePoint) -> bool:
    return (a.training, a.lent, a.running, a.protect, a.sleep, a.free) == (
        b.training,
        b.lent,
        b.running,
        b.protect,
        b.sleep,
        b.free,
    )
