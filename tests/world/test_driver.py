"""The driver both worlds run through, with a hand-made world: event order, what each
kind of event does, ticks on their grid, the staleness rule, the two clocks, and the
runtime's error boundary."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest

from deepboot.core.cluster import ClusterSpec
from deepboot.core.errors import InvalidDecisionError
from deepboot.policies import registry
from deepboot.scheduler import operations as ops
from deepboot.scheduler.control import ControlLoop, Snapshot, Step
from deepboot.scheduler.events import Event, EventKind
from deepboot.scheduler.inference import InferenceScheduler
from deepboot.scheduler.loop import Scheduler
from deepboot.world.driver import Driver, VirtualClock, WallClock, is_stale
from deepboot.world.gpus import GpuBoard, apply_gpu_op

CLUSTER = ClusterSpec.parse("2x2", 1)
K = EventKind


@dataclass
class Recorder:
    """A world that records what the driver did, and snapshots an empty cluster."""

    interval: float = 10.0
    last_tick: float = 40.0
    board: GpuBoard = field(default_factory=lambda: GpuBoard(CLUSTER))
    seen: list[tuple[float, EventKind]] = field(default_factory=list)
    steps: list[EventKind] = field(default_factory=list)
    fail_on: EventKind | None = None
    now: float = 0.0

    def record(self, now: float, event: Event) -> bool:
        self.now = now
        if is_stale(self.board, event):
            return False
        self.seen.append((now, event.kind))
        return True

    def after_tick(self, now: float) -> float | None:
        nxt = now + self.interval
        return nxt if nxt <= self.last_tick else None

    def after_event(self, now: float, event: Event) -> None:
        pass

    def snapshot(self, event: Event) -> Snapshot:
        self.steps.append(event.kind)
        if event.kind is self.fail_on:
            raise InvalidDecisionError(f"refused at {event.kind.name}")
        return Snapshot(self.now, CLUSTER, (), self.board.views())

    def apply(self, step: Step) -> None:
        for op in step.ops:
            apply_gpu_op(self.board, op)


def driver(world: Recorder, clock: VirtualClock | WallClock | None = None) -> Driver:
    loop = ControlLoop(
        Scheduler(registry.create("fifo")),
        InferenceScheduler(registry.inference_create("ats-i")),
    )
    return Driver(loop, world, np.random.default_rng(0), clock or VirtualClock())


def test_events_run_in_time_then_kind_order_and_submissions_are_not_decided() -> None:
    world = Recorder()
    d = driver(world)
    d.post(Event(K.TICK), at=0.0)
    d.post(Event(K.JOB_SUBMITTED, "a"), at=5.0)
    d.post(Event(K.INFERENCE_ARRIVAL, "t", service="s"), at=5.0)
    d.post(Event(K.JOB_FINISHED, "b"), at=5.0)
    assert d.run_due() == 8  # and the ticks at 10, 20, 30, 40
    assert world.seen[:4] == [(0.0, K.TICK), (5.0, K.JOB_FINISHED), (5.0, K.JOB_SUBMITTED),
                              (5.0, K.INFERENCE_ARRIVAL)]  # fmt: skip
    assert [t for t, k in world.seen if k is K.TICK] == [0.0, 10.0, 20.0, 30.0, 40.0]
    assert K.JOB_SUBMITTED not in world.steps  # a submission waits for the next tick
    assert world.steps.count(K.TICK) == 5  # every tick stepped the loop
    assert d.clock.now() == 40.0


def test_run_due_stops_at_until_and_resumes() -> None:
    world = Recorder()
    d = driver(world)
    d.post(Event(K.TICK), at=0.0)
    d.run_due(until=15.0)
    assert [t for t, _ in world.seen] == [0.0, 10.0]
    d.run_due()
    assert [t for t, _ in world.seen] == [0.0, 10.0, 20.0, 30.0, 40.0]


def test_a_replica_timer_set_before_its_gpu_changed_is_moot() -> None:
    world = Recorder()
    d = driver(world)
    board, gpu = world.board, (1, 0)
    apply_gpu_op(board, ops.StartReplica(gpu, "s", "t", cold=True, hits=0))
    apply_gpu_op(board, ops.ProtectReplica(gpu, 30.0))
    stale = Event(K.PROTECT_EXPIRED, seq=board.get(gpu).version, gpu=gpu)
    apply_gpu_op(board, ops.StartReplica(gpu, "s", "u", cold=False, hits=1))  # reused
    apply_gpu_op(board, ops.ProtectReplica(gpu, 60.0))
    fresh = Event(K.PROTECT_EXPIRED, seq=board.get(gpu).version, gpu=gpu)
    d.post(stale, at=30.0)
    d.post(fresh, at=60.0)
    d.run_due()
    assert world.seen == [(60.0, K.PROTECT_EXPIRED)]


def test_an_error_in_a_decision_stops_the_simulator_but_not_a_world_with_a_boundary() -> None:
    world = Recorder(fail_on=K.INFERENCE_ARRIVAL)
    d = driver(world)
    d.post(Event(K.INFERENCE_ARRIVAL, "t", service="s"), at=1.0)
    with pytest.raises(InvalidDecisionError, match="refused"):
        d.run_due()
    rejected: list[tuple[EventKind, str]] = []
    world = Recorder(fail_on=K.INFERENCE_ARRIVAL)
    d = driver(world)
    d.on_rejected = lambda event, exc: rejected.append((event.kind, str(exc)))
    d.post(Event(K.INFERENCE_ARRIVAL, "t", service="s"), at=1.0)
    d.post(Event(K.TICK), at=2.0)
    d.run_due()
    assert rejected == [(K.INFERENCE_ARRIVAL, "refused at INFERENCE_ARRIVAL")]
    assert (2.0, K.TICK) in world.seen and K.TICK in world.steps  # it kept going


def test_the_wall_clock_waits_for_the_next_event_or_a_wake_up() -> None:
    world = Recorder()
    wake = threading.Event()
    d = driver(world, WallClock(time.monotonic, wake, longest_wait=3600.0))
    d.post(Event(K.JOB_FINISHED, "a"), at=time.monotonic() + 3600.0)
    assert d.run_due() == 0  # not due for an hour
    waiter = threading.Thread(target=d.clock.wait_until, args=(d.queue.peek_time(),))
    waiter.start()
    wake.set()  # a message from the router
    waiter.join(60.0)
    assert not waiter.is_alive()  # woken, long before the hour
    d.post(Event(K.JOB_FINISHED, "b"))  # now: due at once
    assert d.run_due() == 1 and world.seen[-1][1] is K.JOB_FINISHED
