"""Each controller part built alone, handed its collaborators (issue 43): the shared
state is real (the GPU ledger, the SQLite store, the event log), the processes are
fake (:mod:`tests.runtime.fake_actors`), and a part it calls is a recording fake. No
:class:`~deepboot.runtime.controller.wiring.Controller` is built here.

Generations, replicas, intake and recovery, each with the contract its docstring
states: what it moves on the ledger and the job's row, what it records, and that the
record is durable before any process hears of it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prometheus_client")

from deepboot.core.cluster import ClusterSpec, Node, Pool  # noqa: E402
from deepboot.core.gpu import GpuId, GpuState  # noqa: E402
from deepboot.core.modes import JobMode  # noqa: E402
from deepboot.core.service import ServiceSpec  # noqa: E402
from deepboot.elastic.protocol import Generation, WorkerConfig  # noqa: E402
from deepboot.runtime import messages as rt  # noqa: E402
from deepboot.runtime.actors.handles import actor_name  # noqa: E402
from deepboot.runtime.client.jobspec import JobSpec  # noqa: E402
from deepboot.runtime.controller.controller_settings import (  # noqa: E402
    ControllerSettings,
    build_loop,
)
from deepboot.runtime.controller.eventlog import EventLog  # noqa: E402
from deepboot.runtime.controller.faults import CrashPoints  # noqa: E402
from deepboot.runtime.controller.generations import Change, Generations  # noqa: E402
from deepboot.runtime.controller.hostcaches import HostCaches  # noqa: E402
from deepboot.runtime.controller.intake import Intake  # noqa: E402
from deepboot.runtime.controller.jobrecords import JobRec, JobTransitionError  # noqa: E402
from deepboot.runtime.controller.recovery import Recovery  # noqa: E402
from deepboot.runtime.controller.replicarecords import (  # noqa: E402
    ReplicaPhase,
    ReplicaTransitionError,
)
from deepboot.runtime.controller.replicas import Replicas  # noqa: E402
from deepboot.runtime.controller.service_catalog import ServiceCatalog  # noqa: E402
from deepboot.runtime.controller.shared import Incarnations, Requests, RouterLink  # noqa: E402
from deepboot.runtime.store.jobstore import JobRow, JobState, JobStore, LogKind  # noqa: E402
from deepboot.runtime.store.statedir import StateDir  # noqa: E402
from deepboot.scheduler.events import Event, EventKind  # noqa: E402
from deepboot.scheduler.operations import Release, StartReplica, WarmReplica  # noqa: E402
from deepboot.world.gpus import GpuBoard, apply_gpu_op  # noqa: E402
from tests.runtime.fake_actors import FakeActors  # noqa: E402

CLUSTER = ClusterSpec((Node(0, 2, Pool.TRAINING), Node(1, 2, Pool.INFERENCE)))
SERVING = (1, 0)


class Counted:
    """The event log's counter (the Prometheus counters' place): the kinds counted."""

    def __init__(self) -> None:
        self.kinds: list[LogKind] = []

    def count(self, kind: LogKind, detail: dict[str, Any]) -> None:
        self.kinds.append(kind)


@dataclass
class Kit:
    """The shared state every part is handed, real, and the recording callbacks."""

    state: StateDir
    store: JobStore
    board: GpuBoard
    log: EventLog
    fake: FakeActors
    now: float = 1000.0
    flushes: list[int] = field(default_factory=list)  # processes created at each flush
    posted: list[tuple[Event, float | None]] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    def flush(self) -> None:
        """Write the waiting records (the controller's flush, its event-log part)."""
        self.flushes.append(len(self.fake.created) + len(self.fake.replicas))
        with self.store.transaction() as db:
            self.log.write(self.store, db)

    def post(self, event: Event, at: float | None = None) -> None:
        self.posted.append((event, at))

    def events(self, kind: LogKind, job: str | None = None) -> list[dict[str, Any]]:
        return [
            e.detail
            for e in self.store.events()
            if e.kind is kind and (job is None or e.job == job)
        ]


def kit(tmp_path: Path) -> Kit:
    state = StateDir.at(tmp_path / "state").ensure()
    return Kit(state, JobStore(state.db), GpuBoard(CLUSTER), EventLog(Counted()), FakeActors())


def generations(k: Kit, afe: bool = True) -> Generations:
    from deepboot.world.settings import SharedCluster

    settings = ControllerSettings(shared=SharedCluster(afe=afe))
    return Generations(
        k.state, settings, JobMode.ADAPTIVE, k.board, k.fake, k.log, k.flush,
        CrashPoints(None), Incarnations(k.store), k.clock,
    )  # fmt: skip


def queued_job(k: Kit, name: str = "j", **spec: int) -> JobRec:
    row = JobRow(name, JobSpec(name, "m:f", **spec), JobState.QUEUED, 0.0)
    return JobRec(row, on_move=k.log.moved)


def form(k: Kit, gens: Generations, rec: JobRec) -> None:
    """The workers report (the fake ones have formed the newest generation offered)."""
    reports = k.fake.reports(list(rec.actors.values()))
    for g, name in rec.actors.items():
        report = reports[name]
        assert report is not None
        rec.reports[g] = report
    gens.formed(rec)


def hold(k: Kit, job: str, *gpus: GpuId) -> None:
    for g in gpus:
        k.board.assign(k.board.get(g), job)


# -- generations ---------------------------------------------------------------------------


def test_generations_alone_start_shrink_by_afe_then_preempt(tmp_path: Path) -> None:
    k = kit(tmp_path)
    gens = generations(k)
    rec = queued_job(k, max_workers=2)
    hold(k, "j", (0, 0), (0, 1))

    gens.retarget(rec)  # START: a worker on each GPU held
    assert rec.row.state is JobState.RUNNING and rec.transition is not None
    assert rec.transition.how == Change.START.value
    assert sorted(rec.actors) == ["0.0", "0.1"] and len(k.fake.created) == 2
    assert k.flushes == [0], "the generation is durable before any worker exists"
    form(k, gens, rec)
    assert rec.formed == 1 and rec.transition is None

    survivor, leaver = rec.actors["0.0"], rec.actors["0.1"]
    apply_gpu_op(k.board, Release((0, 1), "j"))
    gens.retarget(rec)  # AFE: the survivor stays; nobody new starts
    assert rec.transition is not None and rec.transition.how == Change.AFE.value
    assert rec.gen is not None and rec.gen.members == ("0.0",) and rec.gen.number == 2
    assert len(k.fake.created) == 2 and leaver in rec.leaving
    assert k.fake.offers(survivor)[-1] == 2 and k.fake.offers(leaver)[-1] == 2
    assert rec.row.restarts == 1

    k.board.release_job("j")
    gens.retarget(rec)  # PREEMPT: every worker checkpoints and stops
    assert rec.row.state is JobState.QUEUED and not rec.actors and rec.gen is not None
    assert rec.gen.stop and k.fake.offers(survivor)[-1] == rec.gen.number
    k.flush()
    moves = [(m["from"], m["to"]) for m in k.events(LogKind.MOVED, "j")]
    assert moves == [("queued", "running"), ("running", "queued")]
    assert k.events(LogKind.STARTED, "j")[0]["workers"] == ["0.0", "0.1"]
    assert k.events(LogKind.PREEMPTED, "j")[0]["workers"] == ["0.0"]


def test_generations_alone_restart_without_afe(tmp_path: Path) -> None:
    k = kit(tmp_path)
    gens = generations(k, afe=False)
    rec = queued_job(k, max_workers=2)
    hold(k, "j", (0, 0))
    gens.retarget(rec)
    form(k, gens, rec)
    first = rec.actors["0.0"]
    hold(k, "j", (0, 1))
    gens.retarget(rec)  # without AFE a grow stops every worker and restarts them all
    assert rec.transition is not None and rec.transition.how == Change.RESTART.value
    assert first in rec.leaving and sorted(rec.actors) == ["0.0", "0.1"]
    assert first not in rec.actors.values() and len(k.fake.created) == 3


def test_a_job_move_off_its_table_is_refused(tmp_path: Path) -> None:
    k = kit(tmp_path)
    rec = queued_job(k)
    rec.move(JobState.CANCELLED)
    with pytest.raises(JobTransitionError, match="no move from cancelled to running"):
        rec.move(JobState.RUNNING)
    with pytest.raises(AssertionError):
        rec.update(state=JobState.QUEUED)
    k.flush()
    assert k.events(LogKind.MOVED) == [], "an end is its own record (finished, failed ...)"


# -- replicas ------------------------------------------------------------------------------


def replicas(k: Kit, **settings: Any) -> Replicas:
    router = RouterLink()
    catalog = ServiceCatalog(k.store, k.log, router, k.clock, None)
    k.store.register_service(ServiceSpec("svc", "tiny", handler="m:load", cold_start_s=5.0))
    catalog.take_services()
    config = ControllerSettings(**settings)
    return Replicas(
        k.board, catalog, Requests(None), k.state, config, CLUSTER,
        k.fake, router, k.log, k.flush, CrashPoints(None), Incarnations(k.store), k.clock,
        caches=HostCaches(k.fake, config, CLUSTER, catalog),
    )  # fmt: skip


def test_replicas_alone_a_prewarmed_replica_goes_through_its_phases(tmp_path: Path) -> None:
    k = kit(tmp_path)
    reps = replicas(k)
    reps.warm_replica(WarmReplica(SERVING, "svc", 1100.0))
    name = k.board.get(SERVING).replica
    assert name is not None and k.fake.replicas == {name: "1.0"}
    assert k.flushes == [0], "its start is logged before its actor exists"
    [r] = reps.prewarming()
    assert (r.name, r.phase, r.warm_until) == (name, ReplicaPhase.PREWARMING, 1100.0)
    assert reps.is_loading(SERVING, name) and SERVING in reps.warming_loads()

    reps.loaded(SERVING, name, inflight=0)  # loaded, no request joined it
    assert r.phase is ReplicaPhase.WARM_IDLE and not reps.is_loading(SERVING, name)
    assert reps.emptied_prewarm(SERVING, "another") is None
    assert reps.emptied_prewarm(SERVING, name) is r and r.phase is ReplicaPhase.READY
    assert reps.emptied_prewarm(SERVING, name) is None, "its REPLICA_WARM is posted once"
    assert not reps.prewarming() and not reps.warming_loads()
    with pytest.raises(ReplicaTransitionError, match="no move from ready to loading"):
        r.move(ReplicaPhase.LOADING)
    assert reps.first_sleep(SERVING, name, "svc") and not reps.first_sleep(SERVING, name, "svc")


def test_replicas_alone_a_task_replica_is_loading_until_ready(tmp_path: Path) -> None:
    k = kit(tmp_path)
    reps = replicas(k)
    reps.start_replica(StartReplica(SERVING, "svc", "t1", True, 0))
    name = k.board.get(SERVING).replica
    assert name is not None and reps.record(SERVING, name) is not None
    assert reps.is_loading(SERVING, name) and not reps.prewarming()
    reps.loaded(SERVING, name, inflight=1)
    record = reps.record(SERVING, name)
    assert record is not None and record.phase is ReplicaPhase.READY
    assert not reps.is_loading(SERVING, name)
    reps.adopt((1, 1), "kept-by-a-restart", "svc")  # a replica recovered idle: loaded
    assert not reps.is_loading((1, 1), "kept-by-a-restart")


# -- intake --------------------------------------------------------------------------------


class RecordingParts:
    """The parts intake calls (polling, nodes, replicas, the caches), recorded; ``end`` writes the
    ended row and forgets the job, as the controller's flush does."""

    def __init__(self, store: JobStore, jobs: dict[str, JobRec]) -> None:
        self.store, self.jobs = store, jobs
        self.ended: list[tuple[str, JobState, str]] = []
        self.calls: list[str] = []

    def end(self, rec: JobRec, state: JobState, message: str = "") -> None:
        rec.move(state, message=message)
        self.ended.append((rec.name, state, message))
        with self.store.transaction() as db:
            self.store.save_job(db, rec.row)
        del self.jobs[rec.name]

    def poll(self, dt: float) -> list[Event]:
        return []

    def check_nodes(self) -> None:
        self.calls.append("check_nodes")

    def start_standbys(self) -> None:
        self.calls.append("start_standbys")

    def loaded(self, gpu_id: GpuId, replica: str, inflight: int) -> None:
        self.calls.append(f"loaded {replica}")

    def emptied_prewarm(self, gpu_id: GpuId, replica: str | None) -> None:
        return None

    def used(self, node: int, service: str) -> None:  # the model caches'
        self.calls.append(f"cache used by {service}")


def intake(k: Kit) -> tuple[Intake, rt.Inbox, RecordingParts, dict[str, JobRec]]:
    settings = ControllerSettings(policy="fifo")
    router = RouterLink()
    catalog = ServiceCatalog(k.store, k.log, router, k.clock, None)
    k.store.register_service(ServiceSpec("svc", "tiny", handler="m:load"))
    catalog.take_services()
    jobs: dict[str, JobRec] = {}
    inbox, parts = rt.Inbox(), RecordingParts(k.store, jobs)
    part = Intake(
        inbox, k.store, build_loop(settings), CLUSTER, k.board, jobs, Requests(None), catalog,
        parts, parts, parts, k.fake, k.log, k.post, k.flush, k.clock,  # type: ignore[arg-type]
        caches=parts,  # type: ignore[arg-type]
    )  # fmt: skip
    return part, inbox, parts, jobs


def test_intake_alone_queues_what_can_run_and_refuses_what_never_could(tmp_path: Path) -> None:
    k = kit(tmp_path)
    part, _, parts, jobs = intake(k)
    k.store.submit(JobSpec("fits", "m:f", max_workers=2))
    k.store.submit(JobSpec("never", "m:f", workers=9, min_workers=9, max_workers=9))
    events = part.take_submissions(k.store.jobs())
    assert [(e.kind, e.job) for e in events] == [(EventKind.JOB_SUBMITTED, "fits")]
    assert jobs["fits"].row.state is JobState.QUEUED
    [(name, state, why)] = parts.ended
    assert (name, state) == ("never", JobState.FAILED) and "at most 4" in why
    assert part.take_submissions(k.store.jobs()) == [], "a job is taken once"
    k.flush()
    assert [m["to"] for m in k.events(LogKind.MOVED, "fits")] == ["queued"]
    assert k.events(LogKind.FAILED, "never")[0]["error"] == why


def test_intake_alone_acts_on_each_router_message(tmp_path: Path) -> None:
    k = kit(tmp_path)
    part, inbox, parts, _ = intake(k)
    gpu = k.board.get(SERVING)
    apply_gpu_op(k.board, StartReplica(SERVING, "svc", "t0", True, 0))
    gpu.replica = "r1"
    inbox.put(rt.Arrival("t1", "svc"))
    inbox.put(rt.Arrival("t1", "svc"))  # the same request again: posted once
    inbox.put(rt.Arrival("t2", "no-such-service"))
    inbox.put(rt.Ready("1.0", "r1", 2.0, 1.5, "host", inflight=1))
    inbox.put(rt.Died("1.0", "r0", "an older replica", "serve", 0.0))  # not the GPU's: ignored
    inbox.put(rt.Died("1.0", "r1", "boom", "serve", 0.0))
    part.handle_messages()
    kinds = [(e.kind, e.job or e.gpu) for e, _ in k.posted]
    assert kinds == [(EventKind.INFERENCE_ARRIVAL, "t1"), (EventKind.REPLICA_LOST, SERVING)]
    assert k.fake.killed == ["r1"] and gpu.state is GpuState.FREE
    assert parts.calls == ["loaded r1", "cache used by svc", "start_standbys", "start_standbys"]
    assert [r["op"] for r in k.events(LogKind.REPLICA)] == ["ready", "died"]


# -- recovery ------------------------------------------------------------------------------


class RecordingGenerations:
    """Generations as recovery calls it: the store paths, and the offers made."""

    def __init__(self, state: StateDir) -> None:
        self.state = state
        self.offers: list[tuple[str, tuple[str, ...], str]] = []

    def store_path(self, job: str, number: int) -> str:
        return str(self.state.rendezvous / job / f"gen-{number}")

    def offer(self, rec: JobRec, members: tuple[str, ...], how: str, joiners: Any) -> None:
        self.offers.append((rec.name, members, how))


class NoCounters:
    def restore(self, counts: Any) -> None:
        pass

    def replay(self, events: Any) -> None:
        pass


def running_row(k: Kit, name: str, workers: tuple[str, ...], generation: int) -> None:
    k.store.submit(JobSpec(name, "m:f", max_workers=2))
    row = replace(
        k.store.job(name), state=JobState.RUNNING, generation=generation, workers=workers,
        local_bsz=32, accum=1, started=999.0,
    )  # fmt: skip
    with k.store.transaction() as db:
        k.store.save_job(db, row)


def live_worker(k: Kit, job: str, gpu: str, generation: int, members: tuple[str, ...]) -> str:
    name = actor_name(job, gpu, 1)
    gen = Generation(generation, members, "", 32, 1, 1)
    k.fake.create(name, WorkerConfig(job, "m:f", (), "", 15.0, 0), gpu, gen)
    return name


def test_recovery_alone_keeps_reforms_requeues_and_kills(tmp_path: Path) -> None:
    k = kit(tmp_path)
    running_row(k, "whole", ("0.0",), 3)  # its worker lives, in its generation: kept
    running_row(k, "half", ("1.0", "1.1"), 2)  # one of two lives: re-formed on it
    running_row(k, "gone", ("0.1",), 4)  # none lives: back to the queue
    kept = live_worker(k, "whole", "0.0", 3, ("0.0",))
    survivor = live_worker(k, "half", "1.0", 2, ("1.0", "1.1"))
    stray = live_worker(k, "ended-long-ago", "0.1", 1, ("0.1",))
    gens, jobs = RecordingGenerations(k.state), {}
    part = Recovery(
        k.store, k.fake, k.board, jobs, ServiceCatalog(k.store, k.log, RouterLink(), k.clock, None),
        gens, NoCounters(), k.state, ControllerSettings(), k.log, k.post, k.flush,  # type: ignore[arg-type]
        CrashPoints(None),
    )  # fmt: skip
    part.recover()

    assert sorted(jobs) == ["gone", "half", "whole"]
    assert jobs["whole"].formed == 3 and jobs["whole"].actors == {"0.0": kept}
    assert gens.offers == [("half", ("1.0",), "failure")]
    assert jobs["gone"].row.state is JobState.QUEUED and jobs["gone"].gen is None
    assert [g.gpu_id for g in k.board.held("half")] == [(1, 0)]
    assert k.fake.killed == [stray] and survivor not in k.fake.killed
    assert k.flushes, "the recovered picture is recorded"
    [reconciled] = k.events(LogKind.RECONCILED)
    assert reconciled == {"kept": sorted([kept, survivor]), "killed": [stray]}
    assert k.events(LogKind.CONTROLLER_STARTED)[0]["recovered"] == ["whole", "half", "gone"]
    assert [(m["from"], m["to"]) for m in k.events(LogKind.MOVED, "gone")] == [
        ("running", "queued")
    ]
