"""Messages from the router (the HTTP endpoint's thread) to the controller's loop.

Plain values and a thread-safe queue, with no HTTP library: the controller imports
them at start-up, the router (aiohttp) only when it serves.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Arrival:
    """Request ``task`` of ``service`` found no replica with a free slot."""

    task: str
    service: str


@dataclass(frozen=True, slots=True)
class Withdraw:
    """Request ``task`` no longer needs a new replica (a slot freed, or it timed out)."""

    task: str


@dataclass(frozen=True, slots=True)
class Idle:
    """The replica on ``gpu`` has nothing in flight and nothing queued."""

    gpu: str
    replica: str


@dataclass(frozen=True, slots=True)
class Ready:
    """The replica on ``gpu`` loaded its model; ``seconds``: from its creation;
    ``load_seconds``: its handler's build; ``start``: "cold" (a full load) or "host"
    (restored from its node's model cache); ``inflight``: the queued requests it took
    at once (a pre-warmed replica that took none is idle, and reported so next)."""

    gpu: str
    replica: str
    seconds: float
    load_seconds: float
    start: str = "cold"
    inflight: int = 0


@dataclass(frozen=True, slots=True)
class Died:
    """The replica on ``gpu`` is gone: its process died, its handler failed to load or
    ran past its deadline. ``phase``: "load" or "serve"; ``backoff_s``: seconds before
    its service's next replica may start (0 unless it died loading)."""

    gpu: str
    replica: str
    error: str
    phase: str = "serve"
    backoff_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Backoff:
    """``service``'s crash-loop back-off changed: ``failures`` in a row (0: it ended,
    a replica loaded or answered), and no new replica for ``seconds`` from now."""

    service: str
    failures: int
    seconds: float


@dataclass(frozen=True, slots=True)
class Received:
    """A request of ``service`` was accepted (every one, whether a replica serves it
    warm or it waits for a new one): the services' load, as the lending reserve
    reads it."""

    service: str


@dataclass(frozen=True, slots=True)
class Served:
    """A replica of ``service`` answered a request after ``seconds`` in its handler."""

    service: str
    seconds: float


@dataclass(frozen=True, slots=True)
class Answered:
    """A request of ``service`` was answered; ``within``: it reached a replica within
    the service's ``slo_wait_s`` (:mod:`deepboot.runtime.slo` says which count where).
    One per answer, as the router's SLO counters count it. ``wait``: seconds from
    its arrival to its hand-off (to its answer when never handed); not compared."""

    service: str
    within: bool
    wait: float | None = field(default=None, compare=False)


Message = Arrival | Withdraw | Idle | Ready | Died | Backoff | Received | Served | Answered


class Inbox:
    """Messages from the router's thread to the controller's (thread-safe)."""

    def __init__(self) -> None:
        self._items: collections.deque[Message] = collections.deque()
        self.wake = threading.Event()

    def put(self, msg: Message) -> None:
        self._items.append(msg)
        self.wake.set()

    def drain(self) -> list[Message]:
        out = []
        while True:
            try:
                out.append(self._items.popleft())
            except IndexError:
                return out
