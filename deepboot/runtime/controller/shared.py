"""The controller's state as each of its parts sees it, and what every part uses: the
event log (flushed with the state it describes), the driver's queue, the flush.

The controller (:mod:`deepboot.runtime.controller.wiring`) is assembled from parts,
each a small module with one concern: generations, worker polls, replicas, the Ray
cluster's live nodes, intake and recovery (each ``deepboot.runtime.controller.<part>``).
Each part builds on the ones before it, in that order.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from deepboot.core.cluster import ClusterSpec
from deepboot.core.gpu import GpuId
from deepboot.core.service import ServiceSpec
from deepboot.runtime import messages as rt
from deepboot.runtime.actors.handles import Actors
from deepboot.runtime.controller.controller_settings import LATENCIES_KEPT, ControllerSettings
from deepboot.runtime.controller.jobrecords import JobRec, gpu_name
from deepboot.runtime.slotally import ServiceSlo, SloTally
from deepboot.runtime.store.jobstore import GpuRow, JobStore, LogKind
from deepboot.runtime.store.statedir import StateDir
from deepboot.scheduler.control import ControlLoop
from deepboot.scheduler.events import Event
from deepboot.world.demand import DemandLedger, LoadWindow
from deepboot.world.driver import Driver
from deepboot.world.gpus import BoardGpu, GpuBoard

SLO_LOG_EVERY_S = 60.0
"""Least seconds between two ``slo`` event-log records of a service (while it serves)."""

if TYPE_CHECKING:
    from deepboot.runtime.controller.replicas import Warming
    from deepboot.runtime.prometheus_metrics import Metrics


class ControllerParts:
    """The controller's state (set by ``Controller.__init__``) and its shared helpers.

    Attributes:
        board: The GPU ledger: every GPU change goes through it, checked.
        jobs: The jobs not yet ended, by name.
        arrived: Request id -> service, until placed or withdrawn.
        waiting: The arrivals the loop could not place, in order.
        demand: Every request the router accepted and every answer: the services'
            load, for the lending reserve.
        arrivals: With ``--slo``: the same requests in fixed bins and the mean run
            times, for the SLO guard's forecast (``Snapshot.arrivals``); else None.
        warming: The pre-warmed replicas (``WarmReplica``) whose load the router has
            not reported yet, by GPU (at most one per GPU).
        slo: Every answer, within or over its service's ``slo_wait_s``, since this
            controller started and in the last 5 minutes (``deepboot status``).
        driver: The one driver: its queue holds the ticks and the protect timers.
    """

    state: StateDir
    settings: ControllerSettings
    cluster: ClusterSpec
    actors: Actors
    clock: Callable[[], float]
    store: JobStore
    board: GpuBoard
    jobs: dict[str, JobRec]
    loop: ControlLoop
    driver: Driver
    metrics: Metrics
    inbox: rt.Inbox
    router: rt.RouterPort | None
    specs: dict[str, ServiceSpec]
    arrived: dict[str, str]
    waiting: dict[str, str]
    demand: LoadWindow
    arrivals: DemandLedger | None
    warming: dict[GpuId, Warming]
    slo: SloTally
    # Each service's SLO counts as last written to the event log, and when (Unix).
    _slo_logged: dict[str, tuple[int, int, float]]
    _gpu_names: frozenset[str]
    _idle_recovered: list[GpuId]
    _adopt: list[BoardGpu]
    _cold_starts: list[tuple[str, float]]
    # The replica whose ``sleep`` was last logged, per GPU: logged once per replica
    # (with --slo a replica sleeps after every request, and warm reuses are not
    # logged, so a second ``sleep`` of the same replica would say nothing new).
    slept: dict[GpuId, str]
    # The replica that last reported Ready, per GPU: a RUNNING GPU whose replica is
    # not this one is still loading (``Snapshot.loading``).
    ready: dict[GpuId, str]
    # Crash-loop back-offs to record: service -> (failures in a row, Unix time before
    # which no replica starts, or None once it ended).
    _backoffs: dict[str, tuple[int, float | None]]
    _pending_log: list[tuple[LogKind, str, dict[str, Any]]]
    # The node-local model caches as this controller last heard from them: node ->
    # their view (``ModelCache.view``); the snapshot's ``cached`` is read from it.
    caches: dict[int, dict[str, Any]]
    _cached_view: Mapping[int, frozenset[str]] | None
    # With --standby-replicas: node -> its standby's actor name (not yet promoted).
    standbys: dict[int, str]
    _caches_changed: bool
    _tick0: float | None
    _last: float
    _stop: bool
    _crash: Callable[[str], None]

    def fault(self, point: str) -> None:
        """Crash point ``point`` (``runtime.faults``): the controller dies here when
        its settings' ``crash_at`` names it."""
        if point == self.settings.crash_at:
            self._crash(point)

    # -- logging into the store (flushed with the state it describes) ------------------------

    def note(self, kind: LogKind, job: str = "", **detail: Any) -> None:
        self._pending_log.append((kind, job, detail))
        self.metrics.count(kind, detail)

    def log_slo(self, every_s: float = SLO_LOG_EVERY_S) -> None:
        """Write each service's SLO counts since this controller started to the event
        log (``slo``: service, within, over) when they changed, at most once per
        ``every_s`` seconds per service (0: now, as at shutdown): a bounded record
        that the last one of a run equals the router's counters."""
        now = self.clock()
        for service, counts in sorted(self.slo.since_start().items()):
            within, over, at = self._slo_logged.get(service, (0, 0, -math.inf))
            if (counts.within, counts.over) != (within, over) and now - at >= every_s:
                self.note(LogKind.SLO, service=service, within=counts.within, over=counts.over)
                self._slo_logged[service] = (counts.within, counts.over, now)

    def log_gpu(self, gpu: GpuId, op: str, job: str, proactive: bool = False) -> None:
        """Log a GPU operation of ``job``; a reclaim says whether it was taken ahead
        of demand (``proactive``: the SLO guard's, for a pre-warm or the idle pool)
        or for a request that was waiting (reactive)."""
        extra = {"proactive": proactive} if op == "reclaim" else {}
        self.note(LogKind.GPU, job, gpu=gpu_name(gpu), op=op, **extra)

    def service_slos(self) -> dict[str, ServiceSlo]:
        """Each registered service's SLO as the guard applies it: its ``slo_wait_s``,
        and its ``slo_target`` unless ``--slo-target`` overrides every service's."""
        override = self.settings.shared.slo_target
        return {
            name: ServiceSlo(spec.slo_wait_s, spec.slo_target if override is None else override)
            for name, spec in sorted(self.specs.items())
        }

    def post(self, event: Event, at: float | None = None) -> None:
        """Schedule ``event`` on the driver's queue at ``at`` (None: now)."""
        self.driver.post(event, at)

    def flush(self) -> None:
        with self.store.transaction() as db:
            for kind, job, detail in self._pending_log:
                self.store.log(db, kind, job, **detail)
            self._pending_log.clear()
            for j in self.jobs.values():
                self.store.save_job(db, j.row)
            self.store.save_gpus(
                db,
                [
                    GpuRow(
                        gpu_name(r.gpu_id),
                        r.node_id,
                        r.index,
                        r.pool.value,
                        r.state.value,
                        r.job or "",
                        r.service or "",
                        r.replica or "",
                        r.hits,
                        r.protect_until,
                    )
                    for r in self.board.gpus
                ],
            )
            for service, seconds in self._cold_starts:
                self.store.set_cold_start(db, service, seconds)
            self._cold_starts.clear()
            for service, (failures, until) in self._backoffs.items():
                self.store.set_backoff(db, service, failures, until)
            self._backoffs.clear()
            if self._caches_changed:
                views = [self.caches[n] for n in sorted(self.caches)]
                self.store.set_meta(db, "host_cache", json.dumps(views))
                self._caches_changed = False
            self.store.set_meta(db, "counters", json.dumps(self.metrics.counts()))
            self.store.set_meta(db, "slo", json.dumps(self.slo.view(self.clock())))
            slos = self.service_slos()
            targets = {name: slo.target for name, slo in slos.items()}
            self.store.set_meta(db, "slo_targets", json.dumps(targets))
            self.store.prune_events(db, self.settings.keep_events)
            self.store.set_meta(db, "heartbeat", repr(self.clock()))
            latencies = self.driver.decision_ms
            if latencies:
                del latencies[:-LATENCIES_KEPT]  # the latest decisions only
                median = statistics.median(latencies)
                self.store.set_meta(db, "rounds", str(self.driver.rounds))
                self.store.set_meta(db, "decision_ms_median", repr(median))
                self.store.set_meta(db, "decision_ms_max", repr(max(latencies)))
            self.store.set_meta(db, "controller_pid", str(os.getpid()))
        self.metrics.set_world(
            ((r.pool, r.state, r.job, r.service) for r in self.board.gpus),
            (j.row.state.value for j in self.jobs.values()),
            slos,
        )
        # An ended job's last row is written: stop rewriting it every iteration.
        for name in [n for n, j in self.jobs.items() if j.row.state.ended]:
            del self.jobs[name]
