"""The crash-point matrix, in-process (fake actors, a real SQLite store): for every named
point of ``runtime.faults``, a controller dies there (its in-memory state is dropped;
the store keeps what was flushed; the actors live on, as detached Ray actors do), a
new controller recovers, and the control loop (FIFO, real decisions) runs the jobs to
their end. Checked throughout: no job lost, no finished job run again, never two live
members of a generation on one GPU, no warm replica killed by recovery."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from deepboot.core.cluster import ClusterSpec, Node, Pool
from deepboot.core.placement import Placement
from deepboot.core.service import ServiceSpec
from deepboot.runtime.actors.replica_actor import is_standby_name
from deepboot.runtime.client.jobspec import JobSpec
from deepboot.runtime.controller.controller_settings import ControllerSettings
from deepboot.runtime.controller.faults import point_names
from deepboot.runtime.controller.wiring import Controller
from deepboot.runtime.store.jobstore import JobState, JobStore, LogKind
from deepboot.runtime.store.statedir import StateDir
from deepboot.scheduler.control import Step
from deepboot.scheduler.decision import Resize
from deepboot.scheduler.operations import (
    EvictReplica,
    ProtectReplica,
    Reclaim,
    SleepReplica,
    StartReplica,
)
from deepboot.world.settings import SharedCluster
from tests.runtime.fake_actors import FakeActors
from tests.runtime.test_controller_inprocess import Clock, move, settle

CLUSTER = ClusterSpec((Node(0, 2, Pool.TRAINING), Node(1, 2, Pool.INFERENCE)))
WORK = 40  # steps each job needs (one per turn with a live member)


class Crashed(Exception):
    """The controller died at a crash point (in-process: its state is dropped)."""


def _crash(point: str) -> None:
    raise Crashed(point)


def controller(
    state: Path,
    fake: FakeActors,
    clock: Clock,
    crash_at: str = "",
    afe: bool = True,
    host_cache_gb: float = 0.0,
    standby: bool = False,
) -> Controller:
    shared = SharedCluster(afe=afe, host_cache_gb=host_cache_gb)
    settings = ControllerSettings(
        policy="fifo", interval=2.0, shared=shared, crash_at=crash_at, standby_replicas=standby
    )
    sd = StateDir.at(state).ensure()
    return Controller(sd, settings, CLUSTER, fake, clock=clock, crash=_crash)


def submit(ctl: Controller, name: str, workers: int = 2) -> None:
    ctl.store.submit(JobSpec(name, "m:f", max_workers=3, workers=workers))
    ctl.intake.iteration()
    ctl.driver.run_due()


def register(ctl: Controller) -> None:
    ctl.store.register_service(ServiceSpec("svc", "tiny", handler="m:load", cold_start_s=1.0))
    ctl.catalog.take_services()


# -- the scenarios: what runs up to the crash (explicit steps, then polls) -------------------


def start(ctl: Controller, fake: FakeActors) -> None:
    submit(ctl, "j")
    move(ctl, "j", ("0.0", "0.1"))
    settle(ctl)


def grow(ctl: Controller, fake: FakeActors) -> None:
    submit(ctl, "j")
    move(ctl, "j", ("0.0",))
    settle(ctl)
    move(ctl, "j", ("0.0", "0.1"))  # afe, or a restart without AFE
    settle(ctl)


def failure(ctl: Controller, fake: FakeActors) -> None:
    submit(ctl, "j")
    move(ctl, "j", ("0.0", "0.1"))
    settle(ctl)
    fake.die(fake.live("j")["0.1"])
    ctl.polling.poll(0.1)
    move(ctl, "j", ("0.0", "0.1"), round=True)  # the round puts a new worker on 0.1
    settle(ctl)


def preempt(ctl: Controller, fake: FakeActors) -> None:
    submit(ctl, "j")
    move(ctl, "j", ("0.0", "0.1"))
    settle(ctl)
    move(ctl, "j", ())
    settle(ctl)


def reclaim(ctl: Controller, fake: FakeActors) -> None:
    submit(ctl, "j")
    move(ctl, "j", ("0.0", "1.0"))
    settle(ctl)
    two, one = Placement.of((0, 1)), Placement.of((0,))
    ctl.backend.apply(Step(ops=(Reclaim((1, 0), "j"), Resize("j", two, one))))
    settle(ctl)


def finish(ctl: Controller, fake: FakeActors) -> None:
    submit(ctl, "j")
    move(ctl, "j", ("0.0", "0.1"))
    settle(ctl)
    fake.progress["j"] = WORK
    settle(ctl)


def replica(ctl: Controller, fake: FakeActors) -> None:
    """A cold start on 1.1, then the replica idles (PROTECT, SLEEP) and is evicted."""
    register(ctl)
    submit(ctl, "j")
    move(ctl, "j", ("0.0", "0.1"))
    settle(ctl)
    ctl.backend.apply(Step(ops=(StartReplica((1, 1), "svc", "r1", cold=True, hits=0),)))
    ctl.flush()
    ctl.backend.apply(Step(ops=(ProtectReplica((1, 1), ctl.clock() + 1.0),)))
    ctl.backend.apply(Step(ops=(SleepReplica((1, 1)),)))
    ctl.flush()
    ctl.backend.apply(Step(ops=(EvictReplica((1, 1)),)))
    ctl.flush()


def warm_replica_then_restart(ctl: Controller, fake: FakeActors) -> None:
    """A job formed and a replica asleep; then a new controller (which the recovery
    points crash)."""
    register(ctl)
    submit(ctl, "j")
    move(ctl, "j", ("0.0", "0.1"))
    settle(ctl)
    fake.die(fake.live("j")["0.1"])  # recovery will have a job to re-form
    ctl.backend.apply(Step(ops=(StartReplica((1, 1), "svc", "r1", cold=True, hits=0),)))
    ctl.backend.apply(Step(ops=(ProtectReplica((1, 1), ctl.clock() + 1.0),)))
    ctl.backend.apply(Step(ops=(SleepReplica((1, 1)),)))
    ctl.flush()
    raise Crashed("the first controller dies between turns")


def standby_replica(ctl: Controller, fake: FakeActors) -> None:
    """A job formed; a replica starts on GPU 1.1 as node 1's promoted standby
    (``--standby-replicas``)."""
    register(ctl)
    submit(ctl, "j")
    move(ctl, "j", ("0.0", "0.1"))
    settle(ctl)
    ctl.replicas.start_standbys()
    ctl.backend.apply(Step(ops=(StartReplica((1, 1), "svc", "r1", cold=True, hits=0),)))
    ctl.flush()


Scenario = Callable[[Controller, FakeActors], None]

SCENARIOS: dict[str, tuple[Scenario, bool]] = {
    # point: (what runs up to it, AFE on)
    "start.recorded": (start, True),
    "start.offered": (start, True),
    "start.joined": (start, True),
    "afe.recorded": (grow, True),
    "afe.offered": (grow, True),
    "afe.joined": (grow, True),
    "failure.recorded": (failure, True),
    "failure.offered": (failure, True),
    "failure.joined": (failure, True),
    "restart.stopped": (grow, False),
    "restart.recorded": (grow, False),
    "restart.offered": (grow, False),
    "restart.joined": (grow, False),
    "preempt.stopped": (preempt, True),
    "reclaim.applied": (reclaim, True),
    "finish.recorded": (finish, True),
    "cold.recorded": (replica, True),
    "evict.exported": (replica, True),
    "evict.killed": (replica, True),
    "standby.promoted": (standby_replica, True),
    "recovery.planned": (warm_replica_then_restart, True),
    "recovery.killed": (warm_replica_then_restart, True),
    "recovery.replicas": (warm_replica_then_restart, True),
}


def test_every_crash_point_has_a_scenario() -> None:
    assert set(SCENARIOS) == set(point_names())


# -- the run after the crash ----------------------------------------------------------------


def run_to_the_end(ctl: Controller, fake: FakeActors, clock: Clock, jobs: set[str]) -> None:
    """Turn the controller's loop (FIFO decides) until every job ended; check the
    invariants at every turn."""
    for _ in range(600):
        clock.t += 0.5
        fake.advance()
        ctl.turn(polled=True)
        per_gpu = fake.members_per_gpu()
        assert all(n <= 1 for n in per_gpu.values()), f"two live members on a GPU: {per_gpu}"
        assert sum(per_gpu.values()) <= CLUSTER.total_gpus
        rows = {r.name: r for r in ctl.store.jobs()}
        if all(rows[j].state.ended for j in jobs):
            return
    raise AssertionError(f"jobs never ended: {[(r.name, r.state) for r in ctl.store.jobs()]}")


@pytest.mark.parametrize("point", sorted(SCENARIOS))
def test_a_controller_killed_at_a_crash_point_loses_nothing(tmp_path: Path, point: str) -> None:
    scenario, afe = SCENARIOS[point]
    clock = Clock()
    # The replica's scenarios with the node-local model cache on (its replica
    # exports 1 kB at its eviction); the others as without it.
    gb = 1.0 if scenario is replica else 0.0
    standby = scenario is standby_replica
    fake = FakeActors(work={"j": WORK}, clock=clock, export_bytes=1000)
    state = tmp_path / "state"
    first = controller(
        state, fake, clock, crash_at=point, afe=afe, host_cache_gb=gb, standby=standby
    )
    first.caches.start()
    with pytest.raises(Crashed):
        scenario(first, fake)
    first.store.close()
    # Standbys aside: recovery kills every one that no row names (a promoted one
    # whose row was not flushed among them), checked below.
    replicas_before = {n for n in fake.replicas if not is_standby_name(n)}
    promoted = [n for n, _ in fake.promoted]
    if point.startswith("recovery."):
        second = controller(state, fake, clock, crash_at=point, afe=afe, host_cache_gb=gb)
        with pytest.raises(Crashed, match=point):
            second.start()
        second.store.close()
    store = JobStore(StateDir.at(state).db)
    finished_before = {r.name for r in store.jobs() if r.state is JobState.FINISHED}
    store.close()

    ctl = controller(state, fake, clock, afe=afe, host_cache_gb=gb, standby=standby)
    ctl.start()
    # No warm replica killed by recovery (one the scenario itself evicted is gone).
    assert replicas_before == {n for n in fake.replicas if not is_standby_name(n)}
    if point == "standby.promoted":
        assert promoted and promoted[0] in fake.killed, "a promoted standby no row names"
        assert ctl.board.get((1, 1)).replica is None
        assert ctl.replicas.standbys and set(ctl.replicas.standbys.values()) <= set(fake.replicas)
    run_to_the_end(ctl, fake, clock, {"j"})

    rows = {r.name: r for r in ctl.store.jobs()}
    assert rows["j"].state is JobState.FINISHED, rows["j"]
    log = ctl.store.events()
    ends = [e for e in log if e.job == "j" and e.kind is LogKind.FINISHED]
    assert len(ends) == 1, "the job finished twice"
    if "j" in finished_before:
        assert not [t for job, t in fake.created_at if job == "j" and t > ends[0].time]
    assert not fake.live("j"), "a finished job's worker lives on"
    assert not fake.reruns, f"workers started for work already done: {fake.reruns}"
