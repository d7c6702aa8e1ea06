"""What reaches the controller, as events on the driver's queue: the router's messages
(arrivals, idle and dead replicas, a pre-warmed replica loaded, every request and
answer for the load and, with ``--slo``, the guard's arrival history), the
store (submissions, cancellations, services), the workers' polls, and the HTTP
endpoint's submissions (which the router's thread writes to the store)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from deepboot.core.cluster import ClusterSpec, Pool
from deepboot.core.gpu import GpuState
from deepboot.core.modes import JobMode
from deepboot.runtime import messages as rt
from deepboot.runtime.actors.handles import Actors
from deepboot.runtime.controller.eventlog import EventLog
from deepboot.runtime.controller.hostcaches import HostCaches
from deepboot.runtime.controller.jobrecords import JobRec, parse_gpu
from deepboot.runtime.controller.nodes import Nodes
from deepboot.runtime.controller.polling import Polling
from deepboot.runtime.controller.replicas import Replicas
from deepboot.runtime.controller.service_catalog import ServiceCatalog
from deepboot.runtime.controller.shared import Flush, Post, Requests
from deepboot.runtime.store.jobstore import JobRow, JobState, JobStore, LogKind
from deepboot.scheduler.control import ControlLoop
from deepboot.scheduler.events import Event, EventKind
from deepboot.world.gpus import BoardGpu, GpuBoard

log = logging.getLogger("deepboot.controller")


class Intake:
    """The controller's event sources (see the module docstring).

    Args:
        inbox: What the router reported.
        store: Submissions, cancellations and services.
        loop: The control loop (what its policy can ever run; lending on or off).
        cluster: The cluster.
        board: The GPU ledger (the replicas the messages are about).
        jobs: The jobs not yet ended, by name: a submission joins them.
        requests: The requests waiting for the loop, and the services' load.
        catalog: The services, their cold starts, back-offs and SLO tally.
        polling: The workers' polls; a job's end.
        replicas: A replica's readiness, its node's cache, the standbys.
        nodes: The Ray cluster's live nodes, checked before each poll.
        actors: A dead replica's actor is killed.
        log: The event log.
        post: The driver's queue.
        flush: Writes the records a message left.
        clock: Wall clock.
        caches: The node-local model caches (one a replica started from).
    """

    def __init__(
        self,
        inbox: rt.Inbox,
        store: JobStore,
        loop: ControlLoop,
        cluster: ClusterSpec,
        board: GpuBoard,
        jobs: dict[str, JobRec],
        requests: Requests,
        catalog: ServiceCatalog,
        polling: Polling,
        replicas: Replicas,
        nodes: Nodes,
        actors: Actors,
        log: EventLog,
        post: Post,
        flush: Flush,
        clock: Callable[[], float],
        caches: HostCaches,
    ) -> None:
        self.caches = caches
        # One handler per router message type (built once: the loop drains every turn).
        self._handlers: dict[type, Callable[[Any], None]] = {
            rt.Received: self._on_received,
            rt.Served: self._on_served,
            rt.Answered: self._on_answered,
            rt.Arrival: self._on_arrival,
            rt.Backoff: self._on_backoff,
            rt.Withdraw: self._on_withdraw,
            rt.Idle: self._on_idle,
            rt.Ready: self._on_ready,
            rt.Died: self._on_died,
        }
        self.inbox, self.store, self.loop, self.cluster = inbox, store, loop, cluster
        self.board, self.jobs, self.requests, self.catalog = board, jobs, requests, catalog
        self.polling, self.replicas, self.nodes, self.actors = polling, replicas, nodes, actors
        self.log, self.post, self.flush, self.clock = log, post, flush, clock
        self._last = clock()  # the last poll: its ``dt`` is the time since

    def iteration(self) -> None:
        """Poll the workers and read the store: their events go on the queue."""
        now = self.clock()
        dt, self._last = max(now - self._last, 0.0), now
        events: list[Event] = []
        self.nodes.check_nodes()  # before the poll: a lost node's workers die as its facts
        events += self.polling.poll(dt)
        self.catalog.take_services()
        rows = self.store.jobs()  # one read of the store per iteration
        events += self.take_submissions(rows)
        events += self.take_cancellations(rows)
        for event in events:
            self.post(event)
        self.catalog.log_slo()

    def handle_messages(self) -> None:
        """Act on what the router reported (arrivals, idle and dead replicas), one
        handler per message type; the events they note are flushed once at the end."""
        for msg in self.inbox.drain():
            self._handlers[type(msg)](msg)
        if self.log.pending:
            self.flush()

    # The counting messages are read up to a poll late (``rt.QUIET``): each is
    # counted at the time the router stamped on it.

    def _when(self, at: float | None) -> float:
        return self.clock() if at is None else min(at, self.clock())

    def _on_received(self, msg: rt.Received) -> None:
        at = self._when(msg.at)
        self.requests.demand.arrived(msg.service, at)
        if self.requests.arrivals is not None:
            self.requests.arrivals.arrived(msg.service, at)

    def _on_served(self, msg: rt.Served) -> None:
        self.requests.demand.ran(msg.service, self._when(msg.at), msg.seconds)
        if self.requests.arrivals is not None:
            self.requests.arrivals.ran(msg.service, msg.seconds)

    def _on_answered(self, msg: rt.Answered) -> None:
        self.catalog.slo.record(msg.service, msg.within, self._when(msg.at), msg.wait)

    def _on_arrival(self, msg: rt.Arrival) -> None:
        if msg.task in self.requests.arrived or msg.service not in self.catalog.specs:
            return
        self.requests.arrived[msg.task] = msg.service
        self.post(Event(EventKind.INFERENCE_ARRIVAL, job=msg.task, service=msg.service))

    def _on_backoff(self, msg: rt.Backoff) -> None:
        until = self.clock() + msg.seconds if msg.failures else None
        self.catalog.backoff(msg.service, msg.failures, until)

    def _on_withdraw(self, msg: rt.Withdraw) -> None:
        self.requests.placed(msg.task)

    def _on_idle(self, msg: rt.Idle) -> None:
        rec = self.board.get(parse_gpu(msg.gpu))
        if rec.replica == msg.replica and rec.state is GpuState.RUNNING:
            self.post(self._emptied(rec))

    def _on_ready(self, msg: rt.Ready) -> None:
        rec = self.board.get(parse_gpu(msg.gpu))
        # A pre-warmed replica that requests joined while it loaded serves them, and
        # its Idle is then an INFERENCE_DONE (the loop's REPLICA_WARM would leave a
        # replica that took a task RUNNING anyway).
        self.replicas.loaded(rec.gpu_id, msg.replica, msg.inflight)
        if rec.replica == msg.replica and rec.service:
            if msg.start == "cold":  # the service's cold start, not a host start
                self.catalog.cold_start_measured(rec.service, msg.load_seconds, msg.seconds)
            else:
                self.caches.used(rec.node_id, rec.service)
            self.log.note(
                LogKind.REPLICA,
                gpu=msg.gpu,
                service=rec.service,
                op="ready",
                seconds=round(msg.seconds, 3),
                load_seconds=round(msg.load_seconds, 3),
                start=msg.start,
                **({"wake_failed": msg.wake_failed[-500:]} if msg.wake_failed else {}),
            )
        # The standby this replica may have used is replaced now, not while it loaded
        # (no-op without --standby-replicas or with one there).
        self.replicas.start_standbys()

    def _on_died(self, msg: rt.Died) -> None:
        rec = self.board.get(parse_gpu(msg.gpu))
        if rec.replica != msg.replica:
            return
        log.warning("replica %s died (%s): %s", msg.replica, msg.phase, msg.error)
        self.actors.kill(msg.replica)
        self.log.note(
            LogKind.REPLICA, gpu=msg.gpu, service=rec.service, op="died",
            error=msg.error[-2000:], phase=msg.phase, backoff_s=round(msg.backoff_s, 3),
        )  # fmt: skip
        for member in rec.replica_gpus or (rec.gpu_id,):  # a k-GPU replica: all of it
            self.board.fail(self.board.get(member))  # the fact; the loop retries the tasks
        self.post(Event(EventKind.REPLICA_LOST, gpu=rec.gpu_id))
        self.replicas.start_standbys()  # were it a promoted standby: replaced now

    def _emptied(self, rec: BoardGpu) -> Event:
        """The event of the RUNNING replica on ``rec`` reported idle: REPLICA_WARM
        (with its ``WarmReplica``'s ``until``) for a pre-warmed one that loaded and
        took no request, else INFERENCE_DONE. Posted instead of, never besides, the
        INFERENCE_DONE: at the same instant the loop handles that first, which would
        put the replica to sleep before its warm-up's protect time."""
        warming = self.replicas.emptied_prewarm(rec.gpu_id, rec.replica)
        if warming is None:
            return Event(EventKind.INFERENCE_DONE, gpu=rec.gpu_id)
        assert warming.warm_until is not None  # a pre-warmed replica's
        return Event(
            EventKind.REPLICA_WARM, seq=rec.version, gpu=rec.gpu_id,
            service=warming.service, until=warming.warm_until,
        )  # fmt: skip

    def take_submissions(self, rows: list[JobRow]) -> list[Event]:
        events = []
        for row in rows:
            if row.state is JobState.SUBMITTED and row.name not in self.jobs:
                rec = JobRec(row, on_move=self.log.moved)
                rec.move(JobState.QUEUED)
                self.jobs[row.name] = rec
                why = self._never_runs(rec)
                if why:
                    # Refused, not queued forever (the simulator refuses such a run).
                    self.polling.end(rec, JobState.FAILED, message=why)
                    self.log.note(LogKind.FAILED, rec.name, error=why)
                    continue
                events.append(Event(EventKind.JOB_SUBMITTED, job=row.name))
            elif row.state is JobState.SUBMITTED:
                self.jobs[row.name].move(JobState.QUEUED)
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
            self.polling.end(rec, JobState.CANCELLED)
            self.log.note(LogKind.CANCELLED, name)
            events.append(Event(EventKind.JOB_FINISHED, job=name))
        return events
