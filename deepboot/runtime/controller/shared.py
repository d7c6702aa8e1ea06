"""What several parts of the controller hold in common, each a small object with one
owner of its state: the requests waiting for the loop (:class:`Requests`), the router
once one serves (:class:`RouterLink`), and the actor incarnation counters
(:class:`Incarnations`).

The parts themselves (generations, polling, replicas, nodes, intake, recovery) each
own their state and receive these, and the store, the GPU ledger, the event log, the
clock and the actors, in ``__init__``; :class:`~deepboot.runtime.controller.wiring.
Controller` builds them and wires them together.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from deepboot.core.service import ServiceSpec
from deepboot.runtime.messages import RouterPort
from deepboot.runtime.store.jobstore import JobStore
from deepboot.scheduler.events import Event
from deepboot.world.demand import DemandLedger, LoadWindow


class Post(Protocol):
    """Put ``event`` on the driver's queue at ``at`` (None: now)."""

    def __call__(self, event: Event, at: float | None = None) -> None: ...


Flush = Callable[[], None]
"""Write the controller's whole state and its waiting records in one transaction (a
part calls it to make an intent durable before it acts on a process)."""


class Requests:
    """The inference requests the loop has heard of, and the services' load.

    Attributes:
        arrived: Request id -> service, until placed or withdrawn.
        waiting: The arrivals the loop could not place, in order (id -> service).
        demand: Every request the router accepted and every answer: the services'
            load, for the lending reserve.
        arrivals: With ``--slo``: the same requests in fixed bins and the mean run
            times, for the SLO guard's forecast (``Snapshot.arrivals``); else None.
    """

    def __init__(self, arrivals: DemandLedger | None) -> None:
        self.arrived: dict[str, str] = {}
        self.waiting: dict[str, str] = {}
        self.demand = LoadWindow()
        self.arrivals = arrivals

    def placed(self, task: str) -> None:
        """``task`` got a replica (or was withdrawn): no longer waits."""
        self.arrived.pop(task, None)
        self.waiting.pop(task, None)


class RouterLink:
    """The router, once the controller's process connected one (None before, and
    in-process tests run without): every call is a no-op without it."""

    def __init__(self) -> None:
        self.port: RouterPort | None = None

    def start_replica(
        self, gpu: str, service: str, name: str, handle: Any, cold: bool, task: str = ""
    ) -> None:
        if self.port is not None:
            self.port.start_replica(gpu, service, name, handle, cold=cold, task=task)

    def stop_replica(self, gpu: str) -> None:
        if self.port is not None:
            self.port.stop_replica(gpu)

    def set_services(self, specs: Mapping[str, ServiceSpec], cold: Mapping[str, float]) -> None:
        if self.port is not None:
            self.port.set_services(specs, cold)


class Incarnations:
    """Numbers that make every actor name new: ``next(key)`` is one more than the
    last handed out for ``key``, kept in the store (durable before the actor exists,
    so a restarted controller never reuses one)."""

    def __init__(self, store: JobStore) -> None:
        self._store = store

    def next(self, key: str) -> int:
        value = int(self._store.meta(key, "0")) + 1
        with self._store.transaction() as db:
            self._store.set_meta(db, key, str(value))
        return value
