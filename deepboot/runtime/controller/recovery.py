"""Recovery after a controller's crash: a pure plan from the stored rows and the live
actors (:func:`plan_recovery`, :func:`plan_replicas`), then its execution.

The worker and replica actors are detached: they outlive the controller. A new one
rebuilds its picture from the store and from what is still alive. A job keeps the
live workers of its recorded generation; any other worker actor (an ended job's, a
superseded incarnation's, one that departed after a stop) is killed, so a job never
has two live worker groups. A job whose recorded workers are not all alive, or not
all in its recorded generation, re-forms as a new generation of the survivors (the
newest state as rank 0), or goes back to the queue to restore its checkpoint when
none survived. A replica is kept on the GPU its row records, in the recorded state,
with the recorded protect end; one that was serving is handed to the loop as idle;
the replicas are restored before anything is flushed. Recovery calls no policy
function: what happens next is the loop's. Named crash points (``runtime.faults``)
sit between its steps.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from deepboot.core.gpu import GpuId, GpuState
from deepboot.elastic.protocol import Generation, WorkerReport, WorkerStatus
from deepboot.runtime.actors.handles import ActorName, Actors
from deepboot.runtime.actors.replica_actor import REPLICA_PREFIX
from deepboot.runtime.controller.controller_settings import ControllerSettings
from deepboot.runtime.controller.eventlog import EventLog
from deepboot.runtime.controller.faults import CrashPoints
from deepboot.runtime.controller.generations import Generations, num_nodes
from deepboot.runtime.controller.jobrecords import JobRec, OnlineModel, gpu_name, parse_gpu
from deepboot.runtime.controller.service_catalog import ServiceCatalog
from deepboot.runtime.controller.shared import Flush, Post
from deepboot.runtime.store.jobstore import EventRow, GpuRow, JobRow, JobState, JobStore, LogKind
from deepboot.runtime.store.statedir import StateDir
from deepboot.scheduler.events import Event, EventKind
from deepboot.world.gpus import BoardGpu, GpuBoard

_REPLICA_STATES = frozenset({"running", "protect", "sleep"})


class Outcome(enum.Enum):
    """What becomes of a job not yet ended."""

    WAITING = "waiting"  # submitted, never scheduled: nothing ran
    FORMED = "formed"  # every recorded worker is alive, in the recorded generation
    REFORM = "reform"  # some are: they re-form as a new generation
    REQUEUE = "requeue"  # none is: back to the queue, to restore the checkpoint


@dataclass(frozen=True, slots=True)
class JobPlan:
    """One job's recovery.

    Attributes:
        name: The job.
        outcome: What becomes of it.
        actors: GPU name -> actor name of the live workers it keeps.
        order: For REFORM, the survivors in rank order (the newest state first).
    """

    name: str
    outcome: Outcome
    actors: Mapping[str, str] = field(default_factory=dict)
    order: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RecoveryPlan:
    """The workers' side of a recovery.

    Attributes:
        kill: Worker actors to kill, in order.
        jobs: Every job not ended, in the store's order.
    """

    kill: tuple[str, ...]
    jobs: tuple[JobPlan, ...]

    @property
    def claimed(self) -> frozenset[str]:
        """The GPUs (names) the kept workers hold."""
        return frozenset(g for j in self.jobs for g in j.actors)


def plan_recovery(
    rows: Mapping[str, JobRow],
    live: Sequence[str],
    reports: Mapping[str, WorkerReport | None],
) -> RecoveryPlan:
    """The workers' recovery, from the stored job rows, the live worker actors'
    names and their reports (a name missing from ``reports``, or None there, is a
    worker that did not answer: dead).

    Two incarnations of one job on one GPU keep the newer; a GPU two jobs' rows both
    claim goes to the first in the store's order (the other's worker counts as dead).
    """
    kill: list[str] = []
    by_job: dict[str, dict[str, str]] = {}
    for name in live:
        parsed = ActorName.parse(name)
        if parsed is None:
            continue
        on_gpu = by_job.setdefault(parsed.job, {})
        prev = on_gpu.get(parsed.gpu)
        if prev is not None:
            older, name = sorted([prev, name], key=_incarnation)
            kill.append(older)
        on_gpu[parsed.gpu] = name
    for job, actors in by_job.items():
        row = rows.get(job)
        if row is None or row.state.ended:
            kill.extend(actors.values())
    claimed: set[str] = set()
    plans: list[JobPlan] = []
    for row in rows.values():
        if row.state.ended:
            continue
        if row.state is JobState.SUBMITTED:
            plans.append(JobPlan(row.name, Outcome.WAITING))
            continue
        actors = by_job.get(row.name, {})
        kill.extend(name for gpu, name in actors.items() if gpu not in row.workers)
        members = [g for g in row.workers if g in actors]
        alive = [g for g in members if _alive(reports.get(actors[g])) and g not in claimed]
        kill.extend(actors[g] for g in members if g not in alive)
        claimed.update(alive)
        kept = {g: actors[g] for g in alive}
        got = {g: reports[actors[g]] for g in alive}
        formed = all(
            (r := got[g]) is not None
            and r.generation == row.generation
            and r.status in (WorkerStatus.RUNNING, WorkerStatus.DONE)
            for g in alive
        )
        if alive and formed and len(alive) == len(row.workers):
            plans.append(JobPlan(row.name, Outcome.FORMED, kept))
        elif alive:
            order = sorted(alive, key=lambda g: (-_generation(got[g]), row.workers.index(g)))
            plans.append(JobPlan(row.name, Outcome.REFORM, kept, tuple(order)))
        else:
            plans.append(JobPlan(row.name, Outcome.REQUEUE))
    return RecoveryPlan(tuple(kill), tuple(plans))


def plan_replicas(
    stored: Sequence[GpuRow],
    live: Sequence[str],
    services: Collection[str],
    gpus: Collection[str],
    claimed: Collection[str],
) -> tuple[tuple[tuple[str, GpuRow], ...], tuple[str, ...]]:
    """Which live replica actors to keep, each with its GPU's stored row, and which to
    kill: a replica is kept only where its GPU's row names it, in a replica's state,
    for a service still registered, on a GPU of the cluster that no kept worker holds.

    Args:
        stored: The store's GPU rows.
        live: The live replica actors' names.
        services: The registered services.
        gpus: The cluster's GPU names.
        claimed: GPUs the kept workers hold.
    """
    # By the name the row records, not the name's GPU: a promoted standby's name
    # (``r|~standby|<node>|<inc>``) names no GPU. Every standby no row names is killed
    # (one that was promoted before a crash could flush its row holds a GPU's
    # placement group); the controller starts fresh ones.
    rows = {r.replica: r for r in stored if r.replica}
    keep: list[tuple[str, GpuRow]] = []
    kill: list[str] = []
    for name in live:
        row = rows.get(name)
        ok = (
            row is not None
            and row.gpu in gpus
            and row.gpu not in claimed
            and row.service in services
            and row.state in _REPLICA_STATES
        )
        if ok:
            assert row is not None
            keep.append((name, row))
        else:
            kill.append(name)
    return tuple(keep), tuple(kill)


def _alive(report: WorkerReport | None) -> bool:
    """A worker that answered and has not left its job (one that departed obeyed a
    stop: it holds no state worth keeping)."""
    return report is not None and report.status is not WorkerStatus.DEPARTED


def _incarnation(name: str) -> int:
    parsed = ActorName.parse(name)
    assert parsed is not None
    return parsed.incarnation


def _generation(report: WorkerReport | None) -> int:
    assert report is not None
    return report.generation


class Counters(Protocol):
    """The Prometheus counters, as recovery restores them."""

    def restore(self, counts: Mapping[str, int]) -> None: ...

    def replay(self, events: Iterable[EventRow]) -> None: ...


class Recovery:
    """Carrying out the recovery plans (see the module docstring).

    Args:
        store: The rows to recover from.
        actors: The live workers and replicas.
        board: The GPU ledger, rebuilt.
        jobs: The jobs not yet ended, by name: every stored one joins them.
        catalog: The services (a replica of an unknown one is killed).
        generations: Re-forms the jobs whose group lost a member.
        counters: The Prometheus counters, restored.
        state: The state directory.
        settings: The controller's settings (for the ``controller_started`` record).
        log: The event log.
        post: The driver's queue (the recovered replicas' protect timers).
        flush: Records the recovered picture.
        crash: The crash points.

    Attributes:
        idle_recovered: The GPUs of the replicas recovered RUNNING (idle now): the
            loop hears of each once it runs.
        adopted: The replicas recovered, for the router once one serves.
    """

    def __init__(
        self,
        store: JobStore,
        actors: Actors,
        board: GpuBoard,
        jobs: dict[str, JobRec],
        catalog: ServiceCatalog,
        generations: Generations,
        counters: Counters,
        state: StateDir,
        settings: ControllerSettings,
        log: EventLog,
        post: Post,
        flush: Flush,
        crash: CrashPoints,
    ) -> None:
        self.store, self.actors, self.board, self.jobs = store, actors, board, jobs
        self.catalog, self.generations, self.counters = catalog, generations, counters
        self.state, self.settings, self.log, self.post = state, settings, log, post
        self.flush, self.crash = flush, crash
        self._gpu_names = frozenset(gpu_name(g.gpu_id) for g in board.gpus)
        self.idle_recovered: list[GpuId] = []
        self.adopted: list[BoardGpu] = []

    def recover(self) -> None:
        """Rebuild the picture from the store and the live actors, and record it."""
        saved = self.store.meta("counters", "")
        if saved:
            self.counters.restore(json.loads(saved))
        else:  # a store an older deepboot wrote: count its log, once
            self.counters.replay(self.store.events())
        self.catalog.take_services()
        # Read before anything below flushes (a re-formed job does), which rewrites
        # the GPU table from a picture that has no replicas yet.
        stored_gpus = self.store.gpus()
        rows = {r.name: r for r in self.store.jobs()}
        live = [n for n in self.actors.list_workers() if ActorName.parse(n)]
        reports = self.actors.reports(live)
        plan = plan_recovery(rows, live, reports)
        self.crash.hit("recovery.planned")
        for name in plan.kill:
            self.actors.kill(name)
        self.crash.hit("recovery.killed")
        recovered: list[str] = []
        reform: list[tuple[JobRec, JobPlan]] = []
        for job in plan.jobs:
            row = rows[job.name]
            rec = JobRec(row, model=OnlineModel.from_json(row.model), on_move=self.log.moved)
            self.jobs[row.name] = rec
            if job.outcome is Outcome.WAITING:
                continue
            self._restore_job(rec, job, reports)
            recovered.append(row.name)
            if job.outcome is Outcome.REFORM:
                reform.append((rec, job))
        kept = [n for j in plan.jobs for n in j.actors.values()]
        killed = list(plan.kill)
        # The replicas before anything flushes (a re-form does): a flush before them
        # would record their GPUs as FREE, and a second crash would kill them all.
        self._recover_replicas(stored_gpus, plan.claimed, kept, killed)
        self.crash.hit("recovery.replicas")
        for rec, job in reform:
            self.generations.offer(rec, job.order, how="failure", joiners=())
        self.log.note(LogKind.RECONCILED, kept=sorted(kept), killed=sorted(killed))
        self.log.note(
            LogKind.CONTROLLER_STARTED,
            policy=self.settings.policy,
            afe=self.settings.afe,
            recovered=recovered,
        )
        self.flush()

    def _restore_job(
        self, rec: JobRec, job: JobPlan, reports: Mapping[str, WorkerReport | None]
    ) -> None:
        row = rec.row
        rec.actors = dict(job.actors)
        for g, name in job.actors.items():
            report = reports[name]
            assert report is not None
            rec.reports[g] = report
            self.board.assign(self.board.get(parse_gpu(g)), row.name)
        rec.gen = Generation(
            row.generation,
            tuple(row.workers),
            self.generations.store_path(row.name, row.generation),
            row.local_bsz,
            row.accum,
            num_nodes(row.workers),
            checkpoint_path=str(self.state.job_checkpoint(row.name)),
        )
        if job.outcome is Outcome.FORMED:
            rec.formed = row.generation
        elif job.outcome is Outcome.REFORM:
            pass  # re-formed by ``recover`` once the replicas are back
        else:
            rec.gen = None
            rec.move(JobState.QUEUED, workers=())

    def _recover_replicas(
        self, stored: list[GpuRow], claimed: Collection[str], kept: list[str], killed: list[str]
    ) -> None:
        """Keep the replicas :func:`plan_replicas` keeps, in their recorded state (a
        PROTECT one with its recorded end; one that was serving is idle now: the loop
        hears of it once the driver runs), and kill the others."""
        live = self.actors.list_named(REPLICA_PREFIX)
        # A replica of several GPUs is not kept (a GPU row records one GPU's replica,
        # not its set): killed, its GPUs come back FREE and its next start is cold.
        whole = {n for n, s in self.catalog.specs.items() if s.gpus_per_replica == 1}
        keep, kill = plan_replicas(stored, live, whole, self._gpu_names, claimed)
        for name in kill:
            self.actors.kill(name)
            killed.append(name)
        for name, row in keep:
            gpu = parse_gpu(row.gpu)
            rec = self.board.get(gpu)
            state = GpuState(row.state)
            until = row.protect_until if state is GpuState.PROTECT else None
            if state is GpuState.PROTECT and until is None:
                state = GpuState.RUNNING  # a row without its end: let the loop decide
            self.board.restore(
                rec, state, service=row.service, replica=name, hits=row.hits, protect_until=until
            )
            if until is not None:
                self.post(Event(EventKind.PROTECT_EXPIRED, seq=rec.version, gpu=gpu), at=until)
            if state is GpuState.RUNNING:
                self.idle_recovered.append(gpu)
            self.adopted.append(rec)
            kept.append(name)
