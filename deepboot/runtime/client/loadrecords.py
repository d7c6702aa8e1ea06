"""A load run's requests, planned and measured: the schedule ``deepboot load`` sends
(:class:`PlannedRequest`, from a rate profile or a trace), the record of each request
as it went (:class:`RequestRecord`), and the requests CSV those records are saved as
(:data:`CSV_COLUMNS`, :func:`csv_text`).

Times in a record are seconds since the run's start (``nan``: it did not happen),
but ``sent_at``, a Unix time; a record's status is 0 when there was no HTTP answer
(its ``error`` says why).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """One request of a schedule.

    Attributes:
        due_s: When to send it, seconds from the run's start (>= 0).
        service: The service it goes to.
        exec_s: The execution time it asks for (sent as the body's
            :data:`~deepboot.runtime.client.loadgen.EXEC_KEY`), or None to send the
            body as given.
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


def finish_unsent(records: Sequence[RequestRecord], now: float) -> None:
    """Mark the records of a stopped run: never sent, "not sent (cancelled)"; sent but
    unanswered, answered at ``now`` with the error "cancelled" (unless it has one)."""
    for rec in records:
        if math.isnan(rec.send_s):
            rec.error = "not sent (cancelled)"
        elif math.isnan(rec.answer_s):
            rec.answer_s = now
            rec.error = rec.error or "cancelled"


def _fmt(value: float | None) -> str:
    return "" if value is None or math.isnan(value) else f"{value:.6f}"


def csv_text(records: Sequence[RequestRecord]) -> str:
    """The requests CSV of ``records``: the header :data:`CSV_COLUMNS`, a row each."""
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
