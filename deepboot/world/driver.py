"""The one driver both worlds run through: one event queue, one clock, one rule per event.

SimPy runs a simulation and a real-time run on one event loop with two clocks; the
driver does the same for the control loop. It owns

* the event queue (:class:`~deepboot.world.queue.EventQueue`): every scheduled event
  (ticks, a replica's protect expiry, a task's completion, what the runtime's router,
  poller and store report) is on it, in time order;
* the clock: virtual time for the simulator (:class:`VirtualClock`, which jumps to
  the next event), wall time for the runtime (:class:`WallClock`, which sleeps until
  the next event is due or an event source wakes it);
* the staleness rule: a replica's own timer (PROTECT_EXPIRED, REPLICA_WARM) matters
  only while its GPU is still at the version and in the state the timer was set for;
* what each kind of event does: a world records its facts (:meth:`World.record`);
  a submission changes nothing before the next tick; every other event is a step of
  the control loop (``run_event``, which alone makes ``RETRY`` continuations), timed
  with the decision timer; a tick schedules the next one on its grid.

The loop itself never reads a clock: the driver hands it ``snapshot.now`` through the
world. A world keeps no loop of its own.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Protocol

import numpy as np

from deepboot.core.errors import SimulationStalledError
from deepboot.core.gpu import GpuState
from deepboot.scheduler.control import Backend, ControlLoop, Observer, run_event
from deepboot.scheduler.events import Event, EventKind
from deepboot.world.gpus import GpuBoard
from deepboot.world.queue import EventQueue

REPLICA_TIMERS: Mapping[EventKind, GpuState] = MappingProxyType(
    {EventKind.PROTECT_EXPIRED: GpuState.PROTECT, EventKind.REPLICA_WARM: GpuState.RUNNING}
)
"""Events a replica's own timer schedules, and the state its GPU must still be in (at
the version the event carries) for the event to matter."""


def is_stale(board: GpuBoard, event: Event) -> bool:
    """Whether ``event``, a replica's own timer, no longer matters: its GPU changed
    since the timer was set (reused, joined by a task, evicted). False for any other
    kind of event."""
    state = REPLICA_TIMERS.get(event.kind)
    if state is None:
        return False
    assert event.gpu is not None
    gpu = board.get(event.gpu)
    return gpu.version != event.seq or gpu.state is not state


class Clock(Protocol):
    """The time a world's driver runs in."""

    def now(self) -> float:
        """The current time, seconds."""
        ...

    def reach(self, t: float) -> bool:
        """Whether an event at ``t`` is due: virtual time jumps to ``t`` (always due);
        wall time is due once ``t`` has passed."""
        ...

    def wait_until(self, t: float) -> None:
        """Return at ``t`` (or earlier, when an event source posts something)."""
        ...


