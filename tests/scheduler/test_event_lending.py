"""Event-time lending (``LoopSettings.event_lending``) through the one driver,
``run_event``, against a small in-memory world: which events top up, what the
continuations snapshot, and what the top-up may not take."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import pytest
from test_control import NOW, gpus, job

from deepboot.core import ClusterSpec, GpuState, GpuView, JobView, Placement, ServiceSpec
from deepboot.policies.deepboot import DeepBootPolicy
from deepboot.policies.inference import AtsIPolicy
from deepboot.policies.slo import SloConfig
from deepboot.scheduler import Event, EventKind, InferenceScheduler, Resize, Scheduler, Start
from deepboot.scheduler.control import (
    ControlLoop,
    LoopSettings,
    PendingTask,
    Snapshot,
    Step,
    run_event,
)
from deepboot.scheduler.decision import new_placement
from deepboot.scheduler.operations import (
    Bind,
    EvictReplica,
    Lend,
    ProtectReplica,
    Release,
    SleepReplica,
)

RNG = np.random.default_rng(0)


class World:
    """GPU views, jobs and a task queue, changed only by ``apply``; it remembers the
    kind of every snapshot asked for and every step applied."""

    def __init__(
        self,
        cluster: ClusterSpec,
        views: tuple[GpuView, ...],
        jobs: tuple[JobView, ...],
        services: Mapping[str, ServiceSpec] | None = None,
    ) -> None:
        self.cluster = cluster
        self.gpus = {g.gpu_id: g for g in views}
        self.jobs = {j.name: j for j in jobs}
        self.services = dict(services or {})
        self.kinds: list[EventKind] = []
        self.steps: list[Step] = []

    def snapshot(self, event: Event) -> Snapshot:
        self.kinds.append(event.kind)
        views = tuple(self.gpus[k] for k in sorted(self.gpus))
        jobs = tuple(sorted(self.jobs.values(), key=lambda j: (j.submit_time, j.name)))
        return Snapshot(NOW, self.cluster, jobs, views, (), services=self.services)

    def apply(self, step: Step) -> None:
        self.steps.append(step)
        for op in step.ops:
            if isinstance(op, Start | Resize):
                self.jobs[op.job] = dataclasses.replace(
                    self.jobs[op.job], placement=new_placement(op)
                )
                continue
            g = self.gpus[op.gpu]  # type: ignore[union-attr]
            if isinstance(op, Bind):
                self.gpus[g.gpu_id] = dataclasses.replace(g, state=GpuState.TRAINING, job=op.job)
            elif isinstance(op, Lend):
                self.gpus[g.gpu_id] = dataclasses.replace(g, state=GpuState.LENT, job=op.job)
            elif isinstance(op, EvictReplica):
                self.gpus[g.gpu_id] = dataclasses.replace(g, state=GpuState.FREE, service=None)
            elif isinstance(op, ProtectReplica):
                self.gpus[g.gpu_id] = dataclasses.replace(g, state=GpuState.PROTECT)
            elif isinstance(op, SleepReplica):
                self.gpus[g.gpu_id] = dataclasses.replace(g, state=GpuState.SLEEP)
            elif isinstance(op, Release):
                self.gpus[g.gpu_id] = dataclasses.replace(g, state=GpuState.FREE, job=None)

    def ops(self) -> list[object]:
        return [op for s in self.steps for op in s.ops]


def loop(event_lending: bool = True, **settings: object) -> ControlLoop:
    return ControlLoop(
        Scheduler(DeepBootPolicy()),
        InferenceScheduler(AtsIPolicy()),
        LoopSettings(event_lending=event_lending, **settings),  # type: ignore[arg-type]
    )


def test_a_finished_jobs_gpus_start_a_queued_job_at_the_event() -> None:
    # "a" finished: the world freed its two GPUs; "b" waits for them.
    cluster, views = gpus("F F", "R:s")
    world = World(cluster, views, (job("b", submit=1.0, max_replicas=2),))
    run_event(loop(), Event(EventKind.JOB_FINISHED, "a"), world, RNG)
    # The event, the end of its (empty) retry pass, then the top-up seen as a tick.
    assert world.kinds == [EventKind.JOB_FINISHED, EventKind.RETRY, EventKind.TOP_UP]
    assert world.ops() == [Bind((0, 0), "b"), Bind((0, 1), "b"), Start("b", Placement.of((0, 0)))]
    assert world.steps[-1].retry is None and not world.steps[-1].round


def test_without_event_lending_the_gpus_wait_for_the_round() -> None:
    cluster, views = gpus("F F", "R:s")
    world = World(cluster, views, (job("b", submit=1.0),))
    run_event(loop(event_lending=False), Event(EventKind.JOB_FINISHED, "a"), world, RNG)
    assert world.kinds == [EventKind.JOB_FINISHED] and world.ops() == []


def test_a_new_job_starts_on_free_gpus_at_its_submission() -> None:
    cluster, views = gpus("T:a F", "R:s")
    jobs = (job("a", (0,), max_replicas=1), job("b", submit=5.0, max_replicas=1))
    world = World(cluster, views, jobs)
    run_event(loop(), Event(EventKind.JOB_SUBMITTED, "b"), world, RNG)
    assert world.ops() == [Bind((0, 1), "b"), Start("b", Placement.of((0,)))]


def test_nothing_free_costs_no_top_up_snapshot() -> None:
    cluster, views = gpus("T:a T:a", "R:s")
    world = World(cluster, views, (job("a", (0, 0)), job("b", submit=1.0)))
    run_event(loop(), Event(EventKind.JOB_SUBMITTED, "b"), world, RNG)
    assert EventKind.TOP_UP not in world.kinds and world.ops() == []


@pytest.mark.parametrize(
    ("slo", "lent"), [(True, True), (False, False)], ids=["sleeps-then-lent", "protected"]
)
def test_a_replica_that_ends_its_task_is_lent_when_it_sleeps(slo: bool, lent: bool) -> None:
    # With the SLO guard an emptied replica sleeps at once (the guard, not a protect
    # time, decides), and nothing holds it here: the running job grows onto it.
    cluster, views = gpus("T:a", "R:s L:a")
    world = World(cluster, views, (job("a", (0, 1), max_replicas=4),))
    settings = {"slo": SloConfig(enabled=True)} if slo else {}
    run_event(loop(**settings), Event(EventKind.INFERENCE_DONE, "t1", gpu=(1, 0)), world, RNG)
    grown = [op for op in world.ops() if isinstance(op, Resize)]
    assert bool(grown) is lent
    if lent:
        assert EvictReplica((1, 0)) in world.ops() and Lend((1, 0), "a") in world.ops()
        assert grown == [Resize("a", Placement.of((0, 1)), Placement.of((0, 1, 1)))]


def test_the_top_up_never_takes_a_replica_the_guard_holds() -> None:
    # Service "s" guarantees one replica: its sleeping one is held, the FREE GPU lent.
    cluster, views = gpus("T:a", "S:s F")
    services = {"s": ServiceSpec("s", "m", guaranteed_replicas=1)}
    world = World(cluster, views, (job("a", (0,), max_replicas=4),), services)
    run_event(loop(), Event(EventKind.JOB_FINISHED, "z"), world, RNG)
    assert Lend((1, 1), "a") in world.ops()
    assert all(getattr(op, "gpu", None) != (1, 0) for op in world.ops())


def test_a_retry_pass_places_queued_tasks_before_the_top_up() -> None:
    cluster, views = gpus("T:a", "F F")
    world = World(cluster, views, (job("a", (0,), max_replicas=4),))
    queue = [PendingTask("t1", "s")]

    def snapshot(event: Event) -> Snapshot:
        snap = World.snapshot(world, event)
        return dataclasses.replace(snap, waiting=tuple(queue))

    def apply(step: Step) -> None:
        World.apply(world, step)
        for op in step.ops:
            task = getattr(op, "task", None)
            if task is not None:
                queue[:] = [t for t in queue if t.name != task]
                world.gpus[op.gpu] = dataclasses.replace(  # type: ignore[attr-defined]
                    world.gpus[op.gpu],  # type: ignore[attr-defined]
                    state=GpuState.RUNNING,
                    service="s",
                )

    world.snapshot = snapshot  # type: ignore[method-assign]
    world.apply = apply  # type: ignore[method-assign]
    run_event(loop(), Event(EventKind.JOB_FINISHED, "z"), world, RNG)
    kinds = [type(op).__name__ for op in world.ops()]
    # The task takes one inference GPU first; the job grows onto the other.
    assert kinds.index("StartReplica") < kinds.index("Lend")
    assert world.kinds[-1] is EventKind.TOP_UP
