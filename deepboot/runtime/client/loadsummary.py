"""What a load run measured (:func:`summarize`): answers by status and by error,
the latency percentiles of the 200s, how far sends lagged their schedule, and each
service's SLO attainment (:class:`ServiceSlo`).

SLO attainment: a request meets its service's ``slo_wait_s`` when it waited at most
that long from its arrival at the router to its hand-off to a ready replica
(:func:`request_wait`: the router's ``X-Wait-Ms`` header when the answer had one, an
estimate for a 200 without it, else unknown, which counts as missed). A request
never sent (a cancelled run) is no request of its service.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from deepboot.core.service import DEFAULT_SLO_WAIT_S
from deepboot.runtime.client.loadrecords import RequestRecord


@dataclass(frozen=True, slots=True)
class ServiceSlo:
    """SLO attainment of one service's requests in a run.

    Attributes:
        requests: Requests sent to the service.
        met: Those whose wait was at most ``slo_wait_s``. A request without a known
            wait (no answer, or an answer other than 200 without the header) missed.
        slo_wait_s: The service's SLO.
        estimated: Requests whose wait was estimated (a 200 answer without the
            ``X-Wait-Ms`` header: latency minus execution time).
        warm_up: Requests that waited for the service's first replica: sent before
            the first hand-off to a ready replica, when that hand-off came later than
            the SLO (a cold start; none when the service was warm). All of them when
            no request reached a replica.
        warm_up_met: Those of ``warm_up`` that met the SLO.
    """

    requests: int
    met: int
    slo_wait_s: float
    estimated: int = 0
    warm_up: int = 0
    warm_up_met: int = 0

    @property
    def attainment(self) -> float | None:
        """``met / requests`` (None without requests)."""
        return self.met / self.requests if self.requests else None

    @property
    def after_warm_up(self) -> float | None:
        """The attainment of the requests sent after the warm-up (None without any)."""
        rest = self.requests - self.warm_up
        return (self.met - self.warm_up_met) / rest if rest else None


@dataclass(frozen=True, slots=True)
class LoadSummary:
    """What a run measured (:func:`~deepboot.runtime.client.loadgen.run_load`,
    :func:`~deepboot.runtime.client.loadgen.run_requests`).

    Attributes:
        sent: Requests sent.
        by_status: Number of answers per HTTP status (0: no HTTP answer).
        errors: Number of status-0 records per error kind ("timeout", ...).
        p50_s, p95_s, p99_s, max_s: Latency percentiles of the 200 answers (None when
            there were none).
        duration_s: From the start to the last answer.
        max_send_lag_s: Most a request was sent after its due time (a large value
            means this machine could not keep up with the profile).
        slo: SLO attainment per service, by service name (sorted).
    """

    sent: int
    by_status: dict[int, int]
    errors: dict[str, int]
    p50_s: float | None
    p95_s: float | None
    p99_s: float | None
    max_s: float | None
    duration_s: float
    max_send_lag_s: float
    latencies_ok: tuple[float, ...] = field(default=(), repr=False)
    slo: dict[str, ServiceSlo] = field(default_factory=dict)

    @property
    def ok(self) -> int:
        return self.by_status.get(200, 0)


def request_wait(rec: RequestRecord) -> tuple[float | None, bool]:
    """(the request's wait in seconds or None when unknown, whether it is estimated).

    The router's header when the answer had one; else, for a 200, its latency minus
    its execution time (clamped at 0); else (no answer, or a refusal such as a 503
    without the header) unknown: the request never reached a replica in time.
    """
    if not math.isnan(rec.wait_s):
        return rec.wait_s, False
    if rec.status == 200:
        return max(rec.latency_s - (rec.exec_s or 0.0), 0.0), True
    return None, False


def _slo(
    records: Sequence[RequestRecord], slo_wait_s: Mapping[str, float]
) -> dict[str, ServiceSlo]:
    # service -> (when its first request was handed to a ready replica, its wait)
    first: dict[str, tuple[float, float]] = {}
    for rec in records:
        wait, _ = request_wait(rec)
        if rec.status == 200 and wait is not None and not math.isnan(rec.send_s):
            handoff = (rec.send_s + wait, wait)
            first[rec.service] = min(first.get(rec.service, handoff), handoff)
    warm_up_ends = {
        name: (at if wait > slo_wait_s.get(name, DEFAULT_SLO_WAIT_S) else -math.inf)
        for name, (at, wait) in first.items()
    }
    # service -> [requests, met, estimated, warm-up, warm-up met]
    tally: dict[str, list[int]] = {}
    for rec in records:
        if math.isnan(rec.send_s):
            continue  # never sent (a cancelled run): not a request of the service
        row = tally.setdefault(rec.service, [0, 0, 0, 0, 0])
        wait, estimated = request_wait(rec)
        met = wait is not None and wait <= slo_wait_s.get(rec.service, DEFAULT_SLO_WAIT_S)
        warm_up = rec.send_s < warm_up_ends.get(rec.service, math.inf)
        row[0] += 1
        row[1] += met
        row[2] += estimated
        row[3] += warm_up
        row[4] += warm_up and met
    return {
        name: ServiceSlo(n, met, slo_wait_s.get(name, DEFAULT_SLO_WAIT_S), est, wu, wu_met)
        for name, (n, met, est, wu, wu_met) in sorted(tally.items())
    }


def summarize(
    records: Sequence[RequestRecord], slo_wait_s: Mapping[str, float] | None = None
) -> LoadSummary:
    """The summary of a run's ``records``; ``slo_wait_s``: each service's SLO (a
    service not in it: :data:`~deepboot.core.service.DEFAULT_SLO_WAIT_S`)."""
    by_status: dict[int, int] = {}
    errors: dict[str, int] = {}
    ok: list[float] = []
    for rec in records:
        by_status[rec.status] = by_status.get(rec.status, 0) + 1
        if rec.status == 0:
            kind = rec.error.split(":", 1)[0] or "unknown"
            errors[kind] = errors.get(kind, 0) + 1
        elif rec.status == 200:
            ok.append(rec.latency_s)
    sent = [r for r in records if not math.isnan(r.send_s)]
    pct: list[float | None] = [None, None, None]
    if ok:
        pct = [float(v) for v in np.percentile(ok, [50, 95, 99])]
    return LoadSummary(
        sent=len(sent),
        by_status=dict(sorted(by_status.items())),
        errors=dict(sorted(errors.items())),
        p50_s=pct[0],
        p95_s=pct[1],
        p99_s=pct[2],
        max_s=max(ok) if ok else None,
        duration_s=max((r.answer_s for r in sent), default=0.0),
        max_send_lag_s=max((r.send_s - r.due_s for r in sent), default=0.0),
        latencies_ok=tuple(ok),
        slo=_slo(records, slo_wait_s or {}),
    )
