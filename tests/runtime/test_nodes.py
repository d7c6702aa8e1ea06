"""A node that leaves the Ray cluster takes its GPUs out of the ledger until it returns,
in-process (fake actors, the real controller, FIFO deciding): of two jobs, the one on
the borrowed inference node loses its workers there and waits in the queue; no round
hands out a GPU of the missing node; once the node is back the job borrows it again
and both finish."""

from __future__ import annotations

from pathlib import Path

from deepboot.core.cluster import ClusterSpec, Node, Pool
from deepboot.core.gpu import GpuState
from deepboot.runtime.client.jobspec import JobSpec
from deepboot.runtime.controller.controller_settings import ControllerSettings
from deepboot.runtime.controller.wiring import Controller
from deepboot.runtime.store.jobstore import JobState, LogKind
from deepboot.runtime.store.statedir import StateDir
from tests.runtime.fake_actors import FakeActors
from tests.runtime.test_controller_inprocess import Clock, events

CLUSTER = ClusterSpec((Node(0, 2, Pool.TRAINING), Node(1, 2, Pool.INFERENCE)))


def _turns(ctl: Controller, fake: FakeActors, clock: Clock, n: int) -> None:
    for _ in range(n):
        clock.t += 0.5
        fake.advance()
        ctl.turn(polled=True)


def _states(ctl: Controller, node: int) -> list[GpuState]:
    return [g.state for g in ctl.board.gpus if g.node_id == node]


def test_a_lost_node_takes_its_gpus_out_until_it_returns(tmp_path: Path) -> None:
    clock = Clock()
    fake = FakeActors(work={"a": 400, "b": 400}, clock=clock, nodes={0, 1})
    settings = ControllerSettings(policy="fifo", interval=2.0, node_check=1.0)
    ctl = Controller(StateDir.at(tmp_path / "s").ensure(), settings, CLUSTER, fake, clock=clock)
    ctl.start()
    ctl.store.submit(JobSpec("a", "m:f", max_workers=2, workers=2))
    ctl.store.submit(JobSpec("b", "m:f", max_workers=2, workers=2))
    _turns(ctl, fake, clock, 10)
    assert sorted(fake.live("a")) == ["0.0", "0.1"]
    assert sorted(fake.live("b")) == ["1.0", "1.1"]  # borrowed

    fake.lose_node(1)
    created = len(fake.created)
    _turns(ctl, fake, clock, 40)  # many rounds: none may hand out a GPU of node 1
    assert _states(ctl, 1) == [GpuState.DOWN, GpuState.DOWN]
    assert len(fake.created) == created and not fake.live("b")
    assert ctl.store.job("b").state is JobState.QUEUED
    assert ctl.store.job("b").restarts == 1
    [left] = events(ctl, LogKind.NODE)
    assert left == {"node": 1, "op": "left", "gpus": ["1.0", "1.1"]}
    assert {e["worker"] for e in events(ctl, LogKind.WORKER_FAILED)} == {"1.0", "1.1"}
    assert sorted(fake.live("a")) == ["0.0", "0.1"]  # untouched

    fake.nodes = {0, 1}  # it came back (ray start with its resources again)
    _turns(ctl, fake, clock, 10)
    assert GpuState.DOWN not in _states(ctl, 1)
    assert sorted(fake.live("b")) == ["1.0", "1.1"]  # borrowed again
    assert [e["op"] for e in events(ctl, LogKind.NODE)] == ["left", "returned"]

    fake.progress.update(a=400, b=400)
    _turns(ctl, fake, clock, 10)
    assert {ctl.store.job(n).state for n in "ab"} == {JobState.FINISHED}


def test_a_cluster_that_cannot_tell_changes_nothing(tmp_path: Path) -> None:
    clock = Clock()
    fake = FakeActors(work={"j": 400}, clock=clock)  # live_nodes() -> None
    settings = ControllerSettings(interval=2.0, node_check=1.0)
    ctl = Controller(StateDir.at(tmp_path / "s").ensure(), settings, CLUSTER, fake, clock=clock)
    ctl.start()
    _turns(ctl, fake, clock, 10)
    assert ctl.board.counts()[GpuState.DOWN] == 0 and not events(ctl, LogKind.NODE)
