"""The runtime's controller: the control loop in real time, on a Ray cluster.

One process per cluster (``deepboot up`` starts it; ``python -m
deepboot.runtime.controller --state-dir DIR`` runs it by hand). Each iteration:

1. poll every worker (status, progress, timings, gradient statistics); a worker
   that died shrinks its job (the survivors re-form from their own state), a
   generation whose members have all formed completes its resize, a job whose
   workers are all done finishes;
2. take new submissions, cancellations and services from the store;
3. run the control loop (``scheduler.control``) for each event and for the
   periodic tick, through :class:`RayBackend`, which turns every job's new GPU set
   into a new generation of workers (AFE by default, restart with ``afe=False``)
   and every replica operation into a replica actor started, woken or killed;
4. write jobs, GPUs and the event log to the store, in one transaction.

Between polls it waits for the router (:mod:`deepboot.runtime.router`, the HTTP
endpoint in a thread of this process): a request that found no free replica is an
INFERENCE_ARRIVAL handled at once (ATS-I may reclaim a lent GPU: the job shrinks by
AFE), an emptied replica an INFERENCE_DONE (RUNNING -> PROTECT), and protect times
expire on their own timers (PROTECT -> SLEEP, lendable at the next round).

It holds no scheduling logic: which job or replica gets which GPU is the control
loop's. After a SIGKILL, a new controller rebuilds its picture from the store and from
the worker and replica actors still alive (they are detached), kills strays, and goes
on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from deepboot.core.cluster import ClusterSpec
from deepboot.core.errors import ConfigError, InvalidDecisionError
from deepboot.core.gpu import GpuId, GpuState
from deepboot.core.service import ServiceSpec
from deepboot.elastic.protocol import (
    Generation,
    Restore,
    WorkerConfig,
    WorkerReport,
    WorkerStatus,
)
from deepboot.policies import inference, registry
from deepboot.policies.lending import ServiceLoad
from deepboot.runtime import messages as rt
from deepboot.runtime.actors import ActorName, RayActors, actor_name
from deepboot.runtime.raycluster import ClusterRecord, ray_env
from deepboot.runtime.replica import REPLICA_PREFIX, parse_replica_name, replica_name
from deepboot.runtime.statedir import StateDir
from deepboot.runtime.store import GpuRow, JobRow, JobState, JobStore, LogKind
from deepboot.runtime.world import (
    JobRec,
    OnlineModel,
    Transition,
    gpu_name,
    parse_gpu,
)
from deepboot.scheduler.control import (
    ControlLoop,
    PendingTask,
    Snapshot,
    Step,
)
from deepboot.scheduler.decision import Preempt, Resize, Start
from deepboot.scheduler.events import Event, EventKind
from deepboot.scheduler.inference import InferenceScheduler
from deepboot.scheduler.loop import Scheduler
from deepboot.scheduler.operations import (
    Bind,
    EvictReplica,
    Lend,
    ProtectReplica,
    Reclaim,
    Release,
    SleepReplica,
    StartReplica,
    WarmReplica,
)
from deepboot.world.demand import LoadWindow
from deepboot.world.driver import Driver, WallClock, is_stale
from deepboot.world.gpus import BoardGpu, GpuBoard, apply_gpu_op
from deepboot.world.settings import SharedCluster, shared_loop_settings

if TYPE_CHECKING:
    from deepboot.runtime.metrics import Metrics
    from deepboot.runtime.router import Router

log = logging.getLogger("deepboot.controller")


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    """The controller's knobs (``deepboot up`` flags; saved in controller.json).

    Attributes:
        policy: Training policy (one that needs no oracle; see ``deepboot up --help``).
        interval: Seconds between scheduling rounds.
        poll: Seconds between polls of the workers.
        collective_timeout: Seconds before a hung collective or rendezvous fails.
        seed: Seed of the policies' randomness.
        params: The training policy's parameters (as ``deepboot policies`` lists).
        http_host: Address of the HTTP endpoint (requests, submissions, metrics);
            anything but loopback requires the bearer token.
        http_port: Its port (0: any free one; see STATE_DIR/http.json).
        shared: The shared-cluster knobs, as the simulator takes them: lending, the
            lifecycle and its protect factor, AFE (keep-alive resizes; off:
            checkpoint-restart resizes, the baseline), the lending reserve, the
            inference placement (:func:`check_runnable` says which run here).
    """

    policy: str = "deepboot"
    interval: float = 60.0
    poll: float = 1.0
    collective_timeout: float = 60.0
    seed: int = 0
    params: dict[str, str] = field(default_factory=dict)
    http_host: str = "127.0.0.1"
    http_port: int = 8470
    shared: SharedCluster = field(default_factory=SharedCluster)

    @property
    def afe(self) -> bool:
        """Keep-alive resizes (AFE unless turned off: the runtime's default)."""
        return self.shared.afe is not False

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        raw = {f.name: getattr(self, f.name) for f in fields(self)}
        raw["shared"] = self.shared.to_dict()
        tmp.write_text(json.dumps(raw, indent=2))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> ControllerSettings:
        raw = json.loads(path.read_text())
        shared = dict(raw.pop("shared", {}))
        # controller.json of a cluster an older deepboot started: its four
        # shared-cluster knobs sat at the top level.
        renamed = {"inference_policy": "ats_i"}
        for old in ("afe", "lending", "protect_factor", "inference_policy"):
            new = renamed.get(old, old)
            if old in raw:
                shared.setdefault(new, raw.pop(old))
        return cls(**raw, shared=SharedCluster.from_dict(shared))


RUNTIME_REFUSED = {
    "slo": "SLO-guarded lending pre-warms replicas, which the runtime does not do yet",
    "warm_pool": "the warm-pool reference is a simulator reference for --slo",
    "oracle": "the oracle reference reads the requests still to come",
}
"""Shared-cluster knobs the runtime refuses, and why."""


def check_runnable(shared: SharedCluster) -> None:
    """Refuse, with the reason, the shared-cluster knobs this world cannot run.

    Raises:
        ConfigError: ``--slo``, ``--warm-pool`` or ``--oracle``.
    """
    for name, why in RUNTIME_REFUSED.items():
        if getattr(shared, name):
            raise ConfigError(
                f"--{name.replace('_', '-')}: {why} (the simulator runs it: "
                f"'deepboot simulate --{name.replace('_', '-')}')"
            )


LATENCIES_KEPT = 1000
"""The latest decision latencies the controller keeps for ``deepboot status``."""


def settings_file(state: StateDir) -> Path:
    return state.root / "controller.json"


_APPLIED = (Bind, Lend, Release, Reclaim, EvictReplica, StartReplica, ProtectReplica,
            SleepReplica, Start, Resize, Preempt)  # fmt: skip
"""The operations this world applies (every one but ``WarmReplica``)."""


def check_applicable(ops: Sequence[object]) -> None:
    """Refuse, before any of it is applied, a step with an operation this world cannot
    carry out: a ``WarmReplica`` (pre-warming is simulator-only for now) or one it does
    not know at all (a new operation must be added here, not dropped silently).

    Raises:
        InvalidDecisionError: naming the operation; nothing of the step was applied.
    """
    for op in ops:
        if isinstance(op, WarmReplica):
            raise InvalidDecisionError(
                f"the runtime cannot apply {op!r}: pre-warming a replica with no "
                "request (WarmReplica) is simulator-only for now; nothing of the "
                "step was applied"
            )
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
    changed to the controller, which starts its next generation. It refuses a step
    with a ``WarmReplica`` (pre-warming is simulator-only for now), before applying any
    of it.
    """

    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl

    def snapshot(self, event: Event) -> Snapshot:
        ctl = self.ctl
        jobs = tuple(
            j.view(ctl.board)
            for j in sorted(ctl.jobs.values(), key=lambda j: (j.row.submitted, j.name))
            if j.active
        )
        gpus = ctl.board.views()
        waiting = tuple(PendingTask(t, s) for t, s in ctl.waiting.items())
        now = ctl.clock()
        loads: dict[str, ServiceLoad] = {}
        settings = ctl.loop.settings
        if event.kind is EventKind.TICK and settings.lending and settings.reserve.enabled:
            loads = ctl.demand.loads(now, settings.reserve.window_s)
        return Snapshot(
            now, ctl.cluster, jobs, gpus, waiting, MappingProxyType(loads), services=ctl.specs
        )

    def record(self, now: float, event: Event) -> bool:
        """The facts of ``event`` (the controller recorded a message's on receipt):
        a replica's protect timer or idle report that no longer matches its GPU is
        moot; the first tick is the origin of the grid."""
        ctl = self.ctl
        kind = event.kind
        if is_stale(ctl.board, event):
            return False
        if kind is EventKind.INFERENCE_DONE:
            assert event.gpu is not None
            return ctl.board.get(event.gpu).state is GpuState.RUNNING
        if kind is EventKind.TICK and ctl._tick0 is None:
            ctl._tick0 = now
        return True

    def after_tick(self, now: float) -> float:
        """The next tick, on the grid from the first one."""
        assert self.ctl._tick0 is not None
        return next_tick(now, self.ctl._tick0, self.ctl.settings.interval)

    def after_event(self, now: float, event: Event) -> None:
        """Nothing: the controller flushes once per turn of its loop."""

    def apply(self, step: Step) -> None:
        check_applicable(step.ops)
        ctl = self.ctl
        touched: list[str] = []
        for op in step.ops:
            if isinstance(op, Start | Resize | Preempt):
                continue  # the job-level statement of the GPU operations around it
            if isinstance(op, StartReplica):
                ctl.start_replica(op)  # through the ledger, around the actors
                continue
            gpu = ctl.board.get(op.gpu)
            replica, service = gpu.replica, gpu.service
            apply_gpu_op(ctl.board, op)  # every GPU change: the ledger checks it
            if isinstance(op, Bind | Lend | Release | Reclaim):
                touched.append(op.job)
                ctl.log_gpu(op.gpu, type(op).__name__.lower(), op.job)
            elif isinstance(op, EvictReplica):
                ctl.replica_gone(op.gpu, replica, service)
            elif isinstance(op, ProtectReplica):
                # Not logged (every idle moment of a replica); SLEEP, when its GPU
                # becomes lendable, is. Its expiry is on the one queue.
                expiry = Event(EventKind.PROTECT_EXPIRED, seq=gpu.version, gpu=op.gpu)
                ctl.post(expiry, at=op.until)
            elif isinstance(op, SleepReplica):
                ctl.note(LogKind.REPLICA, gpu=gpu_name(op.gpu), service=service, op="sleep")
        for u in step.unplaced:
            if u.inference and u.name in ctl.arrived:
                ctl.waiting.setdefault(u.name, ctl.arrived[u.name])
        for job in dict.fromkeys(touched):
            ctl.retarget(ctl.jobs[job])


class Controller:
    """See the module docstring.

    Args:
        state: The state directory.
        settings: The knobs.
        actors: The Ray side (None: build one on the connected cluster).
        clock: Wall clock (injected for tests of the bookkeeping).
    """

    def __init__(
        self,
        state: StateDir,
        settings: ControllerSettings,
        cluster: ClusterSpec,
        actors: RayActors,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state = state
        self.settings = settings
        self.cluster = cluster
        self.actors = actors
        self.clock = clock
        self.store = JobStore(state.db)
        self.board = GpuBoard(cluster)  # the GPU ledger: every change is checked
        self._gpu_ids = frozenset(g.gpu_id for g in self.board.gpus)
        # Replicas recovered RUNNING (idle now): the loop hears of each once it runs.
        self._idle_recovered: list[GpuId] = []
        self.jobs: dict[str, JobRec] = {}
        self.rng = np.random.default_rng(settings.seed)
        policy = registry.create(settings.policy, **settings.params)
        shared = settings.shared
        check_runnable(shared)
        placement = inference.create(
            shared.inference_policy(settings.policy), **shared.ats_i_params
        )
        self.loop = ControlLoop(
            Scheduler(policy),
            InferenceScheduler(placement),
            shared_loop_settings(shared, settings.interval),
        )
        self.backend = RayBackend(self)
        from deepboot.runtime.metrics import Metrics  # prometheus_client: runtime extra

        self.metrics: Metrics = Metrics()
        self.inbox = rt.Inbox()
        # The one driver: its queue holds the ticks and the replicas' protect timers;
        # its wall clock wakes early when the router posts a message.
        wall = WallClock(clock, self.inbox.wake, longest_wait=settings.poll)
        self.driver = Driver(self.loop, self.backend, self.rng, wall)
        self.router: Router | None = None
        self.specs: dict[str, ServiceSpec] = {}
        self.arrived: dict[str, str] = {}  # request id -> service, until placed or withdrawn
        self.waiting: dict[str, str] = {}  # the arrivals the loop could not place, in order
        # Every request the router accepted and every answer: the services' load.
        self.demand = LoadWindow()
        self._adopt: list[BoardGpu] = []  # replicas recovered, for the router once it runs
        self._cold_starts: list[tuple[str, float]] = []
        # Crash-loop back-offs to record: service -> (failures in a row, Unix time
        # before which no replica starts, or None once it ended).
        self._backoffs: dict[str, tuple[int, float | None]] = {}
        self._pending_log: list[tuple[LogKind, str, dict[str, Any]]] = []
        self._tick0: float | None = None  # the first tick: the origin of the grid
        self._last = clock()
        self._stop = False

    # -- logging into the store (flushed with the state it describes) ------------------------

    def note(self, kind: LogKind, job: str = "", **detail: Any) -> None:
        self._pending_log.append((kind, job, detail))
        self.metrics.count(kind, detail)

    def log_gpu(self, gpu: GpuId, op: str, job: str) -> None:
        self.note(LogKind.GPU, job, gpu=gpu_name(gpu), op=op)

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
            self.specs,
        )
        # An ended job's last row is written: stop rewriting it every iteration.
        for name in [n for n, j in self.jobs.items() if j.row.state.ended]:
            del self.jobs[name]

    # -- start-up and reconciliation ----------------------------------------------------------

    def recover(self) -> None:
        """Rebuild the picture from the store and the live worker actors.

        A job keeps the live workers of its recorded generation; any other worker
        actor of the namespace (an ended job's, a superseded incarnation's) is killed,
        so a job never has two live worker groups. A job whose recorded workers are
        not all alive, or not all in its recorded generation, re-forms as a new
        generation of the survivors (or goes back to the queue, to restore its
        checkpoint, when none survived).
        """
        self.metrics.replay(self.store.events())
        self.take_services()
        # Read before anything below flushes (a re-formed job does), which rewrites
        # the GPU table from a picture that has no replicas yet.
        stored_gpus = self.store.gpus()
        rows = {r.name: r for r in self.store.jobs()}
        live = [n for n in self.actors.list_workers() if ActorName.parse(n)]
        by_job: dict[str, dict[str, str]] = {}
        for name in live:
            parsed = ActorName.parse(name)
            assert parsed is not None
            by_job.setdefault(parsed.job, {})
            prev = by_job[parsed.job].get(parsed.gpu)
            if prev is not None:
                # Two incarnations on one GPU: the older one is a leftover.
                old, new = sorted([prev, name], key=lambda n: ActorName.parse(n).incarnation)  # type: ignore[union-attr]
                self.actors.kill(old)
                name = new
            by_job[parsed.job][parsed.gpu] = name
        killed: list[str] = []
        kept: list[str] = []
        recovered: list[str] = []
        for job_name, actors in by_job.items():
            row = rows.get(job_name)
            if row is None or row.state.ended:
                for name in actors.values():
                    self.actors.kill(name)
                    killed.append(name)
        for row in rows.values():
            if row.state.ended:
                continue
            rec = JobRec(row, model=OnlineModel.from_json(row.model))
            self.jobs[row.name] = rec
            if row.state is JobState.SUBMITTED:
                continue
            actors = by_job.get(row.name, {})
            for gpu, name in actors.items():
                if gpu not in row.workers:
                    self.actors.kill(name)
                    killed.append(name)
            members = [g for g in row.workers if g in actors]
            rec.actors = {g: actors[g] for g in members}
            kept.extend(rec.actors.values())
            reports = self.actors.reports(list(rec.actors.values()))
            # A worker counts only on a GPU no other job's row claimed first (a store
            # written by two controllers at once is not trusted twice).
            alive = [
                g
                for g in members
                if reports.get(rec.actors[g]) is not None
                and self.board.get(parse_gpu(g)).state is GpuState.FREE
            ]
            for g in members:
                if g not in alive:
                    self.actors.kill(rec.actors.pop(g))
            for g in alive:
                rep = reports[rec.actors[g]]
                assert rep is not None
                rec.reports[g] = rep
                self.board.assign(self.board.get(parse_gpu(g)), row.name)
            rec.gen = Generation(
                row.generation,
                tuple(row.workers),
                self._store_path(row.name, row.generation),
                row.local_bsz,
                row.accum,
                self._num_nodes(row.workers),
                checkpoint_path=str(self.state.job_checkpoint(row.name)),
            )
            formed = all(
                rec.reports[g].generation == row.generation
                and rec.reports[g].status in (WorkerStatus.RUNNING, WorkerStatus.DONE)
                for g in alive
            )
            if alive and formed and len(alive) == len(row.workers):
                rec.formed = row.generation
            elif alive:
                # Order the survivors so that rank 0 holds the newest state.
                alive.sort(key=lambda g: (-rec.reports[g].generation, row.workers.index(g)))
                self._new_generation(rec, tuple(alive), how="failure", joiners=())
            else:
                rec.gen = None
                rec.update(state=JobState.QUEUED, workers=())
            recovered.append(row.name)
        self._recover_replicas(stored_gpus, kept, killed)
        self.note(LogKind.RECONCILED, kept=sorted(kept), killed=sorted(killed))
        self.note(
            LogKind.CONTROLLER_STARTED,
            policy=self.settings.policy,
            afe=self.settings.afe,
            recovered=recovered,
        )
        self.flush()

    def _recover_replicas(
        self, stored_gpus: list[GpuRow], kept: list[str], killed: list[str]
    ) -> None:
        """Keep each live replica actor the store recorded on its GPU (a replica that
        was RUNNING is idle now: the requests it served died with the old router, so
        it goes to PROTECT); kill the others."""
        stored = {r.gpu: r for r in stored_gpus}
        for name in self.actors.list_named(REPLICA_PREFIX):
            parsed = parse_replica_name(name)
            row = stored.get(parsed[1]) if parsed else None
            gpu = parse_gpu(row.gpu) if row else None
            ok = (
                row is not None
                and gpu in self._gpu_ids
                and row.replica == name
                and row.service in self.specs
                and row.state in ("running", "protect", "sleep")
                and self.board.get(gpu).state is GpuState.FREE
            )
            if not ok:
                self.actors.kill(name)
                killed.append(name)
                continue
            assert row is not None and gpu is not None
            rec = self.board.get(gpu)
            state = GpuState(row.state)
            until = row.protect_until if state is GpuState.PROTECT else None
            if state is GpuState.PROTECT and until is None:
                state = GpuState.RUNNING  # a row without its end: let the loop decide
            self.board.restore(
                rec, state, service=row.service, replica=name, hits=row.hits, protect_until=until
            )
            if until is not None:
                expiry = Event(EventKind.PROTECT_EXPIRED, seq=rec.version, gpu=gpu)
                self.post(expiry, at=until)
            if state is GpuState.RUNNING:
                # Idle now (its requests died with the old router): the loop decides
                # what happens to it, as for any replica that went idle.
                self._idle_recovered.append(gpu)
            self._adopt.append(rec)
            kept.append(name)

    # -- the loop ---------------------------------------------------------------------------

    def start_router(self) -> None:
        """Serve HTTP (requests, submissions, metrics) and record where."""
        from deepboot.runtime.router import Router, is_loopback  # aiohttp: runtime extra

        s = self.settings
        # The token guards every route that accepts work, on loopback too.
        token = self.state.ensure_http_token().read_text().strip()
        port = s.http_port
        if port == 0 and self.state.http_file.exists():
            # A restarted controller keeps its address, so clients reconnect.
            with contextlib.suppress(ValueError, OSError, KeyError):
                port = int(json.loads(self.state.http_file.read_text())["port"])

        def serve(on: int) -> Router:
            router = Router(
                self.inbox, self.metrics, s.http_host, on, token,
                submit=self._http_submit, register=self._http_register,
            )  # fmt: skip
            router.start()
            return router

        try:
            router = serve(port)
        except OSError:
            if port == s.http_port:
                raise
            router = serve(0)  # the old port is taken: any free one (http.json says)
        self.router = router
        router.set_services(self.specs, self._measured_cold_starts())
        now = self.clock()  # a back-off outlives the controller that started it
        for row in self.store.services():
            if row.load_failures and row.spec.name in self.specs:
                left = (row.backoff_until or now) - now
                router.restore_backoff(row.spec.name, row.load_failures, left)
        for rec in self._adopt:
            assert rec.replica is not None and rec.service is not None
            router.adopt_replica(
                gpu_name(rec.gpu_id), rec.service, rec.replica, self.actors.handle(rec.replica)
            )
        self._adopt.clear()
        router.write_address(self.state.http_file)
        reads = "open on loopback" if is_loopback(s.http_host) else "need the token too"
        log.info("HTTP endpoint at %s (work needs the token; reads %s)", router.url, reads)

    def _http_submit(self, raw: dict[str, Any]) -> str:
        from deepboot.runtime.jobspec import parse_job

        # A relative entry file is resolved against the state directory's parent
        # (where 'deepboot up' ran); clients should send absolute paths.
        spec = parse_job(raw, "POST /v1/jobs", self.state.root.parent)
        store = JobStore(self.state.db)
        try:
            store.submit(spec)
        finally:
            store.close()
        self.inbox.wake.set()
        return spec.name

    def _http_register(self, raw: dict[str, Any]) -> str:
        from deepboot.runtime.servicespec import parse_service

        raw = {k: v for k, v in raw.items() if v is not None}  # to_json's unset cold start
        spec = parse_service(raw, "POST /v1/services", self.state.root.parent)
        store = JobStore(self.state.db)
        try:
            store.register_service(spec)
        finally:
            store.close()
        self.inbox.wake.set()
        return spec.name

    def run(self, until: Callable[[], bool] | None = None) -> None:
        """Run the driver until SIGTERM/SIGINT (or ``until()`` is true): each turn
        takes what the router reported, polls the workers and reads the store when a
        poll is due, handles every event due, flushes, and waits for the next event,
        poll or message."""
        self.recover()
        self.start_router()
        for gpu in self._idle_recovered:
            self.post(Event(EventKind.INFERENCE_DONE, gpu=gpu))
        self._idle_recovered.clear()
        signal.signal(signal.SIGTERM, lambda *_: self.request_stop())
        self.post(Event(EventKind.TICK))  # the first tick, the grid's origin
        driver, clock = self.driver, self.driver.clock
        next_poll = 0.0
        try:
            while not self._stop and not (until and until()):
                self.handle_messages()
                polled = time.monotonic() >= next_poll
                if polled:
                    next_poll = time.monotonic() + self.settings.poll
                    self.iteration()
                driver.run_due()
                if polled or self._pending_log:
                    self.flush()
                poll_at = clock.now() + max(next_poll - time.monotonic(), 0.0)
                clock.wait_until(min(driver.queue.peek_time(), poll_at))
        finally:
            if self.router is not None:
                self.router.stop()

    def request_stop(self) -> None:
        self._stop = True
        self.inbox.wake.set()

    def iteration(self) -> None:
        """Poll the workers and read the store: their events go on the queue."""
        now = self.clock()
        dt, self._last = max(now - self._last, 0.0), now
        events: list[Event] = []
        events += self.poll(dt)
        self.take_services()
        rows = self.store.jobs()  # one read of the store per iteration
        events += self.take_submissions(rows)
        events += self.take_cancellations(rows)
        for event in events:
            self.post(event)

    # -- services and replicas ---------------------------------------------------------------

    def take_services(self) -> None:
        """Services registered since the last look (``deepboot serve``, POST /v1/services)."""
        fresh = {
            r.spec.name: r.spec for r in self.store.services() if r.spec.name not in self.specs
        }
        if not fresh:
            return
        self.specs = {**self.specs, **fresh}
        if self.router is not None:
            self.router.set_services(self.specs, self._measured_cold_starts())

    def _measured_cold_starts(self) -> dict[str, float]:
        """The first cold start measured of each service (the store's), for the
        router's default load timeouts."""
        return {r.spec.name: r.cold_start for r in self.store.services() if r.cold_start}

    def handle_messages(self) -> None:
        """Act on what the router reported (arrivals, idle and dead replicas)."""
        for msg in self.inbox.drain():
            if isinstance(msg, rt.Received):
                self.demand.arrived(msg.service, self.clock())
            elif isinstance(msg, rt.Served):
                self.demand.ran(msg.service, self.clock(), msg.seconds)
            elif isinstance(msg, rt.Arrival):
                if msg.task in self.arrived or msg.service not in self.specs:
                    continue
                self.arrived[msg.task] = msg.service
                self.post(Event(EventKind.INFERENCE_ARRIVAL, job=msg.task, service=msg.service))
            elif isinstance(msg, rt.Backoff):
                until = self.clock() + msg.seconds if msg.failures else None
                self._backoffs[msg.service] = (msg.failures, until)
            elif isinstance(msg, rt.Withdraw):
                self.arrived.pop(msg.task, None)
                self.waiting.pop(msg.task, None)
            elif isinstance(msg, rt.Idle):
                rec = self.board.get(parse_gpu(msg.gpu))
                if rec.replica == msg.replica and rec.state is GpuState.RUNNING:
                    self.post(Event(EventKind.INFERENCE_DONE, gpu=rec.gpu_id))
            elif isinstance(msg, rt.Ready):
                rec = self.board.get(parse_gpu(msg.gpu))
                if rec.replica == msg.replica and rec.service:
                    self._cold_starts.append((rec.service, round(msg.load_seconds, 3)))
                    self.note(
                        LogKind.REPLICA,
                        gpu=msg.gpu,
                        service=rec.service,
                        op="ready",
                        seconds=round(msg.seconds, 3),
                        load_seconds=round(msg.load_seconds, 3),
                    )
            elif isinstance(msg, rt.Died):
                rec = self.board.get(parse_gpu(msg.gpu))
                if rec.replica != msg.replica:
                    continue
                log.warning("replica %s died (%s): %s", msg.replica, msg.phase, msg.error)
                self.actors.kill(msg.replica)
                self.note(
                    LogKind.REPLICA, gpu=msg.gpu, service=rec.service, op="died",
                    error=msg.error[-2000:], phase=msg.phase, backoff_s=round(msg.backoff_s, 3),
                )  # fmt: skip
                self.board.fail(rec)  # the fact; the loop retries the queued tasks
                self.post(Event(EventKind.REPLICA_LOST, gpu=rec.gpu_id))
        if self._pending_log:
            self.flush()

    def start_replica(self, op: StartReplica) -> None:
        """A task's replica on ``op.gpu``: the idle one of its service there, woken
        (warm), or a new actor (cold; one of another service there is killed first)."""
        rec = self.board.get(op.gpu)
        self.arrived.pop(op.task, None)
        self.waiting.pop(op.task, None)
        replica, service = rec.replica, rec.service
        warm = not op.cold and replica is not None and service == op.service
        if not warm and replica is not None:
            self.replica_gone(op.gpu, replica, service)
        apply_gpu_op(self.board, op)
        gpu = gpu_name(op.gpu)
        if warm:
            assert replica is not None
            rec.replica = replica
            if self.router is not None:
                handle = self.actors.handle(replica)
                self.router.start_replica(
                    gpu, op.service, replica, handle, cold=False, task=op.task
                )
            # A warm reuse is not logged: in a lull it happens at every request.
            return
        spec = self.specs[op.service]
        name = replica_name(op.service, gpu, self._next_incarnation(f"replica:{op.service}"))
        handle = self.actors.create_replica(
            name, spec.to_json(), gpu, str(self.state.logs / f"service-{op.service}.log")
        )
        rec.replica = name
        self.note(LogKind.REPLICA, gpu=gpu, service=op.service, op="start", cold=True)
        if self.router is not None:
            self.router.start_replica(gpu, op.service, name, handle, cold=True, task=op.task)

    def replica_gone(self, gpu: GpuId, replica: str | None, service: str | None) -> None:
        """The replica ``replica`` that was on ``gpu`` is evicted: kill its actor and
        tell the router (the ledger has moved the GPU already)."""
        if replica is None:
            return
        self.actors.kill(replica)
        if self.router is not None:
            self.router.stop_replica(gpu_name(gpu))
        self.note(LogKind.REPLICA, gpu=gpu_name(gpu), service=service, op="evict")

    def take_submissions(self, rows: list[JobRow]) -> list[Event]:
        events = []
        for row in rows:
            if row.state is JobState.SUBMITTED and row.name not in self.jobs:
                rec = JobRec(row)
                rec.update(state=JobState.QUEUED)
                self.jobs[row.name] = rec
                events.append(Event(EventKind.JOB_SUBMITTED, job=row.name))
            elif row.state is JobState.SUBMITTED:
                self.jobs[row.name].update(state=JobState.QUEUED)
        return events

    def take_cancellations(self, rows: list[JobRow]) -> list[Event]:
        events = []
        cancelled = {r.name for r in rows if r.cancel and not r.state.ended}
        for name in sorted(cancelled):
            rec = self.jobs.get(name)
            if rec is None:
                continue
            self._end(rec, JobState.CANCELLED)
            self.note(LogKind.CANCELLED, name)
            events.append(Event(EventKind.JOB_FINISHED, job=name))
        return events

    # -- polling workers --------------------------------------------------------------------

    def poll(self, dt: float) -> list[Event]:
        events: list[Event] = []
        for rec in list(self.jobs.values()):
            if not rec.active or not (rec.actors or rec.leaving):
                continue
            held = len(self.board.held(rec.name))
            rec.update(attained=rec.row.attained + held * dt)
            reports = self.actors.reports([*rec.actors.values(), *rec.leaving])
            self._poll_leavers(rec, reports)
            by_gpu = {g: reports[n] for g, n in rec.actors.items() if n in reports}
            if self._poll_job(rec, by_gpu):
                events.append(Event(EventKind.JOB_FINISHED, job=rec.name))
        return events

    def _poll_leavers(self, rec: JobRec, reports: dict[str, WorkerReport | None]) -> None:
        for name in list(rec.leaving):
            if name not in reports:
                continue  # not scheduled yet or slow: ask again next time
            r = reports[name]
            if r is None or r.status in (
                WorkerStatus.DEPARTED,
                WorkerStatus.DONE,
                WorkerStatus.FAILED,
            ):
                self.actors.kill(name)
                del rec.leaving[name]
        if rec.gen is not None and rec.gen.stop and not rec.leaving and rec.transition:
            rec.transition = None  # a preemption's stop is complete

    def _poll_job(self, rec: JobRec, reports: dict[str, WorkerReport | None]) -> bool:
        """Digest one job's reports; True when the job ended."""
        dead = [g for g, r in reports.items() if r is None]
        for g, r in reports.items():
            if r is None:
                continue
            rec.reports[g] = r
            if r.measurements:
                rec.model.add(r.measurements)
            rec.model.note_grad(r)
            if r.status is WorkerStatus.FAILED:
                last = r.error.strip().splitlines()[-1] if r.error.strip() else "worker failed"
                self._end(rec, JobState.FAILED, message=last)
                self.note(LogKind.FAILED, rec.name, error=r.error[-2000:])
                return True
            if math.isfinite(r.loss) and r.step >= rec.row.step:
                rec.update(step=r.step, loss=r.loss)
        rec.update(model=rec.model.to_json())
        if dead:
            self._workers_died(rec, dead)
        members = rec.members
        if not members:
            return False
        reps = [rec.reports.get(g) for g in members]
        gen = rec.gen
        assert gen is not None
        if rec.transition is not None and any(
            r is not None and r.broken >= gen.number for r in reps
        ):
            # The generation could not form (a member came too late, or a collective
            # broke while forming): offer a fresh one to the same members.
            log.warning("%s: generation %d did not form; offering another", rec.name, gen.number)
            self._new_generation(rec, gen.members, how=rec.transition.how, joiners=(), retry=True)
            return False
        if rec.transition is not None and all(
            r is not None
            and r.generation == rec.gen.number  # type: ignore[union-attr]
            and r.status in (WorkerStatus.RUNNING, WorkerStatus.DONE)
            for r in reps
        ):
            self._formed(rec)
        if rec.transition is None and all(
            r is not None and r.status is WorkerStatus.DONE for r in reps
        ):
            r0 = rec.reports[members[0]]
            self.note(
                LogKind.FINISHED,
                rec.name,
                step=r0.step,
                loss=r0.loss,
                seconds=round(self.clock() - (rec.row.started or rec.row.submitted), 3),
            )
            rec.update(step=r0.step, loss=r0.loss)
            self._end(rec, JobState.FINISHED)
            return True
        return False

    def _formed(self, rec: JobRec) -> None:
        tr, gen = rec.transition, rec.gen
        assert tr is not None and gen is not None
        rec.formed = gen.number
        digests = {g: list(rec.reports[g].digests.get(gen.number, ("", ""))) for g in gen.members}
        restored = rec.reports[gen.members[0]].restored_step
        lost = max(tr.steps_before - restored, 0) if tr.how in ("failure", "restart") else 0
        detail = dict(
            generation=gen.number,
            workers=list(gen.members),
            local_bsz=gen.local_bsz,
            accum=gen.accum_steps,
        )
        if tr.how == "start":
            self.note(LogKind.STARTED, rec.name, **detail, digests=digests)
            if rec.row.started is None:
                rec.update(started=self.clock())
        else:
            self.note(
                LogKind.RESIZED,
                rec.name,
                **detail,
                how=tr.how,
                digests=digests,
                steps_lost=lost,
                seconds=round(self.clock() - tr.started, 3),
                **{"from": list(tr.old), "to": list(gen.members)},
            )
        rec.update(steps_lost=rec.row.steps_lost + lost)
        rec.transition = None

    def _workers_died(self, rec: JobRec, dead: list[str]) -> None:
        for g in dead:
            name = rec.actors.pop(g)
            self.actors.kill(name)
            rec.reports.pop(g, None)
            if g not in rec.members:
                continue  # a leaver: nothing lost
            self.note(
                LogKind.WORKER_FAILED,
                rec.name,
                worker=g,
                generation=rec.gen.number if rec.gen else 0,
                step=rec.row.step,
            )
            gpu = self.board.get(parse_gpu(g))
            if gpu.job == rec.name:
                self.board.fail(gpu)
                self.log_gpu(gpu.gpu_id, "release", rec.name)
        survivors = tuple(g for g in rec.members if g not in dead)
        if not any(g in rec.members for g in dead):
            return
        if survivors:
            self._new_generation(rec, survivors, how="failure", joiners=())
        else:
            # Nobody holds the state: back to the queue, to restore the checkpoint.
            rec.gen, rec.transition = None, None
            rec.update(state=JobState.QUEUED, workers=(), restarts=rec.row.restarts + 1)

    def _end(self, rec: JobRec, state: JobState, message: str = "") -> None:
        for name in [*rec.actors.values(), *rec.leaving]:
            self.actors.kill(name)
        rec.actors.clear()
        rec.leaving.clear()
        for g in self.board.held(rec.name):
            self.log_gpu(g.gpu_id, "release", rec.name)
        self.board.release_job(rec.name)
        rec.gen, rec.transition = None, None
        rec.update(state=state, finished=self.clock(), workers=(), message=message)

    # -- generations ----------------------------------------------------------------------------

    def retarget(self, rec: JobRec) -> None:
        """Start the generation that puts ``rec`` on the GPUs the loop gave it."""
        held = sorted(gpu_name(g.gpu_id) for g in self.board.held(rec.name))
        old = rec.members
        if set(held) == set(old):
            return
        if not held:
            if rec.actors:
                self._stop_generation(rec, how="stop")
                self.note(LogKind.PREEMPTED, rec.name, generation=rec.formed, workers=list(old))
            rec.update(state=JobState.QUEUED, workers=())
            return
        survivors = tuple(g for g in old if g in held)
        joiners = tuple(g for g in held if g not in old)
        if not old:
            self._new_generation(rec, tuple(held), how="start", joiners=tuple(held))
        elif self.settings.afe and survivors:
            self._new_generation(rec, survivors + joiners, how="afe", joiners=joiners)
        else:
            self._stop_generation(rec, how="restart")
            self._new_generation(rec, tuple(held), how="restart", joiners=tuple(held))

    def _stop_generation(self, rec: JobRec, how: str) -> None:
        gen = rec.gen
        assert gen is not None
        stop = Generation(
            gen.number + 1,
            gen.members,
            "",
            gen.local_bsz,
            gen.accum_steps,
            gen.num_nodes,
            checkpoint_path=str(self.state.job_checkpoint(rec.name)),
            stop=True,
        )
        for g, name in rec.actors.items():
            self.actors.offer(name, stop)
            rec.leaving[name] = g
        rec.actors.clear()
        rec.gen = stop
        rec.transition = Transition(how, stop.number, self.clock(), gen.members, rec.row.step)
        rec.update(generation=stop.number)

    def _new_generation(
        self,
        rec: JobRec,
        members: tuple[str, ...],
        how: str,
        joiners: tuple[str, ...],
        retry: bool = False,
    ) -> None:
        """Offer the next generation of ``rec`` to its workers and start the joiners'.

        ``retry``: the pending generation could not form; the new one continues the
        same resize (its event reports the whole resize, from its first offer).
        """
        prev = rec.gen
        pending = rec.transition
        number = (prev.number if prev else rec.row.generation) + 1
        nodes = self._num_nodes(members)
        local_bsz, accum = rec.batch_for(nodes, len(members))
        ckpt = self.state.job_checkpoint(rec.name)
        fresh_start = how in ("start", "restart")
        restore = Restore.CHECKPOINT if fresh_start and ckpt.exists() else Restore.MEMORY
        if how == "restart":
            restore = Restore.CHECKPOINT
        gen = Generation(
            number,
            members,
            self._store_path(rec.name, number),
            local_bsz,
            accum,
            nodes,
            restore=restore,
            checkpoint_path=str(ckpt),
            after_generation=(prev.number if (prev and prev.stop) else 0),
        )
        (self.state.rendezvous / rec.name).mkdir(parents=True, exist_ok=True)
        # A file store must start empty: stale addresses make gloo connect to nothing.
        Path(gen.store_path).unlink(missing_ok=True)
        old = prev.members if prev and not prev.stop else ()
        if retry and pending is not None:
            rec.transition = Transition(
                pending.how, number, pending.started, pending.old, pending.steps_before
            )
        elif pending is not None and prev is not None and not prev.stop:
            # The pending generation never formed (a reclaim came mid-resize): this one
            # replaces it, and the event reports the resize from the last formed group.
            kind = pending.how if pending.how in ("start", "restart") else how
            rec.transition = Transition(kind, number, self.clock(), pending.old, rec.row.step)
        else:
            rec.transition = Transition(
                how if not (how == "start" and rec.row.started) else "restart",
                number,
                self.clock(),
                old or (prev.members if prev else ()),
                rec.row.step,
            )
        rec.gen = gen
        rec.update(
            state=JobState.RUNNING,
            generation=number,
            workers=members,
            local_bsz=local_bsz,
            accum=accum,
            restarts=rec.row.restarts + (0 if how == "start" or retry else 1),
        )
        # Durable intent before any actor starts: a restarted controller finds it.
        self.flush()
        if prev is not None and not prev.stop:
            # Workers told to leave by an earlier, unformed generation may have heard
            # of this one from their peers: offer it, so they leave now rather than
            # after a collective timeout. (Not after a stop: they checkpoint first.)
            for name in rec.leaving:
                self.actors.offer(name, gen)
        for g, name in list(rec.actors.items()):
            self.actors.offer(name, gen)
            if g not in members:
                rec.leaving[name] = g
                del rec.actors[g]
        spec = rec.row.spec
        config = WorkerConfig(
            rec.name,
            spec.entry,
            spec.args,
            str(self.state.job_log(rec.name)),
            self.settings.collective_timeout,
            spec.checkpoint_every,
        )
        for g in joiners:
            name = actor_name(rec.name, g, self._next_incarnation(rec))
            self.actors.create(name, config, g, gen)
            rec.actors[g] = name

    def _next_incarnation(self, rec: JobRec | str) -> int:
        key = f"incarnation:{rec.name}" if isinstance(rec, JobRec) else rec
        value = int(self.store.meta(key, "0")) + 1
        with self.store.transaction() as db:
            self.store.set_meta(db, key, str(value))
        return value

    def _store_path(self, job: str, number: int) -> str:
        return str(self.state.rendezvous / job / f"gen-{number}")

    def _num_nodes(self, members: tuple[str, ...] | list[str]) -> int:
        return len({parse_gpu(g)[0] for g in members}) or 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deepboot.runtime.controller")
    parser.add_argument("--state-dir", default=".deepboot")
    args = parser.parse_args(argv)
    state = StateDir.at(args.state_dir)
    record = ClusterRecord.load(state)
    settings = ControllerSettings.load(settings_file(state))
    os.environ.update(ray_env(record))
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    import ray

    ray.init(
        address=record.address,
        namespace="deepboot",
        logging_level=logging.WARNING,
        log_to_driver=False,
    )
    ctl = Controller(state, settings, record.cluster, RayActors())
    state.write_controller_pid(os.getpid())
    try:
        ctl.run()
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
