"""Per-request SLO accounting of one simulation: who waited longer than allowed.

A request meets its service's SLO when it started serving within ``slo_wait_s`` of its
arrival: ``InferenceRecord.delay`` (queueing, a cold start, a reclaim included), the
start the simulation actually gave it, never a model a policy used. A request that
never started before the run ended is a miss. The simulator's queue is unbounded and
never times a request out, so no request is ever dropped (``requests_dropped`` is
always 0; the runtime's ``queue_bound`` and ``request_timeout_s`` are what drop
requests there).

The worst window: over every 10-minute window ``[t, t + 600 s)`` that starts at a
request's arrival and holds at least 20 requests, the lowest attainment (None when
no window holds 20). A sliding window, so a bad burst is not split in two by a fixed
grid.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np


class InferenceRecord(Protocol):
    """What the accounting reads of a request's outcome
    (:class:`deepboot.sim.metrics.InferenceRecord` is one; metrics imports this
    module to build its summary, so this one names only the fields it reads)."""

    @property
    def service(self) -> str: ...
    @property
    def submit(self) -> float: ...
    @property
    def delay(self) -> float | None: ...


WINDOW_S = 600.0
"""Length of the worst window (seconds)."""
MIN_WINDOW_REQUESTS = 20
"""Fewest requests a window must hold to count as the worst one."""


def met(record: InferenceRecord, slo_wait_s: float) -> bool:
    """The request started within ``slo_wait_s`` of its arrival."""
    return record.delay is not None and record.delay <= slo_wait_s


def worst_window(
    submits: Sequence[float],
    hits: Sequence[bool],
    window_s: float = WINDOW_S,
    min_requests: int = MIN_WINDOW_REQUESTS,
) -> float | None:
    """The lowest attainment over the windows ``[submits[i], submits[i] + window_s)``
    holding at least ``min_requests`` requests; None when none does.

    Args:
        submits: Arrival times, ascending.
        hits: Whether each request met its SLO (same order).
    """
    worst: float | None = None
    n = len(submits)
    end = 0
    inside_hits = 0
    for i in range(n):
        while end < n and submits[end] < submits[i] + window_s:
            inside_hits += hits[end]
            end += 1
        count = end - i
        # Requests that arrived together are all in the window starting then.
        first = i == 0 or submits[i - 1] != submits[i]
        if first and count >= min_requests:
            share = inside_hits / count
            if worst is None or share < worst:
                worst = share
        inside_hits -= hits[i]
    return worst


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def slo_summary(
    records: Sequence[InferenceRecord],
    slo_wait_s: Mapping[str, float],
    slo_target: Mapping[str, float],
) -> dict[str, Any]:
    """The SLO fields of a run summary's ``inference`` section.

    Args:
        records: Every request, in arrival order.
        slo_wait_s: Each service's SLO (seconds); every record's service must be there.
        slo_target: Each service's target attainment.

    Returns:
        ``slo_attainment`` (met / arrived; 1.0 with no request), ``slo_worst_window``,
        ``requests_late`` (started after their SLO), ``requests_unstarted`` (never
        started: misses too), ``requests_dropped`` (0), ``p50_delay_s``,
        ``max_delay_s``, and ``per_service``: name -> ``requests``, ``slo_wait_s``,
        ``slo_target``, ``slo_attainment``, ``slo_worst_window``, ``p99_delay_s``,
        ``requests_late``, in order of first arrival.
    """
    hits = [met(r, slo_wait_s[r.service]) for r in records]
    delays = [r.delay for r in records if r.delay is not None]
    by_service: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        by_service.setdefault(r.service, []).append(i)
    per_service: dict[str, dict[str, Any]] = {}
    for service, idx in by_service.items():
        own = [hits[i] for i in idx]
        started = [d for i in idx if (d := records[i].delay) is not None]
        per_service[service] = {
            "requests": len(idx),
            "slo_wait_s": slo_wait_s[service],
            "slo_target": slo_target[service],
            "slo_attainment": sum(own) / len(idx),
            "slo_worst_window": worst_window([records[i].submit for i in idx], own),
            "p99_delay_s": _quantile(started, 99),
            "requests_late": len(started) - sum(own),
        }
    return {
        "slo_attainment": sum(hits) / len(records) if records else 1.0,
        "slo_worst_window": worst_window([r.submit for r in records], hits),
        "requests_late": len(delays) - sum(hits),
        "requests_unstarted": len(records) - len(delays),
        "requests_dropped": 0,
        "p50_delay_s": _quantile(delays, 50),
        "max_delay_s": max(delays, default=0.0),
        "per_service": per_service,
    }
