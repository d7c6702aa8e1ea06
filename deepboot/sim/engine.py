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

* Every GPU has a :class:`~deepboot.core.gpu.GpuState` (:mod:`deepboot.sim.gpus`). A
  tick's capacity is every FREE, SLEEP, TRAINING or LENT GPU, inference-pool ones only
  when lending is on; placements on a node map to concrete GPUs, keeping the job's
  own, then FREE ones, then SLEEP ones (whose replicas are evicted).
* Inference tasks are placed at their arrival (:mod:`deepboot.sim.serving`). When
  the policy reclaims a lent GPU, the job shrinks at once with the restart model's
  scale-down cost and keeps running: it is rolled back to its state at the last
  tick, integrated up to the reclaim, resized, and integrated again to the next tick.
* A finished job's GPUs go FREE at its completion, so inference can use them before
  the next tick.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from deepboot.core.cluster import ClusterSpec, Pool
from deepboot.core.errors import ConfigError
from deepboot.core.gpu import GpuState
from deepboot.core.jobs import Workload
from deepboot.core.placement import Placement
from deepboot.core.state import ClusterState, JobView
from deepboot.perf.application import Application
from deepboot.policies.inference import InferencePolicy
from deepboot.policies.lending import reserved_gpus
from deepboot.scheduler import Event, EventKind, Scheduler, new_placement
from deepboot.scheduler.inference import InferenceScheduler, lendable_capacity
from deepboot.sim.config import SimConfig
from deepboot.sim.gpus import GpuBoard
from deepboot.sim.job import GroundTruth, JobCheckpoint, SimJob
from deepboot.sim.metrics import TimelinePoint
from deepboot.sim.serving import Serving

log = logging.getLogger(__name__)

ProgressCallback = Callable[[float, int, int], None]
"""``on_progress(now, completed_jobs, total_jobs)``, called at most once per tick."""

EventCallback = Callable[[float, Event, "Simulation"], None]
"""``on_event(now, event, sim)``, called after every handled event (a debug hook:
tests inspect ``sim.board``, ``sim.placements()`` and ``sim.waiting()``)."""


@dataclass(frozen=True, slots=True, order=True)
class _Entry:
    time: float
    priority: int
    seq: int
    event: Event


class EventQueue:
    """A heap of ``(time, priority, seq, event)``.

    Events pop in time order; at equal times by ``EventKind.priority``; then in
    insertion order (``seq``), so runs are deterministic.
    """

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[_Entry] = []
        self._seq = itertools.count()

    def push(self, at: float, event: Event) -> None:
        """Schedule ``event`` at virtual time ``at``."""
        heapq.heappush(self._heap, _Entry(at, event.kind.priority, next(self._seq), event))

    def pop(self) -> tuple[float, Event]:
        """Remove and return the next ``(time, event)``.

        Raises:
            IndexError: the queue is empty.
        """
        entry = heapq.heappop(self._heap)
        return entry.time, entry.event

    def peek_time(self) -> float:
        """Time of the next event (``inf`` when empty)."""
        return self._heap[0].time if self._heap else math.inf

    def __len__(self) -> int:
        return len(self._heap)


def training_capacity(cluster: ClusterSpec) -> Mapping[int, int]:
    """GPUs training may use per node without lending: every GPU of training-pool
    nodes, none elsewhere."""
    return MappingProxyType(
        {n.node_id: (n.gpus if n.pool is Pool.TRAINING else 0) for n in cluster.nodes}
    )


def _create_inference_policy(name: str) -> InferencePolicy:
    from deepboot.policies import inference

    return inference.create(name)