class VirtualClock:
    """Simulated time: it stands still until the driver moves it to the next event."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def reach(self, t: float) -> bool:
        if t > self.t:
            self.t = t
        return True

    def wait_until(self, t: float) -> None:
        self.reach(t)


class WallClock:
    """Real time (``source``, ``time.time`` by default), waiting on ``wake``: an event
    source (the router's thread, an HTTP submission) sets it to cut a wait short.

    Args:
        source: The clock read (injected for tests).
        wake: The event sources' signal.
        longest_wait: The most seconds one wait lasts, whatever is due (so that the
            sources that are polled, not signalled, are polled at least this often).
    """

    def __init__(
        self,
        source: Callable[[], float] = time.time,
        wake: threading.Event | None = None,
        longest_wait: float = 1.0,
    ) -> None:
        self.source = source
        self.wake = wake if wake is not None else threading.Event()
        self.longest_wait = longest_wait

    def now(self) -> float:
        return self.source()

    def reach(self, t: float) -> bool:
        return t <= self.source()

    def wait_until(self, t: float) -> None:
        wait = min(max(t - self.source(), 0.0), self.longest_wait)
        if wait > 0.0:
            self.wake.wait(wait)
        self.wake.clear()


class World(Backend, Protocol):
    """What the driver needs of a world, beyond the loop's ``Backend``."""

    def record(self, now: float, event: Event) -> bool:
        """Record what ``event`` says happened, at ``now``; False when it is moot
        (the driver then does nothing more with it)."""
        ...

    def after_tick(self, now: float) -> float | None:
        """After a tick's round: when the next tick is (on the grid), or None."""
        ...

    def after_event(self, now: float, event: Event) -> None:
        """After ``event`` was handled completely (metrics, debug hooks)."""
        ...


class Driver:
    """Runs a world's events through the control loop, in time order.

    Args:
        loop: The control loop.
        world: The world (simulator or runtime).
        rng: The run's generator (the loop's only randomness).
        clock: Virtual or wall time.
        timer: The decision timer (a monotonic clock; the loop reads none).
        on_rejected: The error boundary of a world that must keep running (the
            runtime): a decision that raises is handed to it with its event, and the
            driver goes on with the next event. None (the simulator): it propagates.
        observe: Told of every step of the loop (a recording: ``world.recording``).

    Attributes:
        queue: Every scheduled event.
        rounds: Training rounds decided.
        decision_ms: Their decisions' latencies, milliseconds, in order.
    """

    def __init__(
        self,
        loop: ControlLoop,
        world: World,
        rng: np.random.Generator,
        clock: Clock,
        timer: Callable[[], float] = time.perf_counter,
        on_rejected: Callable[[Event, Exception], None] | None = None,
        observe: Observer | None = None,
    ) -> None:
        self.on_rejected = on_rejected
        self.observe = observe
        self.loop = loop
        self.world = world
        self.rng = rng
        self.clock = clock
        self.timer = timer
        self.queue = EventQueue()
        self.rounds = 0
        self.decision_ms: list[float] = []

    def post(self, event: Event, at: float | None = None) -> None:
        """Schedule ``event`` at ``at`` (None: now)."""
        self.queue.push(self.clock.now() if at is None else at, event)

    def decide(self, event: Event) -> None:
        """One step of the loop for ``event`` (and its retry continuations), applied;
        within the error boundary when there is one (a step the world refused half
        way stays half applied: the world's own checks run before it changes
        anything it cannot take back)."""
        if self.on_rejected is None:
            self._decide(event)
            return
        try:
            self._decide(event)
        except Exception as exc:  # the boundary: one event's failure ends nothing
            self.on_rejected(event, exc)

    def _decide(self, event: Event) -> None:
        spent = run_event(self.loop, event, self.world, self.rng, self.timer, self.observe)
        if spent is not None:
            self.rounds += 1
            self.decision_ms.append(spent * 1e3)

    def handle(self, now: float, event: Event) -> bool:
        """Everything ``event`` means at ``now``; False when it was moot."""
        world = self.world
        if not world.record(now, event):
            return False
        kind = event.kind
        if kind is EventKind.TICK:
            self.decide(event)
            after = world.after_tick(now)
            if after is not None:
                if not after > now:
                    raise SimulationStalledError(
                        f"the clock cannot advance past {now:g} s to the next tick at "
                        f"{after:g} s (times this large lose sub-interval precision)"
                    )
                self.queue.push(after, Event(EventKind.TICK))
        elif kind is not EventKind.JOB_SUBMITTED or self.loop.settings.event_lending:
            # A submission changes nothing before the next tick, unless the loop
            # decides at every event (the new job may take GPUs free now).
            self.decide(event)
        world.after_event(now, event)
        return True

    def run_due(self, until: float = math.inf) -> int:
        """Handle, in order, every event due by the clock and at or before ``until``
        (virtual time: every one up to ``until``, the clock following them); returns
        how many were popped."""
        queue, reach, handle = self.queue, self.clock.reach, self.handle
        n = 0
        while queue:
            at = queue.peek_time()
            if at > until or not reach(at):
                break
            now, event = queue.pop()
            handle(now, event)
            n += 1
        return n
