"""The load generator behind ``deepboot load``: send requests to a service's HTTP
endpoint on a schedule and record every answer.

The schedule comes from :mod:`deepboot.runtime.rateprofile` (the profile's format,
and :func:`~deepboot.runtime.rateprofile.send_times`).

The run (:func:`run_load`): each request is sent at its time, without waiting for the
answers of earlier ones; one answer per request is recorded in a CSV (see
:data:`CSV_COLUMNS`), written atomically. Nothing is retried: a 503 is an answer to
measure, not an error to hide.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import numpy as np

CSV_COLUMNS: tuple[str, ...] = ("id", "send_s", "answer_s", "status", "latency_s", "error")
"""Columns of the requests CSV: the request id, when it was sent and answered (seconds
since the run's start), the HTTP status (0: no HTTP answer, see ``error``: "timeout",
"cancelled" or the connection error), ``answer_s - send_s``, and the error."""


@dataclass(slots=True)
class RequestRecord:
    """One request of a run (one row of the requests CSV)."""

    id: str
    due_s: float
    send_s: float = math.nan
    answer_s: float = math.nan
    status: int = 0
    error: str = ""

    @property
    def latency_s(self) -> float:
        return self.answer_s - self.send_s


@dataclass(frozen=True, slots=True)
class LoadSummary:
    """What :func:`run_load` measured.

    Attributes:
        sent: Requests sent.
        by_status: Number of answers per HTTP status (0: no HTTP answer).
        errors: Number of status-0 records per error kind ("timeout", ...).
        p50_s, p95_s, p99_s, max_s: Latency percentiles of the 200 answers (None when
            there were none).
        duration_s: From the start to the last answer.
        max_send_lag_s: Most a request was sent after its due time (a large value
            means this machine could not keep up with the profile).
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

    @property
    def ok(self) -> int:
        return self.by_status.get(200, 0)


ProgressCallback = Callable[[int, int, int], None]
"""``progress(sent, answered, total)``, called as requests go out and come back."""


def request_id(service: str, i: int) -> str:
    """The ``X-Request-Id`` of the ``i``-th request of a run."""
    return f"{service}-{i:06d}"


def infer_url(url: str, service: str) -> str:
    """``{url}/v1/{service}/infer`` (the service name is percent-encoded)."""
    return f"{url.rstrip('/')}/v1/{quote(service, safe='')}/infer"


async def run_load(
    url: str,
    service: str,
    times: Sequence[float],
    token: str | None,
    save: Callable[[str], object],
    body: Any,
    timeout_s: float,
    progress: ProgressCallback | None = None,
    max_connections: int = 1000,
) -> LoadSummary:
    """Send ``POST {url}/v1/{service}/infer`` at each of ``times`` and record the answers.

    Args:
        url: The endpoint's base URL (``http://host:port``).
        service: The service name.
        times: Send times in seconds from the start (sorted; see
            :func:`~deepboot.runtime.rateprofile.send_times`).
        token: The bearer token, or None to send no ``Authorization`` header. The
            caller makes sure ``url`` is the endpoint it means to give the token to
            (see :func:`deepboot.runtime.endpoint.connect`); redirects are not followed.
        save: Called once with the requests CSV's text (at the end, also when the run
            is cancelled: then unanswered requests get status 0, "cancelled").
        body: The JSON body of every request.
        timeout_s: Client-side limit of one request (waiting for a connection
            included); past it the request is recorded as status 0, "timeout".
        progress: Called with (sent, answered, total) as the run goes.
        max_connections: Most connections open at once (more requests in flight wait
            for one, inside their timeout).

    Returns:
        Counts by status, latency percentiles of the 200s, the run's duration.
    """
    import aiohttp

    target = infer_url(url, service)
    payload = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    records = [RequestRecord(request_id(service, i), t) for i, t in enumerate(times)]
    total = len(records)
    counts = [0, 0]  # sent, answered
    report = progress or (lambda sent, answered, total: None)
    client_timeout = aiohttp.ClientTimeout(total=timeout_s)
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def one(session: aiohttp.ClientSession, rec: RequestRecord) -> None:
        rec.send_s = loop.time() - start
        counts[0] += 1
        try:
            async with session.post(
                target,
                data=payload,
                headers={**headers, "X-Request-Id": rec.id},
                allow_redirects=False,  # a redirect is an answer, and keeps the token
            ) as resp:
                await resp.read()
                rec.status = resp.status
        except TimeoutError:
            rec.error = "timeout"
        except aiohttp.ClientError as exc:
            rec.error = _one_line(f"{type(exc).__name__}: {exc}")
        except asyncio.CancelledError:
            rec.error = "cancelled"
            raise
        finally:
            rec.answer_s = loop.time() - start
            counts[1] += 1
            report(counts[0], counts[1], total)

    tasks: list[asyncio.Task[None]] = []
    connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=0)
    try:
        async with aiohttp.ClientSession(
            connector=connector, timeout=client_timeout, raise_for_status=False
        ) as session:
            report(0, 0, total)
            for rec in records:
                delay = start + rec.due_s - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(session, rec)))
            if tasks:
                await asyncio.gather(*tasks)
    except asyncio.CancelledError:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        _finish_unsent(records, loop.time() - start)
        save(_csv_text(records))
        raise
    save(_csv_text(records))
    return _summarize(records)


def _finish_unsent(records: Sequence[RequestRecord], now: float) -> None:
    for rec in records:
        if math.isnan(rec.send_s):
            rec.error = "not sent (cancelled)"
        elif math.isnan(rec.answer_s):
            rec.answer_s = now
            rec.error = rec.error or "cancelled"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _fmt(value: float) -> str:
    return "" if math.isnan(value) else f"{value:.6f}"


def _csv_text(records: Sequence[RequestRecord]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for rec in records:
        writer.writerow(
            [
                rec.id,
                _fmt(rec.send_s),
                _fmt(rec.answer_s),
                rec.status,
                _fmt(rec.latency_s),
                rec.error,
            ]
        )
    return buf.getvalue()


def _summarize(records: Sequence[RequestRecord]) -> LoadSummary:
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
    )
