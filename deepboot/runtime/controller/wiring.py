"""The runtime's controller: the control loop in real time, on a Ray cluster.

One per cluster, in the process :mod:`deepboot.runtime.controller_process` runs. It
recovers (from the store and the live actors:
:mod:`~deepboot.runtime.controller.recovery`), connects the router that process
opened (a :class:`~deepboot.runtime.messages.RouterPort`: it never imports
``http/``), and runs the driver (:mod:`deepboot.world.driver`) on a wall clock. Each
turn of its loop:

1. takes what the router reported (:mod:`~deepboot.runtime.controller.intake`): a request that
   found no free replica is an INFERENCE_ARRIVAL, an emptied replica an
   INFERENCE_DONE (a pre-warmed one that loaded and took no request: a
   REPLICA_WARM), a dead one a REPLICA_LOST; every request and answer counts in the
   services' load (and, with ``--slo``, in the SLO guard's arrival history);
2. when a poll is due, polls every worker (:mod:`~deepboot.runtime.controller.polling`) and
   reads submissions, cancellations and services from the store;
3. handles every event due, ticks and protect timers included, through the control
   loop and :class:`~deepboot.runtime.controller.adapter.RayBackend`, which moves GPUs on the
   ledger, starts (for a request, or pre-warmed with none), wakes and kills replicas
   (:mod:`~deepboot.runtime.controller.replicas`) and
   hands every job whose GPU set changed its next generation
   (:mod:`~deepboot.runtime.controller.generations`); a step that raises is logged
   (``decision_rejected``) and skipped, and the loop goes on;
4. writes jobs, GPUs and the event log to the store, in one transaction.

It holds no scheduling logic: which job or replica gets which GPU is the control
loop's. ``/healthz`` turns 503 when the loop stops turning.

:class:`Controller` only wires the parts together and runs the loop: each part owns
its state and is handed its collaborators (the store, the GPU ledger, the event log,
the actors, the clock, the other parts it calls) when it is built, in
:meth:`Controller.__init__`, in the order they depend on each other.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sqlite3
import statistics
import time
from collections.abc import Callable

import numpy as np

from deepboot.core.cluster import ClusterSpec
from deepboot.policies.slo import demand_views
from deepboot.runtime import messages as rt
from deepboot.runtime.actors.handles import Actors
from deepboot.runtime.controller.adapter import RayBackend
from deepboot.runtime.controller.controller_settings import (
    LATENCIES_KEPT,
    ControllerSettings,
    build_loop,
)
from deepboot.runtime.controller.eventlog import EventLog
from deepboot.runtime.controller.faults import CrashPoints, die
from deepboot.runtime.controller.generations import Generations
from deepboot.runtime.controller.hostcaches import HostCaches
from deepboot.runtime.controller.intake import Intake
from deepboot.runtime.controller.jobrecords import JobRec, gpu_name
from deepboot.runtime.controller.nodes import Nodes
from deepboot.runtime.controller.polling import Polling
from deepboot.runtime.controller.recovery import Recovery
from deepboot.runtime.controller.replicas import Replicas
from deepboot.runtime.controller.service_catalog import ServiceCatalog
from deepboot.runtime.controller.shared import Incarnations, Requests, RouterLink
from deepboot.runtime.controller.warmup import warm_kernels
from deepboot.runtime.controller.watchdog import TurnWatchdog
from deepboot.runtime.store.jobstore import GpuRow, JobRow, JobStore, LogKind
from deepboot.runtime.store.statedir import StateDir
from deepboot.scheduler.events import Event, EventKind
from deepboot.world.demand import DemandLedger
from deepboot.world.driver import Driver, WallClock
from deepboot.world.gpus import GpuBoard
from deepboot.world.recording import Recorder

__all__ = ["Controller"]

log = logging.getLogger("deepboot.controller")


class Controller:
    """See the module docstring.

    Args:
        state: The state directory.
        settings: The knobs.
        cluster: The cluster.
        actors: The processes' side (:class:`~deepboot.runtime.actors.handles.RayActors`).
        clock: Wall clock (injected for tests of the bookkeeping).
        crash: What dying at the crash point ``settings.crash_at`` means: SIGKILL
            (``faults.die``); in-process tests raise instead.

    Attributes:
        board: The GPU ledger: every GPU change goes through it, checked.
        jobs: The jobs not yet ended, by name (every part that needs them shares it).
        requests, catalog, generations, polling, replicas, nodes, intake, recovery:
            The parts (each in its own module).
        backend: The runtime's world, as the driver steps it.
        driver: The one driver: its queue holds the ticks and the protect timers.
    """

    def __init__(
        self,
        state: StateDir,
        settings: ControllerSettings,
        cluster: ClusterSpec,
        actors: Actors,
        clock: Callable[[], float] = time.time,
        crash: Callable[[str], None] = die,
    ) -> None:
        from deepboot.runtime.prometheus_metrics import Metrics  # prometheus_client: runtime extra

        self.state, self.settings, self.cluster = state, settings, cluster
        self.actors, self.clock = actors, clock
        self.store = JobStore(state.db)
        self.board = GpuBoard(cluster)  # the GPU ledger: every change is checked
        self.jobs: dict[str, JobRec] = {}
        self.rng = np.random.default_rng(settings.seed)
        self.loop = build_loop(settings)
        # What the loop sees and decides, step by step, for 'deepboot replay'.
        self.recorder = Recorder(state.recording, keep_bytes=settings.record_bytes)
        self.metrics = Metrics()
        self.inbox = rt.Inbox()
        self.log = EventLog(self.metrics)
        self.crash = CrashPoints(settings.crash_at, crash)
        self.router = RouterLink()
        incarnations = Incarnations(self.store)
        slo = self.loop.settings.slo
        # With --slo, the requests binned for the SLO guard's forecast (a bounded
        # history, as the simulator keeps it); None without.
        self.requests = Requests(
            DemandLedger(slo.forecast.bin_s, slo.forecast.history_bins) if slo.enabled else None
        )
        self._demand_at = -float("inf")  # the last write of the demand view (status)
        # What the last committed flush wrote (each flush writes only what changed
        # since), and what the Prometheus gauges were last set from.
        self._written_jobs: dict[str, JobRow] = {}
        self._written_gpus: list[GpuRow] = []
        self._world_gauged: tuple[object, ...] = ()
        # Each GPU's row, and the (version, replica) it was built at (-1: not yet).
        unbuilt = GpuRow("", 0, 0, "", "", "", "", "", 0, None)
        self._gpu_row_keys: list[tuple[int, str | None]] = [(-1, None)] * len(self.board.gpus)
        self._gpu_row_cache: list[GpuRow] = [unbuilt] * len(self.board.gpus)
        self.catalog = ServiceCatalog(
            self.store, self.log, self.router, clock, settings.shared.slo_target
        )
        self._wire_parts(incarnations)
        # The one driver: its queue holds the ticks and the replicas' protect timers;
        # its wall clock wakes early when the router posts a message.
        wall = WallClock(clock, self.inbox.wake, longest_wait=settings.poll)
        self.driver = Driver(
            self.loop, self.backend, self.rng, wall, on_rejected=self._rejected,
            observe=self.recorder.observe,
        )  # fmt: skip
        self._stop = False
        self.watchdog = TurnWatchdog(settings.slow_turn_s)

    def _wire_parts(self, incarnations: Incarnations) -> None:
        """Build the parts, each handed the collaborators it uses (the shared state
        first, then the parts it calls), and the world adapter the driver steps."""
        state, settings, cluster = self.state, self.settings, self.cluster
        actors, clock = self.actors, self.clock
        self.generations = Generations(
            state, settings, self.loop.training.job_mode, self.board, actors,
            incarnations=incarnations, clock=clock,
            log=self.log, flush=self.flush, crash=self.crash,
            # A worker on a GPU where a command server sleeps leaves its memory be.
            reserved_gb=lambda gpu: self.replicas.reserved_gb(gpu),
        )  # fmt: skip
        self.polling = Polling(
            self.jobs, self.generations, self.board, actors, settings,
            post=self.post, clock=clock,
            log=self.log, flush=self.flush, crash=self.crash,
        )  # fmt: skip
        self.caches = HostCaches(actors, settings, cluster, self.catalog)
        self.replicas = Replicas(
            self.board, self.catalog, self.requests, state, settings, cluster, actors,
            self.router, incarnations=incarnations, clock=clock,
            log=self.log, flush=self.flush, crash=self.crash, caches=self.caches,
        )  # fmt: skip
        self.nodes = Nodes(
            cluster, self.board, self.jobs, self.polling, self.replicas, actors, self.router,
            settings, self.log, self.post, clock, caches=self.caches,
        )  # fmt: skip
        self.intake = Intake(
            self.inbox, self.store, self.loop, cluster, self.board, self.jobs, self.requests,
            self.catalog, self.polling, self.replicas, self.nodes, actors, self.log,
            self.post, self.flush, clock, caches=self.caches,
        )  # fmt: skip
        self.recovery = Recovery(
            self.store, actors, self.board, self.jobs, self.catalog, self.generations,
            self.metrics, state, settings, post=self.post,
            log=self.log, flush=self.flush, crash=self.crash,
        )  # fmt: skip
        self.backend = RayBackend(
            self.loop, cluster, self.board, self.jobs, self.requests, self.catalog,
            self.replicas, self.generations, self.log, self.crash, self.post,
            settings.interval, clock, caches=self.caches,
        )  # fmt: skip

    def post(self, event: Event, at: float | None = None) -> None:
        """Schedule ``event`` on the driver's queue at ``at`` (None: now)."""
        self.driver.post(event, at)

    def _rejected(self, event: Event, exc: Exception) -> None:
        """The error boundary: a step that raised is logged and skipped."""
        log.error("the step for %s raised; skipped", event, exc_info=exc)
        self.log.note(LogKind.DECISION_REJECTED, event=event.kind.value, error=repr(exc)[-2000:])

    def flush(self) -> None:
        """Write the whole state and the waiting event-log records in one transaction:
        the records, the jobs, the GPUs, the services' changes, the caches, the
        counters, the SLO tally, the heartbeat and the decision latencies. Then drop
        the ended jobs, whose last row is written."""
        store = self.store
        gpus = self._gpu_rows()
        with store.transaction() as db:
            self.log.write(store, db)
            # Only what changed since the last flush committed: the rows are the same
            # after it (rows are frozen, replaced on every change; this controller is
            # the only writer of these columns and of the GPUs' table).
            written = self._written_jobs
            for j in self.jobs.values():
                if written.get(j.name) is not j.row:
                    store.save_job(db, j.row)
            if gpus != self._written_gpus:
                store.save_gpus(db, gpus)
            self.catalog.write_changes(db)
            self.caches.write(store, db)
            store.set_meta(db, "counters", json.dumps(self.metrics.counts()))
            slos = self.catalog.write_slo(db)
            self._write_demand(store, db)
            store.prune_events(db, self.settings.keep_events)
            store.set_meta(db, "heartbeat", repr(self.clock()))
            latencies = self.driver.decision_ms
            if latencies:
                del latencies[:-LATENCIES_KEPT]  # the latest decisions only
                median = statistics.median(latencies)
                store.set_meta(db, "rounds", str(self.driver.rounds))
                store.set_meta(db, "decision_ms_median", repr(median))
                store.set_meta(db, "decision_ms_max", repr(max(latencies)))
            store.set_meta(db, "controller_pid", str(os.getpid()))
        self._written_gpus = gpus
        # The gauges are a function of the GPUs' rows, the jobs' states and the SLOs:
        # set again only when one of them changed.
        world = (gpus, tuple(j.row.state.value for j in self.jobs.values()), slos)
        if world != self._world_gauged:
            self.metrics.set_world(
                ((r.pool, r.state, r.job, r.service) for r in self.board.gpus), world[1], slos
            )
            self._world_gauged = world
        # An ended job's last row is written: stop rewriting it every iteration.
        for name in [n for n, j in self.jobs.items() if j.row.state.ended]:
            del self.jobs[name]
        self._written_jobs = {n: j.row for n, j in self.jobs.items()}

    def _gpu_rows(self) -> list[GpuRow]:
        """Every GPU's row as the ledger holds it now. A GPU's row is built again only
        when its ``version`` (bumped by every change the ledger makes) or its replica's
        name (set by :mod:`~deepboot.runtime.controller.replicas` beside the ledger)
        moved since the last call."""
        rows, seen = self._gpu_row_cache, self._gpu_row_keys
        for i, r in enumerate(self.board.gpus):
            key = seen[i]
            if key[0] != r.version or key[1] != r.replica:
                seen[i] = (r.version, r.replica)
                rows[i] = GpuRow(
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
                )  # fmt: skip
        return list(rows)

    def _write_demand(self, store: JobStore, db: sqlite3.Connection) -> None:
        """With ``--slo``: each service's forecast, burstiness and the replicas they
        ask for (``demand`` meta, for ``status``), at most once per interval."""
        ledger = self.requests.arrivals
        now = self.clock()
        if ledger is None or now - self._demand_at < self.loop.settings.interval:
            return
        self._demand_at = now
        views = demand_views(
            self.catalog.specs, ledger.histories(now), ledger.loads(),
            self.loop.settings.interval, self.loop.settings.slo,
        )  # fmt: skip
        store.set_meta(
            db, "demand", json.dumps({n: dataclasses.asdict(v) for n, v in views.items()})
        )

    def connect_router(self, router: rt.RouterPort) -> None:
        """Hand the router that now serves what it needs from this controller: the
        services and their measured cold starts, each service's crash-loop back-off as
        the store kept it, and the live replicas recovered idle; then record where it
        listens (``http.json``): clients find it only once it knows the services."""
        self.router.port = router
        specs = self.catalog.specs
        router.set_services(specs, self.catalog.measured_cold_starts())
        now = self.clock()  # a back-off outlives the controller that started it
        for row in self.store.services():
            if row.load_failures and row.spec.name in specs:
                left = (row.backoff_until or now) - now
                router.restore_backoff(row.spec.name, row.load_failures, left)
        for rec in self.recovery.adopted:
            assert rec.replica is not None and rec.service is not None
            router.adopt_replica(
                gpu_name(rec.gpu_id), rec.service, rec.replica, self.actors.handle(rec.replica)
            )
        self.recovery.adopted.clear()
        router.write_address(self.state.http_file)

    def run(
        self,
        until: Callable[[], bool] | None = None,
        router: Callable[[], rt.RouterPort] | None = None,
    ) -> None:
        """Run the driver until SIGTERM/SIGINT (or ``until()`` is true): each turn
        takes what the router reported, polls the workers and reads the store when a
        poll is due, handles every event due, flushes, and waits for the next event,
        poll or message. ``router`` opens the HTTP endpoint (see :meth:`start`)."""
        self.start(router)
        signal.signal(signal.SIGTERM, lambda *_: self.request_stop())
        driver, clock = self.driver, self.driver.clock
        next_poll = 0.0
        self.watchdog.start()
        try:
            while not self._stop and not (until and until()):
                polled = time.monotonic() >= next_poll
                if polled:
                    next_poll = time.monotonic() + self.settings.poll
                with self.watchdog.turn():
                    self.turn(polled)
                poll_at = clock.now() + max(next_poll - time.monotonic(), 0.0)
                clock.wait_until(min(driver.queue.peek_time(), poll_at))
        finally:
            self.watchdog.stop()
            if self.router.port is not None:
                self.router.port.stop()
        # Stopped cleanly: the answers the router gave before it stopped count, and
        # the event log's last ``slo`` records equal the router's SLO counters. (The
        # other messages are moot now: a restarted controller recovers from the store.)
        for msg in self.inbox.drain():
            if isinstance(msg, rt.Answered):
                self.catalog.slo.record(msg.service, msg.within, self.clock(), msg.wait)
        self.catalog.log_slo(every_s=0.0)
        self.flush()

    def start(self, router: Callable[[], rt.RouterPort] | None = None) -> None:
        """Load the compiled kernels (:mod:`~deepboot.runtime.controller.warmup`), recover,
        start (or find) the node-local model caches and the standbys, open the HTTP
        endpoint with ``router`` and connect it (None: no endpoint, as in-process tests
        run), hand the replicas recovered idle to the loop, post the first tick."""
        self.recorder.start(self.settings.to_dict(), self.cluster)
        # Now, not in the turn after the first job forms (the loop would stand still).
        took = warm_kernels(self.settings.policy, self.settings.params)
        log.info("compiled kernels loaded in %.1f s", took)
        self.recovery.recover()
        for rec in self.recovery.adopted:  # loaded: it was idle
            assert rec.replica is not None and rec.service is not None
            self.replicas.adopt(rec.gpu_id, rec.replica, rec.service)
        self.caches.start()
        self.replicas.start_standbys()
        if router is not None:
            self.connect_router(router())
        for gpu in self.recovery.idle_recovered:
            self.post(Event(EventKind.INFERENCE_DONE, gpu=gpu))
        self.recovery.idle_recovered.clear()
        self.post(Event(EventKind.TICK))  # the first tick, the grid's origin

    def turn(self, polled: bool) -> None:
        """One turn of the loop: what the router reported; the workers and the store
        when a poll is due (``polled``); every event due; the flush."""
        self.intake.handle_messages()
        if polled:
            self.intake.iteration()
            # What the router reported while the poll waited on the workers, before
            # the due timers act on an older view (a protect timer would put to
            # sleep, and a tick lend, the GPU of a replica a request now waits for).
            self.intake.handle_messages()
        self.driver.run_due()
        if polled or self.log.pending:
            self.flush()
        if self.router.port is not None:
            self.router.port.beat()  # /healthz: the loop turns

    def request_stop(self) -> None:
        self._stop = True
        self.inbox.wake.set()
