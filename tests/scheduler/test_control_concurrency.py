"""The control loop with replicas that serve several tasks at once (``concurrency``):
hand-made snapshots whose ``replicas`` say what each RUNNING replica serves."""

from __future__ import annotations

import dataclasses

import pytest
from test_control import NOW, RNG, arrive, gpus, loop, snap

from deepboot.core import ServiceSpec
from deepboot.scheduler import Event, EventKind
from deepboot.scheduler.control import ReplicaLoad, Retry, Step
from deepboot.scheduler.operations import ProtectReplica, StartReplica, Unplaced, WaitReason


def specs(concurrency: int, cap: int = 0) -> dict[str, ServiceSpec]:
    return {
        "s1": ServiceSpec("s1", "m", concurrency=concurrency, max_replicas=cap),
        "s2": ServiceSpec("s2", "m", concurrency=concurrency),
    }


LOADED = ReplicaLoad(1, NOW - 5.0)
LOADING = ReplicaLoad(1, NOW + 5.0)


@pytest.mark.parametrize(
    ("layout", "replicas", "concurrency", "cap", "expect"),
    [
        # a loaded replica with a free slot is joined (no cold start, hits kept)
        (("F", "R:s1/2 F"), {(1, 0): LOADED}, 2, 0, StartReplica((1, 0), "s1", "t1", False, 2)),
        # ... whatever max_replicas: no new replica starts
        (("F", "R:s1 F"), {(1, 0): LOADED}, 2, 1, StartReplica((1, 0), "s1", "t1", False, 0)),
        # ... the fewest tasks in flight first, then GPU order
        (("F", "R:s1 R:s1 R:s1"),
         {(1, 0): ReplicaLoad(2, NOW - 1), (1, 1): LOADED, (1, 2): LOADED}, 3, 0,
         StartReplica((1, 1), "s1", "t1", False, 0)),
        # ... before a PROTECT replica is woken
        (("F", "P:s1/1 R:s1"), {(1, 1): LOADED}, 2, 0, StartReplica((1, 1), "s1", "t1", False, 0)),
        # a full replica: the policy as usual (a cold start on the FREE GPU)
        (("F", "R:s1 F"), {(1, 0): ReplicaLoad(2, NOW - 5)}, 2, 0,
         StartReplica((1, 1), "s1", "t1", True, 0)),
        # concurrency 1: a RUNNING replica is never joined
        (("F", "R:s1 F"), {}, 1, 0, StartReplica((1, 1), "s1", "t1", True, 0)),
        # another service's replica is never joined
        (("F", "R:s2 F"), {(1, 0): LOADED}, 2, 0, StartReplica((1, 1), "s1", "t1", True, 0)),
        # a loading replica: a warm PROTECT replica first ...
        (("F", "R:s1 P:s1"), {(1, 0): LOADING}, 2, 0, StartReplica((1, 1), "s1", "t1", False, 1)),
        # ... but its slot before a new cold start
        (("F", "R:s1 F"), {(1, 0): LOADING}, 2, 0, StartReplica((1, 0), "s1", "t1", False, 0)),
        # ... the one ready first
        (("F", "R:s1 R:s1"), {(1, 0): ReplicaLoad(1, NOW + 9), (1, 1): LOADING}, 2, 0,
         StartReplica((1, 1), "s1", "t1", False, 0)),
        # ... and its slot even at the replica cap
        (("F", "R:s1 F"), {(1, 0): LOADING}, 2, 1, StartReplica((1, 0), "s1", "t1", False, 0)),
        # full and at the cap: the task waits
        (("F", "R:s1 F"), {(1, 0): ReplicaLoad(2, NOW)}, 2, 1, None),
    ],
    ids=["join", "join-at-cap", "fewest-in-flight", "before-protect", "full", "concurrency-1",
         "other-service", "loading-after-warm", "loading-before-cold", "ready-first",
         "loading-at-cap", "full-at-cap"],
)  # fmt: skip
def test_an_arrival_joins_a_replica_with_a_free_slot(
    layout: tuple[str, ...],
    replicas: dict[tuple[int, int], ReplicaLoad],
    concurrency: int,
    cap: int,
    expect: StartReplica | None,
) -> None:
    cluster, views = gpus(*layout)
    s = dataclasses.replace(
        snap(cluster, views), services=specs(concurrency, cap), replicas=replicas
    )
    step = loop(lending=False).step(arrive(), s, RNG)
    if expect is None:
        assert step == Step(unplaced=(Unplaced("t1", WaitReason.NO_IDLE_GPU, inference=True),))
    else:
        assert step.ops == (expect,)


@pytest.mark.parametrize(
    ("replicas", "ops"),
    [
        ({(1, 0): ReplicaLoad(1, NOW - 9)}, ()),  # still serves one: stays RUNNING
        ({}, (ProtectReplica((1, 0), NOW + 30.0),)),  # serves nothing more: PROTECT
    ],
    ids=["still-serving", "idle"],
)
def test_a_finished_task_protects_its_replica_only_once_it_serves_nothing(
    replicas: dict[tuple[int, int], ReplicaLoad], ops: tuple[ProtectReplica, ...]
) -> None:
    cluster, views = gpus("F", "R:s1")
    done = Event(EventKind.INFERENCE_DONE, "t0", gpu=(1, 0))
    s = dataclasses.replace(
        snap(cluster, views, waiting="t1:s1"), services=specs(2), replicas=replicas
    )
    assert loop().step(done, s, RNG) == Step(ops=ops, retry=Retry())


def test_a_retry_fills_a_freed_slot_with_the_oldest_task() -> None:
    cluster, views = gpus("F", "R:s1")
    s = dataclasses.replace(
        snap(cluster, views, waiting="t1:s1 t2:s1"),
        services=specs(2),
        replicas={(1, 0): LOADED},
    )
    step = loop(lending=False).step(Event(EventKind.RETRY), s, RNG, Retry())
    assert step.ops == (StartReplica((1, 0), "s1", "t1", False, 0),)
    assert step.retry == Retry(0, frozenset())
