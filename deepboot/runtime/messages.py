"""What the controller's loop and the router (the HTTP endpoint's thread) exchange,
and nothing else: messages from the router to the loop (plain values in a
thread-safe queue) and the router's port, the calls the loop makes on it
(:class:`RouterPort`).

No HTTP library: ``controller/`` imports this module, never ``http/``
(``tests/test_layers.py``); the process that runs both
(:mod:`deepboot.runtime.controller_process`) builds the router and hands it to the
controller as a :class:`RouterPort`.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from deepboot.core.service import ServiceSpec


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
    ``load_seconds``: its handler's build; ``start``: "cold" (a full load), "host"
    (restored from its node's model cache) or "wake" (a command server woken);
    ``inflight``: the queued requests it took at once (a pre-warmed replica that took
    none is idle, and reported so next); ``wake_failed``: why a sleeping server's wake
    failed, when it did (it was then started cold)."""

    gpu: str
    replica: str
    seconds: float
    load_seconds: float
    start: str = "cold"
    inflight: int = 0
    wake_failed: str = ""


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
    reads it. ``at``: when (Unix time; None: when the controller reads it)."""

    service: str
    at: float | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Served:
    """A replica of ``service`` answered a request after ``seconds`` in its handler;
    ``at``: when (Unix time; None: when the controller reads it)."""

    service: str
    seconds: float
    at: float | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Answered:
    """A request of ``service`` was answered; ``within``: it reached a replica within
    the service's ``slo_wait_s`` (:mod:`deepboot.runtime.slotally` says which count where).
    One per answer, as the router's SLO counters count it. ``wait``: seconds from
    its arrival to its hand-off (to its answer when never handed); not compared.
    ``at``: when (Unix time; None: when the controller reads it)."""

    service: str
    within: bool
    wait: float | None = field(default=None, compare=False)
    at: float | None = field(default=None, compare=False)


Message = Arrival | Withdraw | Idle | Ready | Died | Backoff | Received | Served | Answered

QUIET = (Received, Served, Answered)
"""Messages that only count (the load, the run times, the SLO tally): they wait for
the controller's next turn (its poll, at most ``--poll`` away, or another message's)
instead of waking it. Three per request woke the controller's thread for a turn each,
which took the GIL from the router's thread at every request (the endpoint's cost)."""


class Inbox:
    """Messages from the router's thread to the controller's (thread-safe)."""

    def __init__(self) -> None:
        self._items: collections.deque[Message] = collections.deque()
        self.wake = threading.Event()

    def put(self, msg: Message) -> None:
        self._items.append(msg)
        if not isinstance(msg, QUIET):
            self.wake.set()

    def drain(self) -> list[Message]:
        out = []
        while True:
            try:
                out.append(self._items.popleft())
            except IndexError:
                return out


class RouterPort(Protocol):
    """The calls the controller's loop makes on the router (every one returns at once:
    the router acts on its own event loop). GPU names are ``gpu_name``'s."""

    @property
    def url(self) -> str:
        """The endpoint's URL."""
        ...

    def beat(self) -> None:
        """The loop completed a turn (``/healthz`` reports its age)."""
        ...

    def stop(self) -> None:
        """Stop serving (the loop is ending)."""
        ...

    def write_address(self, path: Path) -> None:
        """Record where the endpoint listens (``http.json``) for the CLI."""
        ...

    def set_services(
        self, specs: Mapping[str, ServiceSpec], cold: Mapping[str, float] | None = None
    ) -> None:
        """The registered services, and the cold starts measured so far (seconds)."""
        ...

    def restore_backoff(self, service: str, failures: int, seconds_left: float) -> None:
        """A restarted controller's record of a service's crash-loop back-off."""
        ...

    def start_replica(
        self, gpu: str, service: str, name: str, handle: Any, cold: bool, task: str = ""
    ) -> None:
        """Arrival ``task`` placed on ``gpu``: a new replica (``cold``) or a warm reuse;
        no ``task``: pre-warmed."""
        ...

    def adopt_replica(self, gpu: str, service: str, name: str, handle: Any) -> None:
        """A live replica a restarted controller kept (idle)."""
        ...

    def stop_replica(self, gpu: str) -> None:
        """The replica on ``gpu`` is evicted."""
        ...
