"""The discrete-event engine: an event heap in virtual time driving the scheduler.

Semantics (faithful to the Pollux reference simulator, ALGORITHMS §1b):

* Scheduling ticks run at ``k * interval`` for k >= 1, only while jobs are active;
  idle stretches are skipped straight to the first tick at or after the next
  submission (nothing changes during them, so the result is the same).
* A tick builds an immutable :class:`~deepboot.core.state.ClusterState` of the
  active (submitted, unfinished) jobs, asks the :class:`~deepboot.scheduler.Scheduler`
  for a validated decision and applies it. Placements then stay fixed until the
  next tick, so every placed job is integrated in closed form up to that tick right
  away; a job that finishes inside the interval gets a ``JOB_FINISHED`` event at its
  exact completion time.
* GPUs of a finished job are only handed out again at the next tick, as in the
  reference (which also learns about completions only when it steps).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from deepboot.core.cluster import ClusterSpec, Pool
from deepboot.core.errors import ConfigError
from deepboot.core.jobs import Workload
from deepboot.core.state import ClusterState
from deepboot.perf.application import Application
from deepboot.scheduler import Event, EventKind, Scheduler, new_placement
from deepboot.sim.config import SimConfig
from deepboot.sim.job import GroundTruth, SimJob

log = logging.getLogger(__name__)

ProgressCallback = Callable[[float, int, int], None]
"""``on_progress(now, completed_jobs, total_jobs)``, called at most once per tick."""


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
    """GPUs training may use per node: every GPU of training-pool nodes, none elsewhere.

    Inference nodes are not lent yet (a later issue adds lending).
    """
    return MappingProxyType(
        {n.node_id: (n.gpus if n.pool is Pool.TRAINING else 0) for n in cluster.nodes}
    )


class Simulation:
    """One simulation run: builds the jobs, runs the event loop, keeps the outcome.

    Attributes:
        jobs: Every training job, in workload order.
        rounds: Scheduling rounds run (ticks where the policy was consulted).
        decision_ms: Wall-clock milliseconds of each round's decision.
        now: Virtual time of the last event handled.
    """

    def __init__(
        self,
        workload: Workload,
        cluster: ClusterSpec,
        scheduler: Scheduler,
        apps: Mapping[str, Application],
        config: SimConfig,
    ) -> None:
        """Prepare a run; nothing is simulated until :meth:`run`.

        Raises:
            ConfigError: a job names an application missing from ``apps``.
        """
        self.cluster = cluster
        self.scheduler = scheduler
        self.config = config
        self._capacity = training_capacity(cluster)
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
        if workload.inference:
            log.warning(
                "workload %s: ignoring its %d inference tasks (no inference pool simulated yet)",
                workload.name,
                len(workload.inference),
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

    def run(self, on_progress: ProgressCallback | None = None) -> None:
        """Run the event loop until every job finished, or ``config.max_time``.

        Raises:
            InvalidDecisionError: the policy broke an invariant (nothing of that
                round was applied).
        """
        queue = EventQueue()
        for job in sorted(self.jobs, key=lambda j: (j.spec.submit_time, j.name)):
            queue.push(job.spec.submit_time, Event(EventKind.JOB_SUBMITTED, job.name))
        rng = np.random.default_rng(self.config.seed)
        interval = self.config.interval
        max_time = math.inf if self.config.max_time is None else self.config.max_time
        if self.jobs:
            queue.push(self._tick_at_or_after(self._submit_times[0], 1), Event(EventKind.TICK))
        while queue and queue.peek_time() <= max_time:
            now, event = queue.pop()
            self.now = now
            if event.kind is EventKind.JOB_SUBMITTED:
                self._active[event.job] = self._by_name[event.job]
                self._submitted += 1
            elif event.kind is EventKind.JOB_FINISHED:
                del self._active[event.job]
                self.completed += 1
            elif event.kind is EventKind.TICK:
                tick = round(now / interval)
                self._tick(now, rng, queue, min((tick + 1) * interval, max_time))
                next_tick = self._next_tick(tick)
                if next_tick is not None:
                    queue.push(next_tick, Event(EventKind.TICK))
                if on_progress is not None:
                    on_progress(now, self.completed, len(self.jobs))
            else:  # pragma: no cover - exhaustiveness guard for future kinds
                raise AssertionError(f"unhandled event kind {event.kind}")

    def _tick(
        self, now: float, rng: np.random.Generator, queue: EventQueue, horizon: float
    ) -> None:
        if not self._active:
            return
        active = sorted(self._active.values(), key=lambda j: (j.spec.submit_time, j.name))
        state = ClusterState(now, self.cluster, tuple(j.view(now) for j in active), self._capacity)
        # The sim layer may read a clock; the scheduler and policies never do.
        t0 = time.perf_counter()
        decision = self.scheduler.decide(state, rng)
        self.decision_ms.append((time.perf_counter() - t0) * 1e3)
        self.rounds += 1
        restart = self.config.restart
        for op in decision:
            self._by_name[op.job].reallocate(new_placement(op), now, restart)
        # Placements are fixed until the next tick: integrate up to it now.
        for job in active:
            if job.placement:
                done = job.advance(horizon)
                if done is not None:
                    queue.push(done, Event(EventKind.JOB_FINISHED, job.name))

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
