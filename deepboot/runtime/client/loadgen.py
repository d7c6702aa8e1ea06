"""The load generator behind ``deepboot load``: send requests to a service's HTTP
endpoint on a schedule and record every answer.

The schedule comes from :mod:`deepboot.runtime.client.rateprofile` (a rate profile's send
times, one service: :func:`run_load`) or :mod:`deepboot.runtime.client.tracereplay` (a
workload's inference rows, each with its service and execution time:
:func:`run_requests`).

The run: each request is sent at its time, without waiting for the answers of earlier
ones; one answer per request is recorded in a CSV (see :data:`CSV_COLUMNS`), written
atomically. Nothing is retried: a 503 is an answer to measure, not an error to hide.
The schedule's and the records' types and the CSV are
:mod:`deepboot.runtime.client.loadrecords`'s, the summary
:mod:`deepboot.runtime.client.loadsummary`'s; both modules' public names are
importable from here too.

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
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from deepboot.core.errors import DeepbootError
from deepboot.core.service import DEFAULT_SLO_WAIT_S
from deepboot.runtime.client.loadrecords import (
    CSV_COLUMNS,
    PlannedRequest,
    RequestRecord,
    csv_text,
    finish_unsent,
)
from deepboot.runtime.client.loadsummary import LoadSummary, ServiceSlo, request_wait, summarize
from deepboot.runtime.client.provenhttp import ProofFailed, ProtocolError, ProvenPool, Target

__all__ = [
    "CSV_COLUMNS",
    "EXEC_KEY",
    "WAIT_HEADER",
    "LoadStopped",
    "LoadSummary",
    "PlannedRequest",
    "ProgressCallback",
    "RequestRecord",
    "ServiceSlo",
    "infer_path",
    "infer_url",
    "parse_wait_ms",
    "request_id",
    "request_wait",
    "run_load",
    "run_requests",
    "served_by",
]

WAIT_HEADER = "X-Wait-Ms"
"""The router's response header: milliseconds from the request's arrival at the
router to its hand-off to a ready replica."""

EXEC_KEY = "exec_s"
"""The body key carrying a request's execution time in seconds (the example handler,
examples/runtime/echo_service.py, spends it)."""


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
    if any(r.exec_s is not None for r in requests) and not isinstance(body, dict):
        raise ValueError(f"a request with an {EXEC_KEY} needs a JSON object body")
    if isinstance(url, str):
        fixed = Target(url, None, "--url")
        locate: Callable[[], Target] = lambda: fixed  # noqa: E731
    else:
        locate = url
    plain = json.dumps(body).encode()
    records = [
        RequestRecord(request_id(r.service, i), r.due_s, r.service, r.exec_s)
        for i, r in enumerate(requests)
    ]
    pool = ProvenPool(locate, token, max_connections)
    run = _Run(records, pool, body, plain, timeout_s, progress)
    await run.run(save)
    save(csv_text(records))
    return summarize(records, slo_wait_s or {})


class _Run:
    """One run of :func:`run_requests`: its records, the pool they go through, what
    was sent and answered so far, and the proof failure that stops it."""

    def __init__(
        self,
        records: list[RequestRecord],
        pool: ProvenPool,
        body: Any,
        plain: bytes,
        timeout_s: float,
        progress: ProgressCallback | None,
    ) -> None:
        self.records = records
        self.pool = pool
        self.body = body
        self.plain = plain  # the body of a request without exec_s
        self.timeout_s = timeout_s
        self.report = progress or (lambda sent, answered, total: None)
        self.paths: dict[str, str] = {}  # service -> its path, built once per service
        self.sent = self.answered = 0
        self.failed: list[ProofFailed] = []
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []
        self.loop = asyncio.get_running_loop()
        self.start = self.loop.time()

    def now(self) -> float:
        """Seconds since the run's start."""
        return self.loop.time() - self.start

    async def run(self, save: Callable[[str], object]) -> None:
        """Send every request at its time; stop early, saving what was measured, when
        cancelled from outside or when a connection's peer does not prove itself.

        Raises:
            LoadStopped: a connection's peer did not prove it holds the token.
        """
        scheduler = asyncio.create_task(self.schedule())
        stopped = asyncio.create_task(self.stop.wait())
        try:
            try:
                await asyncio.wait([scheduler, stopped], return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:  # from outside (Ctrl-C): save what was measured
                await self.stop_all(scheduler, save)
                raise
            if self.failed:  # a connection's peer did not prove itself: nothing more is sent
                await self.stop_all(scheduler, save)
                reason = _one_line(str(self.failed[0]))
                raise LoadStopped(reason, self.sent, len(self.records))
            scheduler.result()  # a bug's exception, if any
        finally:
            stopped.cancel()
            if not scheduler.done():
                scheduler.cancel()
            for task in self.tasks:
                task.cancel()
            await asyncio.gather(stopped, scheduler, *self.tasks, return_exceptions=True)
            await self.pool.close()

    async def schedule(self) -> None:
        """Start each request's task at its due time; then wait for them all."""
        self.report(0, 0, len(self.records))
        for rec in self.records:
            delay = self.start + rec.due_s - self.loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            self.tasks.append(asyncio.create_task(self.one(rec)))
        if self.tasks:
            await asyncio.gather(*self.tasks)

    async def stop_all(self, scheduler: asyncio.Task[None], save: Callable[[str], object]) -> None:
        """Cancel the schedule and every request in flight, and save the records."""
        for task in [scheduler, *self.tasks]:
            task.cancel()
        await asyncio.gather(scheduler, *self.tasks, return_exceptions=True)
        finish_unsent(self.records, self.now())
        save(csv_text(self.records))

    async def one(self, rec: RequestRecord) -> None:
        """Send ``rec``'s request and record its answer (or why there was none)."""
        path = self.paths.get(rec.service)
        if path is None:
            path = self.paths[rec.service] = infer_path(rec.service)
        # Built per request, not up front: a long trace's bodies would all sit in memory.
        payload = (
            self.plain
            if rec.exec_s is None
            else json.dumps({**self.body, EXEC_KEY: rec.exec_s}).encode()
        )
        rec.send_s = self.now()
        rec.sent_at = time.time()
        self.sent += 1
        headers = {"Content-Type": "application/json", "X-Request-Id": rec.id}
        try:
            # A redirect is an answer (never followed); the token goes on proven
            # connections only, which the pool alone puts it on.
            resp = await self.pool.request("POST", path, headers, payload, self.timeout_s)
            rec.status = resp.status
            rec.wait_s = parse_wait_ms(resp.headers.get(WAIT_HEADER.lower()))
            if rec.status == 200:
                rec.replica, rec.prewarmed = served_by(resp.body)
        except TimeoutError:
            rec.error = "timeout"
        except ProofFailed as exc:
            rec.error = "not sent: the endpoint did not prove it holds the token"
            self.failed.append(exc)
            self.stop.set()
        except (OSError, ProtocolError) as exc:  # refused, reset, closed; not HTTP
            rec.error = _one_line(f"{type(exc).__name__}: {exc}")
        except asyncio.CancelledError:
            rec.error = rec.error or "cancelled"
            raise
        finally:
            rec.answer_s = self.now()
            self.answered += 1
            self.report(self.sent, self.answered, len(self.records))


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


def _one_line(text: str) -> str:
    return " ".join(text.split())