class Simulation:
    """One simulation run: builds the jobs, runs the event loop, keeps the outcome.

    Attributes:
        jobs: Every training job, in workload order.
        board: Every GPU's state and the GPU-seconds per state.
        serving: The inference side (None when the cluster has no inference pool or
            the workload no inference task).
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

        Raises:
            ConfigError: a job names an application missing from ``apps``, or the
                inference policy is unknown.
        """
        self.cluster = cluster
        self.scheduler = scheduler
        self.config = config
        self._has_pool = any(n.pool is Pool.INFERENCE for n in cluster.nodes)
        self._lending = config.lending and self._has_pool
        truths: dict[str, GroundTruth] = {}
        self.jobs: list[SimJob] = []
        mode = scheduler.job_mode
        for spec in workload.training:
            truth = truths.get(spec.application)
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
                )
            )
        self._by_name = {j.name: j for j in self.jobs}
        if len(self._by_name) != len(self.jobs):
            raise ConfigError(f"workload {workload.name!r} has duplicate job names")
        self._active: dict[str, SimJob] = {}
        self._submit_times = sorted(j.spec.submit_time for j in self.jobs)
        self._submitted = 0
        self.completed = 0
        self.rounds = 0
        self.decision_ms: list[float] = []
        self.now = 0.0
        self.start_time: float | None = None
        self.board = GpuBoard(cluster)
        self.timeline: list[TimelinePoint] = []
        self._queue = EventQueue()
        self._rng = np.random.default_rng(config.seed)
        self._horizon = 0.0
        # Reclaims need each job's state at the last tick (see the module docstring).
        self._checkpoints: dict[str, JobCheckpoint] = {}
        self._finish_seq: dict[str, int] = {}
        self._views: dict[str, JobView] = {}
        self._views_tuple: tuple[JobView, ...] | None = None
        self.serving: Serving | None = None
        if workload.inference and not self._has_pool:
            log.warning(
                "workload %s: ignoring its %d inference tasks (the cluster has no "
                "inference pool; see --inference-nodes)",
                workload.name,
                len(workload.inference),
            )
        elif workload.inference:
            policy = inference_policy or _create_inference_policy(config.inference_policy)
            self.serving = Serving(
                workload.inference,
                cluster,
                self.board,
                InferenceScheduler(policy),
                config.lifecycle,
                config.cold_start_of,
                self._lending,
                self._rng,
                self._queue.push,
                self._reclaim,
                self._job_views,
            )
        self._track = self.serving is not None and self._lending

    # -- public views ----------------------------------------------------------------

    def placements(self) -> dict[str, Placement]:
        """Placement of every training job that holds GPUs now."""
        return {name: self._by_name[name].placement for name, _ in self.board.holders()}

    def waiting(self) -> tuple[str, ...]:
        """Inference tasks queued for a GPU, oldest first."""
        return () if self.serving is None else self.serving.waiting()

    # -- the loop --------------------------------------------------------------------

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
            serving.schedule_arrivals()
        rng = self._rng
        interval = self.config.interval
        max_time = math.inf if self.config.max_time is None else self.config.max_time
        if self.jobs:
            queue.push(self._tick_at_or_after(self._submit_times[0], 1), Event(EventKind.TICK))
        check = self.config.check_invariants
        while queue and queue.peek_time() <= max_time:
            now, event = queue.pop()
            kind = event.kind
            if kind is EventKind.PROTECT_EXPIRED and self._all_done():
                continue  # nothing left to serve: idle replicas no longer matter
            if kind is EventKind.JOB_FINISHED and event.seq != self._finish_seq.get(event.job, 0):
                continue  # superseded: a reclaim changed the completion time
            if self.start_time is None:
                self.start_time = now
            self.now = now
            self.board.advance(now)
            if kind is EventKind.INFERENCE_ARRIVAL:
                assert serving is not None
                serving.arrive(event.job, now)
            elif kind is EventKind.INFERENCE_DONE:
                assert serving is not None
                serving.finish(event.job, now)
            elif kind is EventKind.PROTECT_EXPIRED:
                assert serving is not None and event.gpu is not None
                serving.expire(event.gpu, event.seq, now)
            elif kind is EventKind.JOB_SUBMITTED:
                self._active[event.job] = self._by_name[event.job]
                self._submitted += 1
                self._views_tuple = None
            elif kind is EventKind.JOB_FINISHED:
                del self._active[event.job]
                self.completed += 1
                self.board.release_job(event.job)
                self._drop_view(event.job)
                if serving is not None:
                    serving.retry(now)
            elif kind is EventKind.TICK:
                tick = round(now / interval)
                self._tick(now, rng, min((tick + 1) * interval, max_time))
                if serving is not None:
                    serving.retry(now)
                next_tick = self._next_tick(tick)
                if next_tick is not None:
                    queue.push(next_tick, Event(EventKind.TICK))
                if on_progress is not None:
                    on_progress(now, self.completed, len(self.jobs))
            else:  # pragma: no cover - exhaustiveness guard for future kinds
                raise AssertionError(f"unhandled event kind {event.kind}")
            self._sample(now)
            if check:
                self.board.check(self.placements())
            if on_event is not None:
                on_event(now, event, self)
        if self.timeline and self.timeline[-1].t < self.now:
            # Close the step function at the end of the run (duplicates were dropped).
            self.timeline.append(dataclasses.replace(self.timeline[-1], t=self.now))

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

    # -- training --------------------------------------------------------------------

    def _tick(self, now: float, rng: np.random.Generator, horizon: float) -> None:
        if not self._active:
            return
        active = sorted(self._active.values(), key=lambda j: (j.spec.submit_time, j.name))
        if self._has_pool:
            views = self.board.views()
            reserved: frozenset[tuple[int, int]] = frozenset()
            reserve = self.config.lend_reserve
            if self._lending and reserve.enabled and self.serving is not None:
                loads = self.serving.service_loads(now, reserve.window_s)
                reserved = reserved_gpus(views, loads, self.config.interval, reserve)
            capacity = lendable_capacity(self.cluster, views, self._lending, reserved)
        else:
            capacity = training_capacity(self.cluster)
        state = ClusterState(now, self.cluster, tuple(j.view(now) for j in active), capacity)
        # The sim layer may read a clock; the scheduler and policies never do.
        t0 = time.perf_counter()
        decision = self.scheduler.decide(state, rng)
        self.decision_ms.append((time.perf_counter() - t0) * 1e3)
        self.rounds += 1
        restart = self.config.restart
        changed = [(self._by_name[op.job], new_placement(op)) for op in decision]
        # Release first, so a GPU one job gives up can go to another on the same node.
        for job, placement in changed:
            self.board.shrink(job.name, placement)
        for job, placement in changed:
            self.board.grow(job.name, placement)
            job.reallocate(placement, now, restart)
        self._horizon = horizon
        if self.serving is not None:
            # What inference placements see until the next change (before the jobs
            # are integrated ahead to the next tick).
            self._views = {j.name: j.view(now) for j in active}
            self._views_tuple = None
        # Placements are fixed until the next tick unless a reclaim shrinks one:
        # integrate up to the tick now, keeping where each job was for a rollback.
        for job in active:
            if self._track:
                self._checkpoints[job.name] = job.checkpoint()
            if job.placement:
                self._integrate(job, horizon)

    def _integrate(self, job: SimJob, until: float) -> None:
        done = job.advance(until)
        if done is not None:
            seq = self._finish_seq.get(job.name, 0)
            self._queue.push(done, Event(EventKind.JOB_FINISHED, job.name, seq=seq))

    def _reclaim(self, name: str, nodes: Sequence[int], now: float) -> None:
        """Job ``name`` lost one GPU on each of ``nodes`` at ``now``: shrink it now."""
        job = self._by_name[name]
        cp = self._checkpoints.get(name)
        if cp is not None:
            job.rollback(cp)
        job.advance(now)
        # The completion predicted at the last tick no longer holds.
        self._finish_seq[name] = self._finish_seq.get(name, 0) + 1
        ids = list(job.placement.node_ids)
        for node in nodes:
            ids.remove(node)
        job.reallocate(Placement.of(ids), now, self.config.restart)
        self._checkpoints[name] = job.checkpoint()
        self._views[name] = job.view(now)
        self._views_tuple = None
        if job.placement:
            self._integrate(job, self._horizon)

    def _job_views(self) -> tuple[JobView, ...]:
        """Active jobs as of their last change (tick, reclaim, submission), ordered by
        (submit time, name)."""
        if self._views_tuple is None:
            views = self._views
            for name, job in self._active.items():
                if name not in views:
                    views[name] = job.view(self.now)
            ordered = sorted(views.values(), key=lambda v: (v.submit_time, v.name))
            self._views_tuple = tuple(ordered)
        return self._views_tuple

    def _drop_view(self, name: str) -> None:
        self._views.pop(name, None)
        self._views_tuple = None

    def _next_tick(self, tick: int) -> float | None:
        """The next tick after tick number ``tick``; None when nothing is left to do."""
        if self._active:
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


def _same_counts(a: TimelinePoint, b: TimelinePoint) -> bool:
    return (a.training, a.lent, a.running, a.protect, a.sleep, a.free) == (
        b.training,
        b.lent,
        b.running,
        b.protect,
        b.sleep,
        b.free,
    )
