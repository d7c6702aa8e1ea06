"""Pre-warming a replica (``WarmReplica``) in the control loop: hand-made snapshots.

The loop validates every ``WarmReplica`` of a step, answers ``REPLICA_WARM`` (a
pre-warmed replica is loaded) as it answers an emptied replica, and lets a task join
a pre-warmed replica still loading, whatever its service's concurrency. The simulator's
side is ``tests/sim/test_prewarm.py``, the runtime's ``tests/runtime/test_prewarm.py``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest
from test_control import NOW, RNG, arrive, gpus, job, loop, snap

from deepboot.core import GpuState, Placement, ServiceSpec
from deepboot.core.errors import InvalidDecisionError
from deepboot.core.gpu import TRANSITIONS
from deepboot.scheduler import Event, EventKind, Resize
from deepboot.scheduler.control import (
    ControlLoop,
    ReplicaLoad,
    Retry,
    Snapshot,
    Step,
    validate_warm_replicas,
)
from deepboot.scheduler.operations import (
    AnyOperation,
    Bind,
    EvictReplica,
    ProtectReplica,
    Reclaim,
    SleepReplica,
    StartReplica,
    WarmReplica,
)


def specs(concurrency: int = 1, cap: int = 0) -> dict[str, ServiceSpec]:
    return {
        "s1": ServiceSpec("s1", "m", concurrency=concurrency, max_replicas=cap),
        "s2": ServiceSpec("s2", "m"),
    }


LOADING = ReplicaLoad(0, NOW + 5.0)
"""A pre-warmed replica no task has joined, ready in 5 s."""


def world(*nodes: str, waiting: str = "", **fields: Any) -> Snapshot:
    cluster, views = gpus(*nodes)
    return dataclasses.replace(snap(cluster, views, waiting=waiting), **fields)


def ready(gpu: tuple[int, int] = (1, 0), until: float = NOW + 40.0) -> Event:
    return Event(EventKind.REPLICA_WARM, gpu=gpu, service="s1", until=until)


# -- the operation and its event --------------------------------------------------------


def test_the_new_operation_and_event_fit_the_existing_tables() -> None:
    # FREE -> RUNNING (the warm-up) and RUNNING -> PROTECT / RUNNING (ready, joined)
    # are the transitions a cold start already uses: nothing new in the table.
    assert GpuState.RUNNING in TRANSITIONS[GpuState.FREE]
    assert {GpuState.PROTECT, GpuState.RUNNING} <= TRANSITIONS[GpuState.RUNNING]
    # A replica ready at t is PROTECT after the tasks that ended at t freed their
    # GPUs, and before an arrival at t looks for a replica.
    kinds = [EventKind.INFERENCE_DONE, EventKind.REPLICA_WARM, EventKind.INFERENCE_ARRIVAL]
    assert sorted(kinds, key=lambda k: k.priority) == kinds
    assert Reclaim((1, 0), "a") == Reclaim((1, 0), "a", proactive=False)


# -- REPLICA_WARM ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "replicas", "event", "expect"),
    [
        # no task joined: PROTECT until the warm-up's until (not the lifecycle rule)
        ("R:s1", {}, ready(), Step(ops=(ProtectReplica((1, 0), NOW + 40.0),))),
        # the world may still report it with nothing in flight
        ("R:s1", {(1, 0): ReplicaLoad(0, NOW)}, ready(),
         Step(ops=(ProtectReplica((1, 0), NOW + 40.0),))),
        # until has passed (or is now): PROTECT ends at once, SLEEP
        ("R:s1", {}, ready(until=NOW - 10.0),
         Step(ops=(ProtectReplica((1, 0), NOW), SleepReplica((1, 0))))),
        ("R:s1", {}, ready(until=NOW),
         Step(ops=(ProtectReplica((1, 0), NOW), SleepReplica((1, 0))))),
        # a task joined it while it loaded: it serves, nothing to do
        ("R:s1", {(1, 0): ReplicaLoad(1, NOW)}, ready(), Step()),
        # stale: no longer RUNNING, or another service's replica since
        ("P:s1", {}, ready(), Step()),
        ("R:s2", {}, ready(), Step()),
    ],
    ids=["protect", "protect-reported-idle", "until-past", "until-now", "joined",
         "stale-state", "stale-service"],
)  # fmt: skip
def test_a_ready_prewarmed_replica_is_protected_unless_it_serves(
    layout: str, replicas: dict[tuple[int, int], ReplicaLoad], event: Event, expect: Step
) -> None:
    s = world("F", layout, services=specs(), replicas=replicas)
    assert loop().step(event, s, RNG) == expect


def test_a_protected_prewarmed_replica_retries_the_queue() -> None:
    s = world("F", "R:s1", waiting="t1:s1", services=specs())
    assert loop().step(ready(), s, RNG) == Step(
        ops=(ProtectReplica((1, 0), NOW + 40.0),), retry=Retry()
    )


# -- a task joins a pre-warmed replica that is still loading -----------------------------


@pytest.mark.parametrize(
    ("layout", "replicas", "concurrency", "cap", "expect"),
    [
        # concurrency 1 as well as more: join, no second cold start (hits stay 0)
        ("R:s1 F", {(1, 0): LOADING}, 1, 0, StartReplica((1, 0), "s1", "t1", False, 0)),
        ("R:s1 F", {(1, 0): LOADING}, 3, 0, StartReplica((1, 0), "s1", "t1", False, 0)),
        # ... even at the replica cap (it is loaded already)
        ("R:s1 F", {(1, 0): LOADING}, 1, 1, StartReplica((1, 0), "s1", "t1", False, 0)),
        # a warm PROTECT replica of the service is ready now: it goes first
        ("R:s1 P:s1", {(1, 0): LOADING}, 1, 0, StartReplica((1, 1), "s1", "t1", False, 1)),
        # a pre-warmed replica that took its one task is full: a cold start
        ("R:s1 F", {(1, 0): ReplicaLoad(1, NOW + 5.0)}, 1, 0,
         StartReplica((1, 1), "s1", "t1", True, 0)),
        # another service's pre-warmed replica is never joined
        ("R:s2 F", {(1, 0): LOADING}, 1, 0, StartReplica((1, 1), "s1", "t1", True, 0)),
    ],
    ids=["concurrency-1", "concurrency-3", "at-cap", "protect-first", "full", "other-service"],
)  # fmt: skip
def test_an_arrival_joins_a_prewarmed_replica_still_loading(
    layout: str,
    replicas: dict[tuple[int, int], ReplicaLoad],
    concurrency: int,
    cap: int,
    expect: StartReplica,
) -> None:
    s = world("F", layout, services=specs(concurrency, cap), replicas=replicas)
    assert loop(lending=False).step(arrive(), s, RNG).ops == (expect,)


# -- validation --------------------------------------------------------------------------

W = WarmReplica((1, 0), "s1", NOW + 60.0)


@pytest.mark.parametrize(
    ("layout", "ops", "cap"),
    [
        ("F F", (W,), 0),
        # another service's SLEEP replica is evicted just before
        ("S:s2 F", (EvictReplica((1, 0)), W), 0),
        # a LENT GPU is reclaimed (ahead of demand) just before
        ("L:a F", (Reclaim((1, 0), "a", proactive=True),
                   Resize("a", Placement.of((0, 1)), Placement.of((0,))), W), 0),
        # a cap of 2 with one replica loaded
        ("F R:s1", (W,), 2),
        # until in the past is allowed (SLEEP once ready)
        ("F F", (WarmReplica((1, 0), "s1", NOW - 5.0),), 0),
    ],
    ids=["free", "after-evict", "after-reclaim", "under-cap", "until-past"],
)  # fmt: skip
def test_a_legal_warm_replica_passes(layout: str, ops: tuple[AnyOperation, ...], cap: int) -> None:
    s = world("T:a F", layout, services=specs(cap=cap))
    validate_warm_replicas(ops, s.gpus, s.services)


@pytest.mark.parametrize(
    ("layout", "ops", "cap", "match"),
    [
        ("T:a F", (WarmReplica((0, 0), "s1", NOW),), 0, "training-pool"),
        ("T:a F", (WarmReplica((0, 1), "s1", NOW),), 0, "training-pool"),
        ("L:a F", (W,), 0, "LENT, not FREE"),
        ("S:s2 F", (W,), 0, "SLEEP, not FREE"),
        ("P:s1 F", (W,), 0, "PROTECT, not FREE"),
        ("R:s1 F", (W,), 0, "RUNNING, not FREE"),
        ("F F", (W, W), 0, "RUNNING, not FREE"),
        ("F F", (Bind((1, 0), "a"), W), 0, "TRAINING, not FREE"),
        ("F F", (WarmReplica((1, 9), "s1", NOW),), 0, "no such GPU"),
        ("F F", (WarmReplica((1, 0), "nope", NOW),), 0, "unknown service"),
        ("F F", (WarmReplica((1, 0), "s1", math.nan),), 0, "NaN"),
        # the cap counts loaded replicas, a loading one included ...
        ("F R:s1", (W,), 1, "1 replicas loaded or loading, its max_replicas is 1"),
        ("F P:s1", (W,), 1, "max_replicas is 1"),
        # ... and the step's own earlier warm-ups and cold starts
        ("F F", (W, WarmReplica((1, 1), "s1", NOW)), 1, "max_replicas is 1"),
        ("F F", (StartReplica((1, 1), "s1", "t", True, 0), W), 1, "max_replicas is 1"),
    ],
    ids=["training-gpu", "training-pool-free", "lent-without-reclaim", "sleep-without-evict",
         "protect", "running", "twice", "bound-before", "unknown-gpu", "unknown-service",
         "nan-until", "cap-running", "cap-protect", "cap-in-step", "cap-cold-in-step"],
)  # fmt: skip
def test_an_illegal_warm_replica_is_refused(
    layout: str, ops: tuple[AnyOperation, ...], cap: int, match: str
) -> None:
    s = world("T:a F", layout, services=specs(cap=cap))
    with pytest.raises(InvalidDecisionError, match=match):
        validate_warm_replicas(ops, s.gpus, s.services)


class Handwritten(ControlLoop):
    """A loop whose every step is ``ops`` (as a future pre-warming policy would add)."""

    def __init__(self, ops: tuple[AnyOperation, ...]) -> None:
        base = loop()
        super().__init__(base.training, base.inference, base.settings)
        self.ops = ops

    def _dispatch(
        self, event: Event, snap: Snapshot, rng: np.random.Generator, cursor: Retry | None
    ) -> Step:
        return Step(ops=self.ops)


def test_the_loop_validates_the_warm_replicas_of_every_step() -> None:
    s = world("T:a F", "L:a F", services=specs(), jobs=(job("a", (0, 1)),))
    tick = Event(EventKind.TICK)
    assert Handwritten((W,)).step(tick, world("F", "F F", services=specs()), RNG).ops == (W,)
    with pytest.raises(InvalidDecisionError, match="LENT, not FREE"):
        Handwritten((W,)).step(tick, s, RNG)
