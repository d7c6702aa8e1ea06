"""The router's own state: a request in the system, a replica and its slots, a
service's queue and crash-loop back-off, and the bounds on them.

Plain records, touched only on the router's loop: :mod:`deepboot.runtime.http.dispatch`
moves requests through them, :mod:`deepboot.runtime.http.router` receives the requests
over HTTP. docs/reliability.md lists every bound.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field
from typing import Any

from deepboot.core.service import ServiceSpec

MAX_DEATHS = 2
"""Replica deaths a request may be in flight for before it is answered 502."""
PLACE_TIMEOUT_S = 300.0
"""Most seconds a new replica's actor may wait for its GPU (the lent worker or the
previous replica to leave) before it counts as failing to load."""
BACKOFF_BASE_S = 1.0
"""A service's first crash-loop back-off; it doubles with each failure in a row ..."""
BACKOFF_CAP_S = 60.0
"""... up to this."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ProxyRequest:
    """What a request to a command service forwards to its replica's server: the
    method, the path after ``/v1/<service>`` with its query, the headers to pass
    (hop-by-hop and deepboot's credential removed) and the body."""

    method: str
    path_qs: str
    headers: tuple[tuple[str, str], ...]
    body: bytes


@dataclass(frozen=True, slots=True)
class Handoff:
    """A proxied request's turn: ``replica`` has a slot for it (the end of its
    wait); the handler forwards it and gives the slot back
    (:meth:`~deepboot.runtime.http.dispatch.Dispatcher.proxied_done`)."""

    replica: Replica


@dataclass(eq=False)
class Pending:
    """A request in the system. ``queue_deadline``: when it must have left the queue;
    ``deadline``: when it must be answered (``request_timeout_s`` and
    ``request_timeout_s + handler_timeout_s`` after arrival); ``handed``: when it was
    last handed to a ready replica (None while it waits: queued again after a death,
    it waits again), the end of its measured wait (:mod:`deepboot.runtime.slotally`)."""

    id: str
    service: str
    body: Any
    future: asyncio.Future[Answer]
    arrived: float
    queue_deadline: float
    deadline: float
    posted: bool = False
    deaths: int = 0
    timer: asyncio.TimerHandle | None = None
    abandoned: bool = False  # its client went away while it ran: never retried
    handed: float | None = None
    proxy: ProxyRequest | None = None  # a command service's request (else a JSON body)
    handoff: asyncio.Future[Handoff] | None = None  # a proxied one's hand-off


@dataclass(eq=False)
class Replica:
    gpu: str
    service: str
    name: str
    handle: Any
    slots: int
    created: float
    ready: bool = False
    active: bool = True
    dead: bool = False
    inflight: int = 0
    killed: bool = False  # the router restarted it (a call past its deadline)
    prewarmed: bool = False  # started ahead of demand (``WarmReplica``: no task)
    address: str = ""  # a command service's server, "127.0.0.1:port", once loaded


@dataclass
class ServiceQueue:
    """A service's queue, its measured cold start (seconds of ``load``) and its
    crash-loop back-off (failures in a row; no arrival posted before
    ``backoff_until``, a monotonic time)."""

    spec: ServiceSpec
    queue: collections.deque[Pending] = field(default_factory=collections.deque)
    cold_s: float | None = None
    load_failures: int = 0
    backoff_until: float = 0.0
    reading: int = 0  # requests admitted whose body is being read (hold a queue place)
    serve_deaths: int = 0  # replicas that died serving since the last 200

    def backing_off(self, now: float) -> bool:
        return now < self.backoff_until
