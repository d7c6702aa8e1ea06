"""What the trace loaders share: row-by-row CSV reading whose every error names the file,
the line and the column; cell parsers; the requests and services a loader produces;
the DeepBoot workload CSV they are written as; and the busy fraction of a pool.

A **request** becomes one inference row of a DeepBoot workload::

    name,time,application,num_replicas,batch_size,duration,num_task
    req-M0002-1,12.5,infer-M0002,1,1,23,1

``num_replicas`` and ``batch_size`` are 1 (a task runs on one GPU, as the workload
loader requires of inference rows) and ``num_task`` is 1 (one request; informational).

**Busy GPU-seconds** of a request: ``duration / concurrency`` (a replica serves
``concurrency`` requests at once, so one request holds that share of a GPU), spread over
the windows its run ``[time, time + duration)`` overlaps, each window getting the part
of the run that falls inside it. The busy fraction of a window is its busy GPU-seconds
over ``window_s x GPUs``.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from deepboot.core.errors import ConfigError, InputError, csv_read_errors
from deepboot.core.service import ServiceSpec
from deepboot.sim.workload import DEEPBOOT_COLUMNS

SOURCE_PREFIX = "Source: "
"""The start of a credit line in a services file's header and in a summary."""

GENAI_SOURCE = (
    "Source: Alibaba cluster-trace-v2026-GenAI (github.com/alibaba/clusterdata; "
    "SoCC'25 / EuroSys'26), CC-BY-4.0"
)
"""The credit of the Alibaba GenAI 2026 trace (CC-BY-4.0)."""

AZURE_SOURCE = (
    "Source: Azure LLM inference trace 2023 (github.com/Azure/AzurePublicDataset; "
    "Patel et al., Splitwise, ISCA'24), CC-BY-4.0"
)
"""The credit of the Azure LLM inference trace 2023 (CC-BY-4.0)."""

MAX_TIME_S = 1e9
"""Largest arrival time or duration written (the workload loader's limit)."""

MAX_WINDOWS = 2_000_000
"""Most windows a busy fraction is computed over (1e9 s in windows of 600 s fit)."""

_EPOCH = datetime(1970, 1, 1)


def shown(raw: str) -> str:
    """A cell as quoted in an error message (at most 40 characters)."""
    return repr(raw if len(raw) <= 40 else raw[:37] + "...")


@dataclass(frozen=True, slots=True)
class Cells:
    """One data row of a trace CSV and where it came from.

    Attributes:
        path: The file, as the user named it.
        line: 1-based line of the row (its first line, for a quoted multi-line cell).
        values: The row's cells by column name (only the columns the reader asked for).
    """

    path: str
    line: int
    values: dict[str, str]

    def error(self, column: str, message: str) -> InputError:
        return InputError(self.path, self.line, column, message)

    def text(self, column: str) -> str:
        return self.values[column].strip()

    def number(
        self, column: str, high: float, *, low: float = 0.0, low_open: bool = False
    ) -> float:
        """A finite number in ``[low, high]`` (``(low, high]`` with ``low_open``)."""
        raw = self.text(column)
        try:
            value = float(raw)
        except ValueError:
            raise self.error(column, f"{shown(raw)} is not a number") from None
        bad_low = value <= low if low_open else value < low
        if not math.isfinite(value) or bad_low or value > high:
            bracket = "(" if low_open else "["
            raise self.error(
                column, f"{shown(raw)} must be a number in {bracket}{low:g}, {high:g}]"
            )
        return value

    def count(self, column: str, high: int) -> int:
        """A whole number in ``[0, high]`` (``"12"`` or ``"12.0"``)."""
        value = self.number(column, high)
        if value != int(value):
            raise self.error(column, f"{shown(self.text(column))} is not a whole number")
        return int(value)

    def timestamp(self, column: str) -> float:
        """A date and time without a zone (``2024-11-15 16:57:50``, fractions of a second
        allowed), as seconds since 1970-01-01 00:00 of the same clock."""
        raw = self.text(column)
        try:
            when = datetime.fromisoformat(raw)
        except ValueError:
            raise self.error(
                column, f"{shown(raw)} is not a date and time like 2024-11-15 16:57:50"
            ) from None
        if when.tzinfo is not None:
            raise self.error(column, f"{shown(raw)}: give the time without a zone")
        return (when - _EPOCH).total_seconds()


