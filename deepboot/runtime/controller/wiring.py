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
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from deepboot.core.cluster import ClusterSpec
from deepboot.core.gpu import GpuId
from deepboot.core.service import ServiceSpec
from deepboot.runtime import messages as rt
from deepboot.runtime.actors.handles import Actors
from deepboot.runtime.controller.adapter import RayBackend
from deepboot.runtime.controller.controller_settings import (
    ControllerSettings,
    build_loop,
)
from deepboot.runtime.controller.faults import die
from deepboot.runtime.controller.jobrecords import JobRec, gpu_name
from deepboot.runtime.controller.recovery import Recovery
from deepboot.runtime.controller.replicas import Warming
from deepboot.runtime.controller.warmup import warm_kernels
from deepboot.runtime.controller.watchdog import TurnWatchdog
from deepboot.runtime.slotally import SloTally
from deepboot.runtime.store.jobstore import JobStore, LogKind
from deepboot.runtime.store.statedir import StateDir
from deepboot.scheduler.events import Event, EventKind
from deepboot.world.demand import DemandLedger, LoadWindow
from deepboot.world.driver import Driver, WallClock
from deepboot.world.gpus import BoardGpu, GpuBoard
from deepboot.world.recording import Recorder

if TYPE_CHECKING:
    from deepboot.runtime.prometheus_metrics import Metrics

__all__ = ["Controller"]

log = logging.getLogger("deepboot.controller")


class Controller(Recovery):
    """See the module docstring.

    Args:
        state: The state directory.
        settings: The knobs.
        cluster: The cluster.
        actors: The processes' side (:class:`~deepboot.runtime.actors.handles.RayActors`).
        clock: Wall clock (injected for tests of the bookkeeping).
        crash: What dying at the crash point ``settings.crash_at`` means: SIGKILL
            (``faults.die``); in-process tests raise instead.
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
        self.state = state
        self.settings = settings
        self.cluster = cluster
        self.actors = actors
        self.clock = clock
        self._crash = crash
        self.store = JobStore(state.db)
        self.board = GpuBoard(cluster)  # the GPU ledger: every change is checked
        self._gpu_names = frozenset(gpu_name(g.gpu_id) for g in self.board.gpus)
        # Replicas recovered RUNNING (idle now): the loop hears of each once it runs.
        self._idle_recovered: list[GpuId] = []
        self.jobs: dict[str, JobRec] = {}
        self.rng = np.random.default_rng(settings.seed)
        self.loop = build_loop(settings)
        # What the loop sees and decides, step by step, for 'deepboot replay'.
        self.recorder = Recorder(state.recording, keep_bytes=settings.record_bytes)
        self.backend = RayBackend(self)
        from deepboot.runtime.prometheus_metrics import Metrics  # prometheus_client: runtime extra

        self.metrics: Metrics = Metrics()
        self.inbox = rt.Inbox()
        # The one driver: its queue holds the ticks and the replicas' protect timers;
        # its wall clock wakes early when the router posts a message.
        wall = WallClock(clock, self.inbox.wake, longest_wait=settings.poll)
        self.driver = Driver(
            self.loop, self.backend, self.rng, wall, on_rejected=self._rejected,
            observe=self.recorder.observe,
        )  # fmt: skip
        self.router: rt.RouterPort | None = None
        self.specs: dict[str, ServiceSpec] = {}
        self.arrived: dict[str, str] = {}  # request id -> service, until placed or withdrawn
        self.waiting: dict[str, str] = {}  # the arrivals the loop could not place, in order
        # Every request the router accepted and every answer: the services' load.
        self.demand = LoadWindow()
        # With --slo, the same requests binned for the SLO guard's forecast (a bounded
        # history, as the simulator keeps it); None without.
        slo = self.loop.settings.slo
        self.arrivals: DemandLedger | None = (
            DemandLedger(slo.forecast.bin_s, slo.forecast.history_bins) if slo.enabled else None
        )
        self.warming: dict[GpuId, Warming] = {}  # pre-warmed replicas not yet reported
        self.slo = SloTally()  # each answer within or over its service's slo_wait_s
        self._slo_logged: dict[str, tuple[int, int, float]] = {}
        self._adopt: list[BoardGpu] = []  # replicas recovered, for the router once it runs
        self._cold_starts: list[tuple[str, float]] = []
        self.slept: dict[GpuId, str] = {}  # the replica whose sleep was last logged
        self.ready: dict[GpuId, str] = {}  # the replica that last reported Ready
        # Crash-loop back-offs to record: service -> (failures in a row, Unix time
        # before which no replica starts, or None once it ended).
        self._backoffs: dict[str, tuple[int, float | None]] = {}
        self._pending_log: list[tuple[LogKind, str, dict[str, Any]]] = []
        self.caches: dict[int, dict[str, Any]] = {}  # node -> its model cache's last view
        self._cached_view: Mapping[int, frozenset[str]] | None = None  # the snapshot's
        self._caches_changed = False
        self.standbys: dict[int, str] = {}  # node -> its standby (--standby-replicas)
        self._tick0: float | None = None  # the first tick: the origin of the grid
        self._last = clock()
        self._stop = False
        self.watchdog = TurnWatchdog(settings.slow_turn_s)

    def _rejected(self, event: Event, exc: Exception) -> None:
        """The error boundary: a step that raised is logged and skipped."""
        log.error("the step for %s raised; skipped", event, exc_info=exc)
        self.note(LogKind.DECISION_REJECTED, event=event.kind.value, error=repr(exc)[-2000:])

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
            if self.router is not None:
                self.router.stop()
        # Stopped cleanly: the answers the router gave before it stopped count, and
        # the event log's last ``slo`` records equal the router's SLO counters. (The
        # other messages are moot now: a restarted controller recovers from the store.)
        for msg in self.inbox.drain():
            if isinstance(msg, rt.Answered):
                self.slo.record(msg.service, msg.within, self.clock(), msg.wait)
        self.log_slo(every_s=0.0)
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
        self.recover()
        self.start_caches()
        self.start_standbys()
        if router is not None:
            self.connect_router(router())
        for gpu in self._idle_recovered:
            self.post(Event(EventKind.INFERENCE_DONE, gpu=gpu))
        self._idle_recovered.clear()
        self.post(Event(EventKind.TICK))  # the first tick, the grid's origin

    def turn(self, polled: bool) -> None:
        """One turn of the loop: what the router reported; the workers and the store
        when a poll is due (``polled``); every event due; the flush."""
        self.handle_messages()
        if polled:
            self.iteration()
            # What the router reported while the poll waited on the workers, before
            # the due timers act on an older view (a protect timer would put to
            # sleep, and a tick lend, the GPU of a replica a request now waits for).
            self.handle_messages()
        self.driver.run_due()
        if polled or self._pending_log:
            self.flush()
        if self.router is not None:
            self.router.beat()  # /healthz: the loop turns

    def request_stop(self) -> None:
        self._stop = True
        self.inbox.wake.set()
