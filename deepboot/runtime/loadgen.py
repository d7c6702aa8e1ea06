"""The load generator behind ``deepboot load``: send requests to a service's HTTP
endpoint on a schedule and record every answer.

Rate profile (``--rate-profile FILE``): a CSV with the header ``time_s,rps``, one row
per change of rate. It is piecewise constant: each row's rate holds from its time to
the next row's time, and the last row marks the end of the run (its ``rps`` must be
0). Times start at 0 and strictly increase; rates are finite and >= 0. So::

    time_s,rps
    0,2
    10,20
    20,0

sends 2 requests/s for 10 s, then 20 requests/s for 10 s, and ends at 20 s (220
requests). Blank lines are skipped; every bad line raises
:class:`~deepboot.core.errors.InputError` naming the file, the line and the column.

Arrivals (:func:`send_times`): evenly spaced within each piece (rate ``r``: one request
every ``1/r`` s; the fraction of a request left at the end of a piece carries over to
the next), or a Poisson process of the same rate when a random generator is given.

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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import pairwise
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np

from deepboot.core.errors import InputError, csv_read_errors

PROFILE_COLUMNS: tuple[str, ...] = ("time_s", "rps")
"""The header of a rate profile."""

MAX_PROFILE_TIME_S = 1e6
"""Largest ``time_s`` of a profile (about 11.6 days)."""

MAX_RPS = 100_000.0
"""Largest ``rps`` of a profile row."""

MAX_REQUESTS = 2_000_000
"""Most requests one run may send (a profile asking for more is refused)."""

CSV_COLUMNS: tuple[str, ...] = ("id", "send_s", "answer_s", "status", "latency_s", "error")
"""Columns of the requests CSV: the request id, when it was sent and answered (seconds
since the run's start), the HTTP status (0: no HTTP answer, see ``error``: "timeout",
"cancelled" or the connection error), ``answer_s - send_s``, and the error."""


# ------------------------------------------------------------------ rate profile


@dataclass(frozen=True, slots=True)
class RateProfile:
    """A piecewise-constant request rate.

    Attributes:
        times: Start of each piece, then the end: ``times[0] == 0``, strictly
            increasing; ``len(times) == len(rates) + 1``.
        rates: Requests per second of each piece (finite, >= 0).
        source: Where it was read from (for messages).
    """

    times: tuple[float, ...]
    rates: tuple[float, ...]
    source: str = ""

    def __post_init__(self) -> None:
        if len(self.times) != len(self.rates) + 1 or not self.rates:
            raise ValueError("a profile needs n >= 1 rates and n + 1 times")
        if self.times[0] != 0 or any(b <= a for a, b in pairwise(self.times)):
            raise ValueError("profile times must start at 0 and strictly increase")
        if not all(math.isfinite(r) and r >= 0 for r in self.rates):
            raise ValueError("profile rates must be finite and >= 0")

    @property
    def duration(self) -> float:
        """Seconds from the start to the end of the profile."""
        return self.times[-1]

    def pieces(self) -> Iterator[tuple[float, float, float]]:
        """``(start, end, rps)`` of each piece."""
        for i, rate in enumerate(self.rates):
            yield self.times[i], self.times[i + 1], rate

    def expected_requests(self) -> float:
        """The integral of the rate: how many requests the profile asks for."""
        return sum((b - a) * r for a, b, r in self.pieces())

    @classmethod
    def load(cls, path: str | Path) -> RateProfile:
        """Read a rate profile CSV (see the module docstring).

        Raises:
            InputError: missing or unreadable file, wrong header, a malformed row, a
                time that does not start at 0 or does not increase, a rate that is not
                a finite non-negative number, a last row whose rate is not 0, fewer than
                two rows, or a profile that asks for more than :data:`MAX_REQUESTS`.
        """
        spath = str(path)
        times: list[float] = []
        rates: list[float] = []
        last_line = 1
        with (
            csv_read_errors(spath, "a rate profile CSV file"),
            Path(path).open(newline="", encoding="utf-8-sig") as f,
        ):
            reader = csv.reader(f)
            _profile_header(reader, spath)
            for values in reader:
                if not values or all(not v.strip() for v in values):
                    continue
                line = last_line = reader.line_num
                if len(values) != len(PROFILE_COLUMNS):
                    column = PROFILE_COLUMNS[len(values)] if len(values) < 2 else "rps"
                    what = "missing" if len(values) < 2 else f"{len(values) - 2} extra value(s)"
                    raise InputError(spath, line, column, f"expected 2 values (time_s,rps), {what}")
                t = _number(spath, line, "time_s", values[0], MAX_PROFILE_TIME_S)
                r = _number(spath, line, "rps", values[1], MAX_RPS)
                if not times and t != 0:
                    raise InputError(
                        spath, line, "time_s", f"the first row must be at time 0, got {t:g}"
                    )
                if times and t <= times[-1]:
                    raise InputError(
                        spath,
                        line,
                        "time_s",
                        f"{t:g} does not come after the previous row's {times[-1]:g}; "
                        "times must strictly increase",
                    )
                times.append(t)
                rates.append(r)
        if len(times) < 2:
            raise InputError(
                spath,
                last_line,
                "time_s",
                "a profile needs at least two rows: the last one marks the end "
                "(for example 'T,0' to end at T seconds)",
            )
        if rates[-1] != 0:
            raise InputError(
                spath,
                last_line,
                "rps",
                f"the last row marks the end of the profile, so its rps must be 0, got "
                f"{rates[-1]:g} (add a row '{times[-1]:g}+D,0' to keep this rate for D s)",
            )
        profile = cls(tuple(times), tuple(rates[:-1]), spath)
        expected = profile.expected_requests()
        if expected > MAX_REQUESTS:
            raise InputError(
                spath,
                0,
                "",
                f"the profile asks for {expected:,.0f} requests; at most {MAX_REQUESTS:,} per run",
            )
        return profile


def _profile_header(reader: Iterator[list[str]], spath: str) -> None:
    for values in reader:
        if not values or all(not v.strip() for v in values):
            continue
        header = tuple(v.strip() for v in values)
        if header == PROFILE_COLUMNS:
            return
        line = getattr(reader, "line_num", 1)
        field = next(
            (c for i, c in enumerate(header) if i >= 2 or c != PROFILE_COLUMNS[i]),
            PROFILE_COLUMNS[len(header)] if len(header) < 2 else "header",
        )
        raise InputError(spath, line, field or "header", "unknown header; expected 'time_s,rps'")
    raise InputError(spath, 1, "header", "the file is empty; expected the header 'time_s,rps'")


def _number(spath: str, line: int, column: str, raw: str, top: float) -> float:
    text = raw.strip()
    if not text:
        raise InputError(spath, line, column, "is empty")
    try:
        value = float(text)
    except ValueError:
        raise InputError(spath, line, column, f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise InputError(spath, line, column, f"{text!r} is not a finite number")
    if value < 0:
        raise InputError(spath, line, column, f"{text} must be >= 0")
    if value > top:
        raise InputError(spath, line, column, f"{text} exceeds the limit {top:g}")
    return value


# ------------------------------------------------------------------ arrivals


def send_times(profile: RateProfile, rng: np.random.Generator | None = None) -> list[float]:
    """When each request is sent, in seconds from the start, sorted, all in
    ``[0, profile.duration)``.

    Args:
        profile: The rate profile.
        rng: None: deterministic, evenly spaced arrivals. Request ``k`` (0-based) goes
            at the time the integral of the rate reaches ``k``, counting only pieces
            with a positive rate; so a piece of rate ``r`` sends one request every
            ``1/r`` s and its leftover fraction carries into the next piece (2 rps for
            10 s then 20 rps for 10 s: 220 requests, at 0, 0.5, ..., 9.5, 10, 10.05,
            ..., 19.95). A generator: a Poisson process of the same rate (the same
            seed gives the same times).
    """
    out: list[float] = []
    if rng is not None:
        for a, b, r in profile.pieces():
            if r <= 0:
                continue
            n = int(rng.poisson(r * (b - a)))
            out.extend(np.sort(rng.uniform(a, b, size=n)).tolist())
        return out
    done = Fraction(0)  # requests due so far (exact: no request is lost to rounding)
    for a, b, r in profile.pieces():
        if r <= 0:
            continue
        fr, fa, fb = Fraction(r), Fraction(a), Fraction(b)
        end = done + fr * (fb - fa)
        first, stop = math.ceil(done), math.ceil(end)  # requests first .. stop-1
        for k in range(first, stop):
            t = float(fa + (k - done) / fr)
            out.append(min(t, math.nextafter(b, a)))
        done = end
    return out


# ------------------------------------------------------------------ the run


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
        times: Send times in seconds from the start (sorted; see :func:`send_times`).
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
