"""The load generator behind ``deepboot load``: send requests to a service's HTTP
endpoint on a schedule and record every answer.

The schedule comes from :mod:`deepboot.runtime.client.rateprofile` (a rate profile's send
times, one service: :func:`run_load`) or :mod:`deepboot.runtime.client.tracereplay` (a
workload's inference rows, each with its service and execution time:
:func:`run_requests`).

The run: each request is sent at its time, without waiting for the answers of earlier
ones; one answer per request is recorded in a CSV (see :data:`CSV_COLUMNS`), written
atomically. Nothing is retried: a 503 is an answer to measure, not an error to hide.

The token (issue 42, finding 2): requests go on connections of a
:class:`~deepboot.runtime.client.provenhttp.ProvenPool`, each of which, when there is a
token, proved on itself that its peer holds the token before the token goes on it.
Every answer recorded is therefore the answer of a process that holds the token. A
new connection whose peer does not prove it stops the run at once
(:class:`LoadStopped`); a refused or reset connection is a status-0 record.

SLO attainment (:class:`ServiceSlo`): a request meets its service's ``slo_wait_s``
when it waited at most that long from its arrival at the router to its hand-off to a
ready replica. The router reports that wait in the ``X-Wait-Ms`` response header
(:data:`WAIT_HEADER`); from a router without it, the wait of a 200 answer is estimated
as its latency minus its execution time (which also counts the network and the
router's own time, so the estimate is pessimistic), and counted as estimated.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import numpy as np

from deepboot.core.errors import DeepbootError
from deepboot.core.service import DEFAULT_SLO_WAIT_S

if TYPE_CHECKING:
    from deepboot.runtime.client.provenhttp import Target

CSV_COLUMNS: tuple[str, ...] = (
    "id",
    "send_s",
    "answer_s",
    "status",
    "latency_s",
    "error",
    "service",
    "wait_s",
    "exec_s",
    "replica",
    "prewarmed",
    "sent_at",
)
"""Columns of the requests CSV: the request id, when it was sent and answered (seconds
since the run's start), the HTTP status (0: no HTTP answer, see ``error``: "timeout",
"cancelled" or the connection error), ``answer_s - send_s``, the error, the service
it went to, the router's wait (``X-Wait-Ms`` in seconds; empty when the answer had no
such header), the execution time the request asked for (empty when it asked for
none: rate-profile runs), and, for a 200, the GPU of the replica that served it and
whether that replica was pre-warmed ahead of demand (1) or started for a request (0)
(the router's answer says both; empty otherwise), and the Unix time it was sent
(to line requests up with the runtime's event log, whose times are Unix times)."""

WAIT_HEADER = "X-Wait-Ms"
"""The router's response header: milliseconds from the request's arrival at the
router to its hand-off to a ready replica."""

EXEC_KEY = "exec_s"
"""The body key carrying a request's execution time in seconds (the example handler,
examples/runtime/echo_service.py, spends it)."""


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """One request of a schedule.

    Attributes:
        due_s: When to send it, seconds from the run's start (>= 0).
        service: The service it goes to.
        exec_s: The execution time it asks for (sent as the body's :data:`EXEC_KEY`),
            or None to send the body as given.
    """

    due_s: float
    service: str
    exec_s: float | None = None


@dataclass(slots=True)
class RequestRecord:
    """One request of a run (one row of the requests CSV)."""

    id: str
    due_s: float
    service: str = ""
    exec_s: float | None = None
    send_s: float = math.nan
    answer_s: float = math.nan
    status: int = 0
    error: str = ""
    wait_s: float = math.nan  # the router's X-Wait-Ms, in seconds; nan: no header
    replica: str = ""  # a 200's serving replica (its GPU), from the answer
    prewarmed: bool | None = None  # whether that replica was pre-warmed; None: unknown
    sent_at: float = math.nan  # Unix time of the send

    @property
    def latency_s(self) -> float:
        return self.answer_s - self.send_s


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
    """

    requests: int
    met: int
    slo_wait_s: float
    estimated: int = 0

    @property
    def attainment(self) -> float | None:
        """``met / requests`` (None without requests)."""
        return self.met / self.requests if self.requests else None


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


class LoadStopped(DeepbootError):
    """A run stopped because a new connection's peer did not prove that it holds the
    token (see :class:`~deepboot.runtime.client.provenhttp.ProofFailed`): nothing more was
    sent, the requests CSV was saved.

    Attributes:
        reason: The proof's failure, one line.
        sent: Requests sent before the stop.
        total: Requests of the schedule.
    """

    def __init__(self, reason: str, sent: int, total: int) -> None:
        super().__init__(f"{reason}; the run stopped after {sent} of {total} requests")
        self.reason, self.sent, self.total = reason, sent, total


ProgressCallback = Callable[[int, int, int], None]
"""``progress(sent, answered, total)``, called as requests go out and come back."""


def request_id(service: str, i: int) -> str:
    """The ``X-Request-Id`` of the ``i``-th request of a run."""
    return f"{service}-{i:06d}"


def infer_path(service: str) -> str:
    """``/v1/{service}/infer`` (the service name is percent-encoded)."""
    return f"/v1/{quote(service, safe='')}/infer"


def infer_url(url: str, service: str) -> str:
    """``{url}/v1/{service}/infer`` (the service name is percent-encoded)."""
    return url.rstrip("/") + infer_path(service)


async def run_load(
    url: str | Callable[[], Target],
    service: str,
    times: Sequence[float],
    token: str | None,
    save: Callable[[str], object],
    body: Any,
    timeout_s: float,
    progress: ProgressCallback | None = None,
    max_connections: int = 1000,
    slo_wait_s: float = DEFAULT_SLO_WAIT_S,
) -> LoadSummary:
    """Send ``POST {url}/v1/{service}/infer`` at each of ``times`` and record the answers.

    Args:
        url: The endpoint's base URL (``http://host:port``; its ``/healthz``'s
            instance id is not checked), or a function returning where each new
            connection goes (a :class:`~deepboot.runtime.client.provenhttp.Target`, e.g. what
            STATE_DIR/http.json records when it opens).
        service: The service name.
        times: Send times in seconds from the start (sorted; see
            :func:`~deepboot.runtime.client.rateprofile.send_times`).
        token: The bearer token, or None to send no ``Authorization`` header. With
            one, each connection carries it only once its peer has proved, on that
            connection, that it holds it (``GET /healthz``'s challenge; see
            :mod:`deepboot.runtime.client.provenhttp`); redirects are not followed.
        save: Called once with the requests CSV's text (at the end, also when the run
            is cancelled: then unanswered requests get status 0, "cancelled").
        body: The JSON body of every request.
        timeout_s: Client-side limit of one request (waiting for a connection, and
            opening and proving it, included); past it the request is recorded as
            status 0, "timeout".
        progress: Called with (sent, answered, total) as the run goes.
        max_connections: Most connections open at once (more requests in flight wait
            for one, inside their timeout).
        slo_wait_s: The service's SLO, for the summary's attainment.

    Returns:
        Counts by status, latency percentiles of the 200s, the run's duration.

    Raises:
        LoadStopped: a new connection's peer did not prove it holds the token (the
            token was not sent on it); in-flight requests were cancelled and the CSV
            saved (see ``save``).
    """
    return await run_requests(
        url,
        [PlannedRequest(t, service) for t in times],
        token,
        save,
        body,
        timeout_s,
        progress=progress,
        max_connections=max_connections,
        slo_wait_s={service: slo_wait_s},
    )


async def run_requests(
    url: str | Callable[[], Target],
    requests: Sequence[PlannedRequest],
    token: str | None,
    save: Callable[[str], object],
    body: Any,
    timeout_s: float,
    progress: ProgressCallback | None = None,
    max_connections: int = 1000,
    slo_wait_s: Mapping[str, float] | None = None,
) -> LoadSummary:
    """Send each of ``requests`` at its time to ``POST {url}/v1/{service}/infer`` and
    record the answers (the arguments :func:`run_load` shares mean the same).

    Args:
        requests: The schedule, sorted by ``due_s``. Request ``i`` has the id
            ``request_id(its service, i)``.
        body: The JSON body of every request; a request with an ``exec_s`` sends it
            with :data:`EXEC_KEY` set to that (then ``body`` must be a JSON object).
        slo_wait_s: Each service's SLO in seconds; a service not in it:
            :data:`~deepboot.core.service.DEFAULT_SLO_WAIT_S`.

    Raises:
        ValueError: a request has an ``exec_s`` and ``body`` is not a dict (before
            anything is sent).
        LoadStopped: as :func:`run_load`.
    """
    from deepboot.runtime.client.provenhttp import ProofFailed, ProtocolError, ProvenPool, Target

    if any(r.exec_s is not None for r in requests) and not isinstance(body, dict):
        raise ValueError(f"a request with an {EXEC_KEY} needs a JSON object body")
    if isinstance(url, str):
        fixed = Target(url, None, "--url")
        locate: Callable[[], Target] = lambda: fixed  # noqa: E731
    else:
        locate = url
    plain = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    records = [
        RequestRecord(request_id(r.service, i), r.due_s, r.service, r.exec_s)
        for i, r in enumerate(requests)
    ]
    paths: dict[str, str] = {}  # service -> its path, built once per service
    total = len(records)
    counts = [0, 0]  # sent, answered
    report = progress or (lambda sent, answered, total: None)
    pool = ProvenPool(locate, token, max_connections)
    failed: list[ProofFailed] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def one(rec: RequestRecord) -> None:
        path = paths.get(rec.service)
        if path is None:
            path = paths[rec.service] = infer_path(rec.service)
        # Built per request, not up front: a long trace's bodies would all sit in memory.
        payload = (
            plain if rec.exec_s is None else json.dumps({**body, EXEC_KEY: rec.exec_s}).encode()
        )
        rec.send_s = loop.time() - start
        rec.sent_at = time.time()
        counts[0] += 1
        try:
            # A redirect is an answer (never followed); the token goes on proven
            # connections only, which the pool alone puts it on.
            resp = await pool.request(
                "POST", path, {**headers, "X-Request-Id": rec.id}, payload, timeout_s
            )
            rec.status = resp.status
            rec.wait_s = parse_wait_ms(resp.headers.get(WAIT_HEADER.lower()))
            if rec.status == 200:
                rec.replica, rec.prewarmed = served_by(resp.body)
        except TimeoutError:
            rec.error = "timeout"
        except ProofFailed as exc:
            rec.error = "not sent: the endpoint did not prove it holds the token"
            failed.append(exc)
            stop.set()
        except (OSError, ProtocolError) as exc:  # refused, reset, closed; not HTTP
            rec.error = _one_line(f"{type(exc).__name__}: {exc}")
        except asyncio.CancelledError:
            rec.error = rec.error or "cancelled"
            raise
        finally:
            rec.answer_s = loop.time() - start
            counts[1] += 1
            report(counts[0], counts[1], total)

    tasks: list[asyncio.Task[None]] = []

    async def schedule() -> None:
        report(0, 0, total)
        for rec in records:
            delay = start + rec.due_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(rec)))
        if tasks:
            await asyncio.gather(*tasks)

    async def stop_all() -> None:
        for task in [scheduler, *tasks]:
            task.cancel()
        await asyncio.gather(scheduler, *tasks, return_exceptions=True)
        _finish_unsent(records, loop.time() - start)
        save(_csv_text(records))

    scheduler = asyncio.create_task(schedule())
    stopped = asyncio.create_task(stop.wait())
    try:
        try:
            await asyncio.wait([scheduler, stopped], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # from outside (Ctrl-C): save what was measured
            await stop_all()
            raise
        if failed:  # a connection's peer did not prove itself: nothing more is sent
            await stop_all()
            raise LoadStopped(_one_line(str(failed[0])), counts[0], total)
        scheduler.result()  # a bug's exception, if any
    finally:
        stopped.cancel()
        if not scheduler.done():
            scheduler.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(stopped, scheduler, *tasks, return_exceptions=True)
        await pool.close()
    save(_csv_text(records))
    return _summarize(records, slo_wait_s or {})


def served_by(body: bytes) -> tuple[str, bool | None]:
    """(the serving replica's GPU, whether it was pre-warmed) from a 200's JSON answer
    (the router's ``replica`` and ``prewarmed`` keys); ("", None) when the answer is
    not JSON or lacks them (another server in front, or an older router)."""
    try:
        answer = json.loads(body)
    except ValueError:
        return "", None
    if not isinstance(answer, dict):
        return "", None
    replica = answer.get("replica")
    prewarmed = answer.get("prewarmed")
    return (
        replica if isinstance(replica, str) else "",
        prewarmed if isinstance(prewarmed, bool) else None,
    )


def parse_wait_ms(value: str | None) -> float:
    """The ``X-Wait-Ms`` header's value in seconds; nan when it is absent or not a
    finite number >= 0 (a malformed header is no measurement, not an error of the run)."""
    if value is None:
        return math.nan
    try:
        ms = float(value.strip())
    except ValueError:
        return math.nan
    return ms / 1000 if math.isfinite(ms) and ms >= 0 else math.nan


def _finish_unsent(records: Sequence[RequestRecord], now: float) -> None:
    for rec in records:
        if math.isnan(rec.send_s):
            rec.error = "not sent (cancelled)"
        elif math.isnan(rec.answer_s):
            rec.answer_s = now
            rec.error = rec.error or "cancelled"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _fmt(value: float | None) -> str:
    return "" if value is None or math.isnan(value) else f"{value:.6f}"


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
                rec.service,
                _fmt(rec.wait_s),
                _fmt(rec.exec_s),
                rec.replica,
                "" if rec.prewarmed is None else int(rec.prewarmed),
                _fmt(rec.sent_at),
            ]
        )
    return buf.getvalue()


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
    tally: dict[str, list[int]] = {}  # service -> [requests, met, estimated]
    for rec in records:
        if math.isnan(rec.send_s):
            continue  # never sent (a cancelled run): not a request of the service
        row = tally.setdefault(rec.service, [0, 0, 0])
        wait, estimated = request_wait(rec)
        row[0] += 1
        row[1] += wait is not None and wait <= slo_wait_s.get(rec.service, DEFAULT_SLO_WAIT_S)
        row[2] += estimated
    return {
        name: ServiceSlo(n, met, slo_wait_s.get(name, DEFAULT_SLO_WAIT_S), est)
        for name, (n, met, est) in sorted(tally.items())
    }


def _summarize(
    records: Sequence[RequestRecord], slo_wait_s: Mapping[str, float] | None = None
) -> LoadSummary:
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