def read_rows(path: str | Path, kind: str, columns: Sequence[str]) -> Iterator[Cells]:
    """The data rows of a trace CSV, one at a time (the file is streamed).

    The header is the first non-blank line; it must hold every name of ``columns``
    (in any order, other columns allowed and ignored, no name twice). Every later
    non-blank line must have as many values as the header. Blank lines are skipped.

    Args:
        path: The file.
        kind: What the file is, for messages ("lora_request_trace.csv").
        columns: The columns the caller reads.

    Yields:
        Each row's cells of ``columns``.

    Raises:
        InputError: the file is missing, unreadable or not UTF-8, the header lacks a
            column, a row has the wrong number of values, or the file has no rows;
            naming the file, the line and the column.
    """
    spath = str(path)
    with ExitStack() as stack:
        stack.enter_context(csv_read_errors(spath, kind))
        f = stack.enter_context(Path(path).open(newline="", encoding="utf-8-sig"))
        reader = csv.reader(f)
        header = next((v for v in reader if any(c.strip() for c in v)), None)
        if header is None:
            raise InputError(spath, 1, "header", f"the file is empty; expected {kind}'s header")
        head_line = reader.line_num
        names = [h.strip() for h in header]
        index: dict[str, int] = {}
        for column in columns:
            if names.count(column) != 1:
                what = "lacks" if column not in names else "repeats"
                raise InputError(
                    spath, head_line, column, f"the header {what} {column!r}; expected "
                    f"{kind}'s header with {','.join(columns)}",
                )  # fmt: skip
            index[column] = names.index(column)
        width = len(names)
        line = head_line
        rows = 0
        for values in reader:
            start, line = line + 1, reader.line_num
            if not values or all(not v.strip() for v in values):
                continue
            if len(values) != width:
                missing = len(values) < width
                col = names[len(values)] if missing else names[-1]
                what = "missing values" if missing else "extra values after it"
                raise InputError(
                    spath, start, col, f"the row has {len(values)} values, the header "
                    f"{width}: {what}",
                )  # fmt: skip
            rows += 1
            yield Cells(spath, start, {c: values[i] for c, i in index.items()})
        if not rows:
            raise InputError(spath, head_line, "header", "the file has a header but no rows")


@dataclass(frozen=True, slots=True)
class Request:
    """One inference request: a DeepBoot inference row.

    Attributes:
        time: Arrival, seconds from the workload's start (>= 0).
        service: The service's name (its row's application is ``infer-<service>``).
        duration: Seconds the request runs once started (> 0).
    """

    time: float
    service: str
    duration: float


@dataclass(frozen=True, slots=True)
class InferenceStream:
    """What a trace loader produces.

    Attributes:
        requests: Sorted by arrival (stable).
        services: Every service a request names, each once, in the order written.
        notes: Lines for the services file's header comment, the credit
            (a line starting with :data:`SOURCE_PREFIX`) first.
        summary: One line saying what was read, kept, dropped and changed, with the
            credit (for the command's output).
    """

    requests: tuple[Request, ...]
    services: tuple[ServiceSpec, ...]
    notes: tuple[str, ...]
    summary: str


def format_seconds(value: float, digits: int) -> str:
    """``value`` for a workload CSV: a whole number without its ``.0``, else rounded to
    ``digits`` decimals (unrounded when rounding would make a positive value 0)."""
    if float(value).is_integer():
        return str(int(value))
    rounded = round(value, digits)
    return repr(rounded if rounded > 0 or value <= 0 else value)


def request_rows(requests: Iterable[Request]) -> Iterator[tuple[str, ...]]:
    """The DeepBoot rows of ``requests``, named ``req-<service>-<n>`` (``n`` counts the
    service's requests from 1, in the order given)."""
    counts: dict[str, int] = {}
    for r in requests:
        n = counts[r.service] = counts.get(r.service, 0) + 1
        time, duration = format_seconds(r.time, 3), format_seconds(r.duration, 6)
        yield (f"req-{r.service}-{n}", time, f"infer-{r.service}", "1", "1", duration, "1")


