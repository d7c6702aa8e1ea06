"""What reaches the controller, as events on the driver's queue: the router's messages
(arrivals, idle and dead replicas, a pre-warmed replica loaded, every request and
answer for the load and, with ``--slo``, the guard's arrival history), the
store (submissions, cancellations, services), the workers' polls, and the HTTP
endpoint's submissions (which the router's thread writes to the store)."""

from __future__ import annotations

import dataclasses
import logging

from deepboot.core.cluster import Pool
from deepboot.core.gpu import GpuState
from deepboot.core.modes import JobMode
from deepboot.core.service import ServiceSpec
from deepboot.runtime import messages as rt
from deepboot.runtime.controller.jobrecords import JobRec, gpu_name, parse_gpu
from deepboot.runtime.controller.nodes import Nodes
from deepboot.runtime.store.jobstore import JobRow, JobState, LogKind
from deepboot.scheduler.events import Event, EventKind
from deepboot.world.gpus import BoardGpu

log = logging.getLogger("deepboot.controller")


class Intake(Nodes):
    """The controller's event sources (see the module docstring)."""

    def iteration(self) -> None:
        """Poll the workers and read the store: their events go on the queue."""
        now = self.clock()
        dt, self._last = max(now - self._last, 0.0), now
        events: list[Event] = []
        self.check_nodes()  # before the poll: a lost node's workers die as its facts
        events += self.poll(dt)
        self.take_services()
        rows = self.store.jobs()  # one read of the store per iteration
        events += self.take_submissions(rows)
        events += self.take_cancellations(rows)
        for event in events:
            self.post(event)
        self.log_slo()

    def handle_messages(self) -> None:
        """Act on what the router reported (arrivals, idle and dead replicas)."""
        for msg in self.inbox.drain():
            if isinstance(msg, rt.Received):
                self.demand.arrived(msg.service, self.clock())
                if self.arrivals is not None:
                    self.arrivals.arrived(msg.service, self.clock())
            elif isinstance(msg, rt.Served):
                self.demand.ran(msg.service, self.clock(), msg.seconds)
                if self.arrivals is not None:
                    self.arrivals.ran(msg.service, msg.seconds)
            elif isinstance(msg, rt.Answered):
                self.slo.record(msg.service, msg.within, self.clock(), msg.wait)
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
                    self.post(self._emptied(rec))
            elif isinstance(msg, rt.Ready):
                rec = self.board.get(parse_gpu(msg.gpu))
                warming = self.warming.get(rec.gpu_id)
                if warming is not None and warming.replica == msg.replica and msg.inflight:
                    # Requests joined it while it loaded: it serves them, and its
                    # Idle is then an INFERENCE_DONE (the loop's REPLICA_WARM would
                    # leave a replica that took a task RUNNING anyway).
                    del self.warming[rec.gpu_id]
                if rec.replica == msg.replica and rec.service:
                    self.ready[rec.gpu_id] = msg.replica
                    if msg.start == "cold":  # the service's cold start, not a host start
                        self._cold_starts.append((rec.service, round(msg.load_seconds, 3)))
                        self._learn_cold_start(rec.service, msg.seconds)
                    else:
                        self.cache_used(rec.node_id, rec.service)
                    self.note(
                        LogKind.REPLICA,
                        gpu=msg.gpu,
                        service=rec.service,
                        op="ready",
                        seconds=round(msg.seconds, 3),
                        load_seconds=round(msg.load_seconds, 3),
                        start=msg.start,
                    )
                # The standby this replica may have used is replaced now, not while
                # it loaded (no-op without --standby-replicas or with one there).
                self.start_standbys()
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
                self.start_standbys()  # were it a promoted standby: replaced now
        if self._pending_log:
            self.flush()

    def _emptied(self, rec: BoardGpu) -> Event:
        """The event of the RUNNING replica on ``rec`` reported idle: REPLICA_WARM
        (with its ``WarmReplica``'s ``until``) for a pre-warmed one that loaded and
        took no request, else INFERENCE_DONE. Posted instead of, never besides, the
        INFERENCE_DONE: at the same instant the loop handles that first, which would
        put the replica to sleep before its warm-up's protect time."""
        warming = self.warming.get(rec.gpu_id)
        if warming is None or warming.replica != rec.replica:
            return Event(EventKind.INFERENCE_DONE, gpu=rec.gpu_id)
        del self.warming[rec.gpu_id]
        return Event(
            EventKind.REPLICA_WARM, seq=rec.version, gpu=rec.gpu_id,
            service=warming.service, until=warming.until,
        )  # fmt: skip

    def take_services(self) -> None:
        """Services registered since the last look (``deepboot serve``, POST /v1/services)."""
        fresh = {
            r.spec.name: _planned(r.spec, r.cold_start)
            for r in self.store.services()
            if r.spec.name not in self.specs
        }
        if not fresh:
            return
        self.specs = {**self.specs, **fresh}
        if self.router is not None:
            self.router.set_services(self.specs, self._measured_cold_starts())

    def _learn_cold_start(self, service: str, seconds: float) -> None:
        """Plan ``service``'s new replicas with a cold start just measured, from the
        replica's start to ready (what a request that waits for it waits), when its
        file gives no ``cold_start_s``. Without it the policies would see none (0 s)
        and take the SLO guard's relaxed regime (a cold start meets any SLO) for a
        service whose cold start is far above its ``slo_wait_s``."""
        spec = self.specs.get(service)
        if spec is None or spec.cold_start_s is not None:
            return
        self.specs = {**self.specs, service: _planned(spec, round(seconds, 3))}

    def _measured_cold_starts(self) -> dict[str, float]:
        """The first cold start measured of each service (the store's), for the
        router's default load timeouts."""
        return {r.spec.name: r.cold_start for r in self.store.services() if r.cold_start}

    def take_submissions(self, rows: list[JobRow]) -> list[Event]:
        events = []
        for row in rows:
            if row.state is JobState.SUBMITTED and row.name not in self.jobs:
                rec = JobRec(row)
                rec.update(state=JobState.QUEUED)
                self.jobs[row.name] = rec
                why = self._never_runs(rec)
                if why:
                    # Refused, not queued forever (the simulator refuses such a run).
                    self._end(rec, JobState.FAILED, message=why)
                    self.note(LogKind.FAILED, rec.name, error=why)
                    continue
                events.append(Event(EventKind.JOB_SUBMITTED, job=row.name))
            elif row.state is JobState.SUBMITTED:
                self.jobs[row.name].update(state=JobState.QUEUED)
        return events

    def _never_runs(self, rec: JobRec) -> str:
        """Why the policy can never run ``rec`` here ("" when it can): its smallest
        size (the request under a fixed-size policy, else ``min_workers``) is above
        its most (:meth:`JobRec.bounds`) or the GPUs training may ever use."""
        mode = self.loop.training.job_mode
        fewest, most = rec.bounds(mode)
        smallest = rec.row.spec.requested if mode is JobMode.FIXED else fewest
        policy = self.loop.training.policy.name
        if smallest > most:
            batch = "max_batch_size" if mode is JobMode.ADAPTIVE else "batch_size"
            return (
                f"policy {policy!r} may give it at most {most} GPUs ({batch} over "
                f"min_local_batch_size), below its min_workers ({fewest})"
            )
        pools = self.cluster.nodes
        lending = self.loop.settings.lending
        room = sum(n.gpus for n in pools if n.pool is Pool.TRAINING or lending)
        if smallest > room:
            also = "plus the inference pool" if lending else "(lending is off)"
            return (
                f"policy {policy!r} runs it on at least {smallest} GPUs; training may use "
                f"at most {room}: the training pool {also}"
            )
        return ""

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

    def connect_router(self, router: rt.RouterPort) -> None:
        """Hand the router that now serves what it needs from this controller: the
        services and their measured cold starts, each service's crash-loop back-off
        as the store kept it, and the live replicas recovered idle; then record where it
        listens (``http.json``)."""
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
        # Clients find the endpoint only now that it knows the services.
        router.write_address(self.state.http_file)


def _planned(spec: ServiceSpec, measured_s: float | None) -> ServiceSpec:
    """``spec`` as the policies plan with it: its file's ``cold_start_s``, else the
    cold start measured (``measured_s``: a restarted controller's is the store's,
    the handler's load alone, until its next replica measures start to ready)."""
    if spec.cold_start_s is not None or not measured_s:
        return spec
    return dataclasses.replace(spec, cold_start_s=measured_s)
