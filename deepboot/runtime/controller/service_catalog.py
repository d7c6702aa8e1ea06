"""The services the controller knows, and how each keeps its SLO: their specs as the
policies plan with them (a measured cold start filled in), their crash-loop back-offs
and cold starts to record, and each service's SLO tally with its bounded record in the
event log."""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
from collections.abc import Callable

from deepboot.core.service import ServiceSpec
from deepboot.runtime.controller.eventlog import EventLog
from deepboot.runtime.controller.shared import RouterLink
from deepboot.runtime.slotally import ServiceSlo, SloTally
from deepboot.runtime.store.jobstore import JobStore, LogKind

SLO_LOG_EVERY_S = 60.0
"""Least seconds between two ``slo`` event-log records of a service (while it serves)."""


class ServiceCatalog:
    """The registered services (see the module docstring).

    Args:
        store: Where services are registered (``deepboot serve``, POST /v1/services).
        log: The event log (``slo`` records).
        router: The router, told of every new service.
        clock: Wall clock.
        slo_target: ``--slo-target``: every service's target, overriding its file's.

    Attributes:
        specs: Each service's spec as the policies plan with it, by name (replaced,
            never mutated: the snapshot holds the mapping it was given).
        slo: Every answer, within or over its service's ``slo_wait_s``, since this
            controller started and in the last 5 minutes (``deepboot status``).
    """

    def __init__(
        self,
        store: JobStore,
        log: EventLog,
        router: RouterLink,
        clock: Callable[[], float],
        slo_target: float | None,
    ) -> None:
        self._store, self._log, self._router, self._clock = store, log, router, clock
        self._slo_target = slo_target
        self.specs: dict[str, ServiceSpec] = {}
        self.slo = SloTally()
        # Each service's SLO counts as last written to the event log, and when (Unix).
        self._slo_logged: dict[str, tuple[int, int, float]] = {}
        self._cold_starts: list[tuple[str, float]] = []
        # Crash-loop back-offs to record: service -> (failures in a row, Unix time
        # before which no replica starts, or None once it ended).
        self._backoffs: dict[str, tuple[int, float | None]] = {}

    def take_services(self) -> None:
        """Services registered since the last look."""
        fresh = {
            r.spec.name: planned_spec(r.spec, r.cold_start)
            for r in self._store.services()
            if r.spec.name not in self.specs
        }
        if not fresh:
            return
        self.specs = {**self.specs, **fresh}
        self._router.set_services(self.specs, self.measured_cold_starts())

    def cold_start_measured(self, service: str, load_s: float, start_to_ready_s: float) -> None:
        """A new replica of ``service`` loaded cold: record its handler's load
        (``load_s``), and plan its next replicas with the start-to-ready time (what a
        request that waits for one waits) when its file gives no ``cold_start_s``.
        Without it the policies would see none (0 s) and take the SLO guard's relaxed
        regime (a cold start meets any SLO) for a service whose cold start is far above
        its ``slo_wait_s``."""
        self._cold_starts.append((service, round(load_s, 3)))
        spec = self.specs.get(service)
        if spec is None or spec.cold_start_s is not None:
            return
        self.specs = {**self.specs, service: planned_spec(spec, round(start_to_ready_s, 3))}

    def backoff(self, service: str, failures: int, until: float | None) -> None:
        """``service``'s crash-loop back-off changed (recorded at the next flush)."""
        self._backoffs[service] = (failures, until)

    def measured_cold_starts(self) -> dict[str, float]:
        """The first cold start measured of each service (the store's), for the
        router's default load timeouts."""
        return {r.spec.name: r.cold_start for r in self._store.services() if r.cold_start}

    def service_slos(self) -> dict[str, ServiceSlo]:
        """Each registered service's SLO as the guard applies it: its ``slo_wait_s``,
        and its ``slo_target`` unless ``--slo-target`` overrides every service's."""
        override = self._slo_target
        return {
            name: ServiceSlo(spec.slo_wait_s, spec.slo_target if override is None else override)
            for name, spec in sorted(self.specs.items())
        }

    def log_slo(self, every_s: float = SLO_LOG_EVERY_S) -> None:
        """Write each service's SLO counts since this controller started to the event
        log (``slo``: service, within, over) when they changed, at most once per
        ``every_s`` seconds per service (0: now, as at shutdown): a bounded record
        that the last one of a run equals the router's counters."""
        now = self._clock()
        for service, counts in sorted(self.slo.since_start().items()):
            within, over, at = self._slo_logged.get(service, (0, 0, -math.inf))
            if (counts.within, counts.over) != (within, over) and now - at >= every_s:
                self._log.note(LogKind.SLO, service=service, within=counts.within, over=counts.over)
                self._slo_logged[service] = (counts.within, counts.over, now)

    def write_changes(self, db: sqlite3.Connection) -> None:
        """The cold starts and back-offs heard since the last flush, in ``db``."""
        for service, seconds in self._cold_starts:
            self._store.set_cold_start(db, service, seconds)
        self._cold_starts.clear()
        for service, (failures, until) in self._backoffs.items():
            self._store.set_backoff(db, service, failures, until)
        self._backoffs.clear()

    def write_slo(self, db: sqlite3.Connection) -> dict[str, ServiceSlo]:
        """The SLO tally and each service's target, in ``db``; returns the SLOs."""
        self._store.set_meta(db, "slo", json.dumps(self.slo.view(self._clock())))
        slos = self.service_slos()
        targets = {name: slo.target for name, slo in slos.items()}
        self._store.set_meta(db, "slo_targets", json.dumps(targets))
        return slos


def planned_spec(spec: ServiceSpec, measured_s: float | None) -> ServiceSpec:
    """``spec`` as the policies plan with it: its file's ``cold_start_s``, else the
    cold start measured (``measured_s``: a restarted controller's is the store's,
    the handler's load alone, until its next replica measures start to ready)."""
    if spec.cold_start_s is not None or not measured_s:
        return spec
    return dataclasses.replace(spec, cold_start_s=measured_s)