def write_rows(path: str | Path, rows: Iterable[Sequence[str]]) -> None:
    """Write a DeepBoot workload CSV: the header, then ``rows``.

    Raises:
        OSError: the file cannot be written.
    """
    with Path(path).open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(DEEPBOOT_COLUMNS)
        writer.writerows(rows)


# ------------------------------------------------------------------ busy fraction


def window_gpu_seconds(
    starts: np.ndarray, durations: np.ndarray, shares: np.ndarray, origin: float, window_s: float
) -> np.ndarray:
    """Busy GPU-seconds per window (see the module docstring).

    Args:
        starts: Arrival of each request, shape (n,), each >= ``origin``.
        durations: Run of each request in seconds, shape (n,), each >= 0.
        shares: GPU share each request holds while it runs (1 / concurrency), shape (n,).
        origin: Start of window 0; window ``j`` is ``[origin + j W, origin + (j+1) W)``.
        window_s: The window length ``W`` (> 0).

    Returns:
        Shape (m,): window ``j``'s busy GPU-seconds, for every window up to the one
        in which the last run ends (at least one). Sums run in index order, so the
        result is the same on every machine.

    Raises:
        ConfigError: more than :data:`MAX_WINDOWS` windows.
    """
    a = (starts - origin) / window_s
    b = a + durations / window_s
    if a.size == 0:
        return np.zeros(1)
    windows = max(1, math.ceil(float(b.max())))
    if windows > MAX_WINDOWS:
        raise ConfigError(
            f"the requests span {windows:,} windows of {window_s:g} s, more than "
            f"{MAX_WINDOWS:,}; give a longer window"
        )
    ja = np.floor(a).astype(np.int64)
    jb = np.maximum(np.ceil(b).astype(np.int64) - 1, ja)  # a run ending on an edge stays left
    one = ja == jb
    head = np.where(one, b - a, ja + 1 - a) * shares
    tail = np.where(one, 0.0, b - jb) * shares
    size = windows + 1
    busy = np.bincount(ja, head, size) + np.bincount(jb, tail, size)
    # Whole windows strictly between the first and the last: +share from window ja+1
    # on, -share from window jb on (runs inside one window have none).
    spans = np.where(one, 0.0, shares)
    busy += np.cumsum(np.bincount(ja + 1, spans, size + 1)[:size] - np.bincount(jb, spans, size))
    return busy[:windows] * window_s


@dataclass(frozen=True, slots=True)
class Busy:
    """Busy fractions of a pool over windows.

    Attributes:
        peak: The largest window's busy fraction.
        mean: Busy GPU-seconds over every window's capacity together.
        peak_window: Index of the first window at the peak.
        windows: How many windows (from the origin to the end of the last run).
    """

    peak: float
    mean: float
    peak_window: int
    windows: int

    @classmethod
    def of(cls, gpu_seconds: np.ndarray, window_s: float, gpus: float) -> Busy:
        """The busy fractions of ``gpu_seconds`` per window on ``gpus`` GPUs."""
        capacity = window_s * gpus
        peak_window = int(np.argmax(gpu_seconds))
        total = float(np.cumsum(gpu_seconds)[-1])
        return cls(
            peak=float(gpu_seconds[peak_window]) / capacity,
            mean=total / (capacity * len(gpu_seconds)),
            peak_window=peak_window,
            windows=len(gpu_seconds),
        )


def demand(
    requests: Sequence[Request],
    concurrency: dict[str, int],
    window_s: float = 600.0,
    gpus: dict[str, int] | None = None,
) -> Busy:
    """GPUs the requests keep busy: the busy fractions of a one-GPU pool (so ``peak``
    is the busiest window's mean GPU count), windows from time 0. A request of a
    service whose replica spans k GPUs (``gpus``, missing: 1) holds k / concurrency."""
    starts = np.fromiter((r.time for r in requests), np.float64, len(requests))
    durations = np.fromiter((r.duration for r in requests), np.float64, len(requests))
    if gpus and any(k > 1 for k in gpus.values()):
        shares = np.fromiter(
            (gpus.get(r.service, 1) / concurrency[r.service] for r in requests), np.float64
        )
    else:
        shares = np.fromiter((1.0 / concurrency[r.service] for r in requests), np.float64)
    return Busy.of(window_gpu_seconds(starts, durations, shares, 0.0, window_s), window_s, 1.0)
