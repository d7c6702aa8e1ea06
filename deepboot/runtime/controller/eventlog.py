"""The controller's event log, as its parts write it: each record waits in memory and
goes to the store in the controller's next flush, in the same transaction as the
state it describes (a crash loses both or neither)."""

from __future__ import annotations

import sqlite3
from typing import Any, Protocol

from deepboot.core.gpu import GpuId
from deepboot.runtime.controller.jobrecords import gpu_name
from deepboot.runtime.store.jobstore import JobState, JobStore, LogKind


class Counter(Protocol):
    """What counts every record (:class:`~deepboot.runtime.prometheus_metrics.Metrics`)."""

    def count(self, kind: LogKind, detail: dict[str, Any]) -> None: ...


class EventLog:
    """Records waiting for the next flush.

    Args:
        counter: Counts each record as it is noted (the Prometheus counters).
    """

    def __init__(self, counter: Counter) -> None:
        self._counter = counter
        self._pending: list[tuple[LogKind, str, dict[str, Any]]] = []

    def note(self, kind: LogKind, job: str = "", **detail: Any) -> None:
        """Record ``kind`` about ``job`` ("" for the cluster) with ``detail``."""
        self._pending.append((kind, job, detail))
        self._counter.count(kind, detail)

    def gpu(self, gpu: GpuId, op: str, job: str, proactive: bool = False) -> None:
        """Record a GPU operation of ``job``; a reclaim says whether it was taken ahead
        of demand (``proactive``: the SLO guard's, for a pre-warm or the idle pool) or
        for a request that was waiting (reactive)."""
        extra = {"proactive": proactive} if op == "reclaim" else {}
        self.note(LogKind.GPU, job, gpu=gpu_name(gpu), op=op, **extra)

    def moved(self, job: str, was: JobState, to: JobState) -> None:
        """Record that ``job``'s state changed from ``was`` to ``to``
        (``LogKind.MOVED``), unless ``to`` is an end: finished, failed and cancelled
        are records of their own, noted by the part that ends the job."""
        if not to.ended:
            self.note(LogKind.MOVED, job, **{"from": was.value, "to": to.value})

    @property
    def pending(self) -> bool:
        """Some record waits for the flush."""
        return bool(self._pending)

    def write(self, store: JobStore, db: sqlite3.Connection) -> None:
        """Write the waiting records in ``store``'s open transaction ``db``."""
        for kind, job, detail in self._pending:
            store.log(db, kind, job, **detail)
        self._pending.clear()
