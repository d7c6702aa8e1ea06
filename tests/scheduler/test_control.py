"""The control loop driven directly: hand-made events and snapshots, no simulator.

One test per kind of step, covering every operation (Start, Resize, Preempt, Bind,
Lend, Release, Reclaim, StartReplica, ProtectReplica, SleepReplica, EvictReplica) and
the reasons a job or a task is left waiting; then the driver ``run_event`` against a
small in-memory backend.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import pytest
from test_scheduler import FixedAllocation

from deepboot.core import (
    BatchLimits,
    ClusterSpec,
    GpuState,
    GpuView,
    GradParams,
    JobView,
    Node,
    PerfParams,
    Placement,
    Pool,
    ServiceSpec,
)
from deepboot.policies.inference import AtsIPolicy
from deepboot.policies.lifecycle import LifecycleConfig
from deepboot.scheduler import (
    Event,
    EventKind,
    InferenceScheduler,
    Preempt,
    Resize,
    Scheduler,
    Start,
)
from deepboot.scheduler.control import (
    ControlLoop,
    LoopSettings,
    PendingTask,
    Retry,
    Snapshot,
    Step,
    run_event,
)
from deepboot.scheduler.operations import (
    Bind,
    EvictReplica,
    Lend,
    ProtectReplica,
    Reclaim,
    Release,
    SleepReplica,
    StartReplica,
    Unplaced,
    WaitReason,
)

LIMITS = BatchLimits(init_batch_size=128, max_batch_size=4096, min_local_bsz=32, max_local_bsz=1024)
PERF = PerfParams(0.0175, 0.0007, 0.13, 0.0011, 0.029, 0.00035, 2.0)
GRAD = GradParams(sqr=0.1, var=4.0)
RNG = np.random.default_rng(0)
NOW = 1000.0


def job(name: str, nodes: tuple[int, ...] = (), submit: float = 0.0, **kw: object) -> JobView:
    fields: dict[str, object] = dict(
        name=name,
        application="cifar10",
        submit_time=submit,
        attained_service=0.0,
        num_restarts=0,
        placement=Placement.of(nodes),
        min_replicas=0,
        max_replicas=64,
        limits=LIMITS,
        perf_params=PERF,
        grad_params=GRAD,
    )
    fields.update(kw)
    return JobView(**fields)  # type: ignore[arg-type]


def gpus(*nodes: str, training_nodes: int = 1) -> tuple[ClusterSpec, tuple[GpuView, ...]]:
    """Nodes as strings of GPU tokens: F, T:job, L:job, R:svc, P:svc/hits, S:svc."""
    states = {"F": GpuState.FREE, "T": GpuState.TRAINING, "L": GpuState.LENT}
    states |= {"R": GpuState.RUNNING, "P": GpuState.PROTECT, "S": GpuState.SLEEP}
    spec, out = [], []
    for n, text in enumerate(nodes):
        pool = Pool.TRAINING if n < training_nodes else Pool.INFERENCE
        tokens = text.split()
        spec.append(Node(n, len(tokens), pool))
        for i, tok in enumerate(tokens):
            code, _, rest = tok.partition(":")
            state = states[code]
            if state in (GpuState.TRAINING, GpuState.LENT):
                out.append(GpuView(n, i, pool, state, job=rest))
            elif state is GpuState.FREE:
                out.append(GpuView(n, i, pool, state))
            else:
                service, _, hits = rest.partition("/")
                until = NOW + 30 if state is GpuState.PROTECT else None
                out.append(GpuView(n, i, pool, state, service, int(hits or 0), None, until))
    return ClusterSpec(tuple(spec)), tuple(out)


def loop(alloc: Mapping[str, tuple[int, ...]] | None = None, **settings: object) -> ControlLoop:
    return ControlLoop(
        Scheduler(FixedAllocation(alloc or {})),
        InferenceScheduler(AtsIPolicy()),
        LoopSettings(**settings),  # type: ignore[arg-type]
    )


def snap(
    cluster: ClusterSpec, views: tuple[GpuView, ...], *jobs: JobView, waiting: str = ""
) -> Snapshot:
    """``waiting`` as "task:service task:service ..."."""
    queue = tuple(PendingTask(*t.split(":")) for t in waiting.split())
    return Snapshot(NOW, cluster, tuple(jobs), views, queue)


# -- training rounds -------------------------------------------------------------------


def test_a_round_binds_lends_resizes_and_starts() -> None:
    cluster, views = gpus("T:a F", "S:s1 F")
    step = loop({"a": (0, 1), "b": (0,)}).step(
        Event(EventKind.TICK), snap(cluster, views, job("a", (0,)), job("b", submit=1.0)), RNG
    )
    # The lent GPU is the FREE one; the SLEEP replica stays.
    assert step.ops == (
        Lend((1, 1), "a"),
        Bind((0, 1), "b"),
        Resize("a", Placement.of((0,)), Placement.of((0, 1))),
        Start("b", Placement.of((0,))),
    )
    assert step.round and step.unplaced == () and step.retry is None


def test_a_round_releases_before_it_takes_and_evicts_what_it_lends() -> None:
    cluster, views = gpus("T:a F", "S:s1 L:a")
    jobs = (job("a", (0, 1)), job("b", submit=1.0))
    step = loop({"b": (1, 1)}).step(Event(EventKind.TICK), snap(cluster, views, *jobs), RNG)
    assert step.ops == (
        Release((0, 0), "a"),
        Release((1, 1), "a"),
        Lend((1, 1), "b"),  # FREE first ...
        EvictReplica((1, 0)),  # ... then the SLEEP replica, evicted
        Lend((1, 0), "b"),
        Preempt("a", Placement.of((0, 1))),
        Start("b", Placement.of((1, 1))),
    )
    assert step.unplaced == (Unplaced("a", WaitReason.NOT_SELECTED),)


def test_the_capacity_leaves_out_busy_replicas_and_respects_lending() -> None:
    cluster, views = gpus("T:a F", "R:s1 P:s2 S:s3 F L:a")
    s = snap(cluster, views, job("a", (0, 1)))
    assert dict(loop().capacity(s)) == {0: 2, 1: 3}
    assert dict(loop(lending=False).capacity(s)) == {0: 2, 1: 0}


def test_a_job_larger_than_the_cluster_waits_for_insufficient_capacity() -> None:
    cluster, views = gpus("F F", "F F")
    jobs = (job("big", target_num_replicas=8), job("small", submit=1.0))
    step = loop({}).step(Event(EventKind.TICK), snap(cluster, views, *jobs), RNG)
    assert step.unplaced == (
        Unplaced("big", WaitReason.INSUFFICIENT_CAPACITY),
        Unplaced("small", WaitReason.NOT_SELECTED),
    )


def test_a_tick_without_jobs_runs_no_round_but_retries_the_queue() -> None:
    cluster, views = gpus("F", "F")
    step = loop().step(Event(EventKind.TICK), snap(cluster, views, waiting="t1:s1"), RNG)
    assert step == Step(retry=Retry())


def test_a_dead_worker_is_a_round_the_policy_sizes_its_job_at_once() -> None:
    # "a" held (0,0) and (0,1); the worker on (0,1) died and the world freed its GPU.
    cluster, views = gpus("T:a F", "F")
    step = loop({"a": (0, 0)}).step(
        Event(EventKind.WORKER_LOST, "a"), snap(cluster, views, job("a", (0,))), RNG
    )
    assert step.round
    assert step.ops == (Bind((0, 1), "a"), Resize("a", Placement.of((0,)), Placement.of((0, 0))))


@pytest.mark.parametrize("kind", [EventKind.JOB_FINISHED, EventKind.REPLICA_LOST])
def test_other_freed_gpus_only_retry_the_queue(kind: EventKind) -> None:
    cluster, views = gpus("T:a F", "F")
    step = loop({"a": (0, 0)}).step(Event(kind, "a"), snap(cluster, views, job("a", (0,))), RNG)
    assert step == Step()


# -- inference -------------------------------------------------------------------------


def arrive(task: str = "t1", service: str = "s1") -> Event:
    return Event(EventKind.INFERENCE_ARRIVAL, task, service=service)


def test_an_arrival_reclaims_the_lent_gpu_and_shrinks_its_job() -> None:
    cluster, views = gpus("T:a T:a", "R:s2 L:a")
    step = loop().step(arrive(), snap(cluster, views, job("a", (0, 0, 1))), RNG)
    assert step.ops == (
        Reclaim((1, 1), "a"),
        Resize("a", Placement.of((0, 0, 1)), Placement.of((0, 0))),
        StartReplica((1, 1), "s1", "t1", cold=True, hits=0),
    )


def test_a_warm_reuse_from_protect_counts_a_hit() -> None:
    cluster, views = gpus("F", "P:s1/2 S:s1")
    step = loop().step(arrive(), snap(cluster, views), RNG)
    assert step.ops == (StartReplica((1, 0), "s1", "t1", cold=False, hits=3),)


def test_a_cold_start_may_evict_another_services_sleeping_replica() -> None:
    cluster, views = gpus("T:a T:a", "R:s2 S:s3")
    step = loop().step(arrive(), snap(cluster, views, job("a", (0, 0))), RNG)
    assert step.ops == (EvictReplica((1, 1)), StartReplica((1, 1), "s1", "t1", True, 0))


def test_an_arrival_with_no_idle_gpu_waits() -> None:
    cluster, views = gpus("T:a", "R:s2 L:a")
    step = loop(lending=False).step(arrive(), snap(cluster, views, job("a", (0,))), RNG)
    assert step == Step(unplaced=(Unplaced("t1", WaitReason.NO_IDLE_GPU, inference=True),))


def capped(cap: int, **services: int) -> dict[str, ServiceSpec]:
    """Specs of s1 (capped at ``cap``) and of each ``name=cap`` given."""
    caps = {"s1": cap, **services}
    return {name: ServiceSpec(name, "bert", max_replicas=n) for name, n in caps.items()}


def test_a_service_at_its_replica_cap_gets_no_new_replica() -> None:
    cluster, views = gpus("F", "R:s1 R:s1 F S:s2")
    s = dataclasses.replace(snap(cluster, views), services=capped(2))
    step = loop().step(arrive(), s, RNG)
    assert step == Step(unplaced=(Unplaced("t1", WaitReason.NO_IDLE_GPU, inference=True),))
    # Below the cap (or uncapped, or unknown to the snapshot), the FREE GPU is used.
    cold = StartReplica((1, 2), "s1", "t1", cold=True, hits=0)
    for services in (capped(3), capped(0), {}):
        s = dataclasses.replace(snap(cluster, views), services=services)
        assert loop().step(arrive(), s, RNG).ops == (cold,)
    # The cap is per service: another service still cold-starts.
    s = dataclasses.replace(snap(cluster, views), services=capped(2, s3=1))
    assert loop().step(arrive("t2", "s3"), s, RNG).ops == (
        StartReplica((1, 2), "s3", "t2", cold=True, hits=0),
    )


def test_a_service_at_its_replica_cap_still_reuses_an_idle_replica() -> None:
    cluster, views = gpus("F", "R:s1 P:s1/1 F")
    s = dataclasses.replace(snap(cluster, views), services=capped(2))
    assert loop().step(arrive(), s, RNG).ops == (StartReplica((1, 1), "s1", "t1", False, 2),)
    cluster, views = gpus("F", "R:s1 S:s1 F")
    s = dataclasses.replace(snap(cluster, views), services=capped(2))
    assert loop().step(arrive(), s, RNG).ops == (StartReplica((1, 1), "s1", "t1", False, 0),)


def test_a_retry_leaves_a_capped_service_waiting_and_places_the_others() -> None:
    cluster, views = gpus("T:a", "R:s1 F")
    s = dataclasses.replace(
        snap(cluster, views, job("a", (0,)), waiting="t1:s1 t2:s1 t3:s2"), services=capped(1)
    )
    step = loop(lending=False).step(Event(EventKind.RETRY), s, RNG, Retry())
    assert step.ops == (StartReplica((1, 1), "s2", "t3", True, 0),)
    assert step.unplaced == (
        Unplaced("t1", WaitReason.NO_IDLE_GPU, True),
        Unplaced("t2", WaitReason.BEHIND_SAME_SERVICE, True),
    )


def test_a_finished_task_protects_its_replica_then_retries() -> None:
    cluster, views = gpus("F", "R:s1/2")
    done = Event(EventKind.INFERENCE_DONE, "t0", gpu=(1, 0))
    step = loop().step(done, snap(cluster, views, waiting="t1:s2"), RNG)
    # Protect time min(30 + 2 * 15, 120) = 60 s.
    assert step == Step(ops=(ProtectReplica((1, 0), NOW + 60.0),), retry=Retry())
    off = loop(lifecycle=LifecycleConfig(enabled=False)).step(done, snap(cluster, views), RNG)
    assert off.ops == (ProtectReplica((1, 0), NOW), SleepReplica((1, 0)))


def test_an_expired_protect_time_puts_the_replica_to_sleep() -> None:
    cluster, views = gpus("F", "P:s1 R:s2")
    expired = Event(EventKind.PROTECT_EXPIRED, gpu=(1, 0))
    assert loop().step(expired, snap(cluster, views), RNG).ops == (SleepReplica((1, 0)),)
    reused = Event(EventKind.PROTECT_EXPIRED, gpu=(1, 1))
    assert loop().step(reused, snap(cluster, views), RNG) == Step()


def test_a_retry_places_one_task_per_step_and_skips_a_blocked_service() -> None:
    cluster, views = gpus("T:a", "F R:s3")
    s = snap(cluster, views, job("a", (0,)), waiting="t1:s1 t2:s1 t3:s2")
    first = loop(lending=False).step(Event(EventKind.RETRY), s, RNG, Retry())
    assert first.ops == (StartReplica((1, 0), "s1", "t1", True, 0),)
    assert first.retry == Retry(0, frozenset())
    # The world applied it: t1 left the queue, its GPU runs.
    views2 = tuple(
        dataclasses.replace(g, state=GpuState.RUNNING, service="s1") if g.gpu_id == (1, 0) else g
        for g in views
    )
    s2 = snap(cluster, views2, job("a", (0,)), waiting="t2:s1 t4:s1 t3:s2")
    second = loop(lending=False).step(Event(EventKind.RETRY), s2, RNG, first.retry)
    assert second == Step(
        unplaced=(
            Unplaced("t2", WaitReason.NO_IDLE_GPU, True),
            Unplaced("t4", WaitReason.BEHIND_SAME_SERVICE, True),
            Unplaced("t3", WaitReason.NO_IDLE_GPU, True),
        )
    )


def test_a_step_never_mutates_its_snapshot() -> None:
    cluster, views = gpus("T:a T:a", "R:s2 L:a")
    s = snap(cluster, views, job("a", (0, 0, 1)), waiting="t9:s1")
    before = repr(s)
    loop().step(arrive(), s, RNG)
    assert repr(s) == before


# -- the driver ------------------------------------------------------------------------


class Board:
    """A minimal world: GPU views and a task queue, changed only by ``apply``."""

    def __init__(self, cluster: ClusterSpec, views: tuple[GpuView, ...], waiting: str) -> None:
        self.cluster = cluster
        self.gpus = {g.gpu_id: g for g in views}
        self.queue = [PendingTask(*t.split(":")) for t in waiting.split()]
        self.steps: list[Step] = []

    def snapshot(self, event: Event) -> Snapshot:
        gpus = tuple(self.gpus[k] for k in sorted(self.gpus))
        return Snapshot(NOW, self.cluster, (), gpus, tuple(self.queue))

    def apply(self, step: Step) -> None:
        self.steps.append(step)
        for op in step.ops:
            assert isinstance(op, StartReplica)
            g = self.gpus[op.gpu]
            self.gpus[op.gpu] = dataclasses.replace(g, state=GpuState.RUNNING, service=op.service)
            self.queue = [t for t in self.queue if t.name != op.task]


@pytest.mark.parametrize(("free", "placed"), [(2, ["t1", "t2"]), (0, [])], ids=["room", "full"])
def test_run_event_drives_a_retry_pass_to_its_end(free: int, placed: list[str]) -> None:
    cluster, views = gpus("R:x R:x", " ".join(["F"] * free + ["R:x"] * (2 - free)))
    world = Board(cluster, views, "t1:s1 t2:s1")
    spent = run_event(loop(), Event(EventKind.JOB_FINISHED, "j"), world, RNG, lambda: 0.0)
    assert spent is None  # no training round ran
    started = [op.task for s in world.steps for op in s.ops if isinstance(op, StartReplica)]
    assert started == placed
    assert [t.name for t in world.queue] == [t for t in ("t1", "t2") if t not in placed]
    assert world.steps[-1].retry is None
