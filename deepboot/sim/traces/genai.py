"""Inference streams from the Alibaba GenAI 2026 trace (``lora_request_trace.csv``).

A text-to-image serving platform: one request holds one GPU for tens of seconds, and
loading a base model onto a GPU is the cold start. A request becomes one inference task
of the service named after its base model (``checkpoint_model_version_id``), running
``exec_time_seconds``.

**What happens to each row** (counted in the summary):

* ``SUCCEED``: kept.
* ``FAILED``: kept by default. A failed request still held its GPU for its measured
  ``exec_time_seconds`` (2-20 s in the real trace) before it failed, so it is load the
  inference pool carried; dropping it would understate that load. ``drop_failed``
  drops them instead.
* ``PROCESSING``: kept. It ran; its ``exec_time_seconds`` is what it had run when the
  trace was cut (3 rows in the real trace), a lower bound.
* ``PENDING``: dropped. It never started: its execution time is 0 and no GPU served
  it (30 rows in the real trace).
* An empty ``checkpoint_model_version_id``: dropped, since no service can be named for
  it (the real trace's 25 such rows are all ``PENDING``, so they are counted there).
* ``exec_time_seconds`` of 0 on a kept row: set to :data:`MIN_DURATION_S` (0.5 s). The
  trace records whole seconds, so 0 means "under a second", and the workload loader
  refuses a duration of 0 (none of the real trace's kept rows has one; only its
  ``PENDING`` rows do).

**Service names**: the model id itself when it is a valid service name (letters, digits
and ``_.-``, starting with a letter or digit, at most 63 characters), else a sanitised
form (other characters become ``_``, made unique with ``-2``, ``-3`` ...). The service's
``model`` is always the id as written in the trace, and the services file's header
lists every renamed id. With ``top``, the ``top`` busiest models (most requests in the
window; ties by id) are services and the rest are merged into one service ``other``:
merging hides the merged models' cold starts (a replica of ``other`` serves them all).

**Window**: every kept row (``all``), the busiest ``hours`` found as a sliding window
over the arrival times (the window starting at an arrival that holds the most arrivals;
ties: the earliest; not a calendar day, since the platform's day is not GMT's), or a
window from a given start. Arrival times become seconds from the window's start,
divided by ``compress``; durations are unchanged.

**Cold starts**: each service's ``cold_start_s`` is drawn (in the order the services
are written) from the measured base-model loads (``basemodel_update_latency_anon.csv``,
``value`` in milliseconds), or the one given.

**Valid rows** (anything else is an :class:`~deepboot.core.errors.InputError` naming
the file, the line and the column): ``gmt_create`` a date and time without a zone
(``2024-11-15 16:57:50``); ``predict_status`` one of :class:`Status`;
``exec_time_seconds`` a number in [0, 1e6]; ``checkpoint_model_version_id`` empty or
text of at most 200 characters. The other columns are not read. In the load file:
``timestamp_anon`` a finite number, ``value`` a number of milliseconds in [0, 86,400,000]
(one day).
"""

from __future__ import annotations

import enum
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

from deepboot.core.errors import ConfigError
from deepboot.core.service import ServiceSpec, valid_name
from deepboot.sim.traces.common import (
    GENAI_SOURCE,
    MAX_TIME_S,
    InferenceStream,
    Request,
    demand,
    read_rows,
)

REQUEST_COLUMNS: tuple[str, ...] = (
    "gmt_create",
    "predict_status",
    "exec_time_seconds",
    "checkpoint_model_version_id",
)
"""The columns of ``lora_request_trace.csv`` that are read (the file has more)."""

LOAD_COLUMNS: tuple[str, ...] = ("timestamp_anon", "value", "container_ip")
"""The header of ``basemodel_update_latency_anon.csv``."""

MIN_DURATION_S = 0.5
"""Duration given to a kept request whose ``exec_time_seconds`` is 0."""
MAX_EXEC_S = 1e6
"""Largest ``exec_time_seconds`` accepted (about 11.6 days)."""
MAX_LOAD_MS = 86_400_000.0
"""Largest base-model load accepted (one day, in milliseconds)."""
MAX_MODEL_ID = 200
"""Longest ``checkpoint_model_version_id`` accepted."""
OTHER = "other"
"""The service the models outside ``top`` are merged into."""


class Status(enum.Enum):
    """``predict_status`` of a request."""

    SUCCEED = "SUCCEED"
    FAILED = "FAILED"
    PENDING = "PENDING"
    PROCESSING = "PROCESSING"


_STATUSES = {s.value: s for s in Status}


@dataclass(frozen=True, slots=True)
class GenaiRequest:
    """One row of ``lora_request_trace.csv`` (the columns that are read).

    Attributes:
        line: 1-based line in the file.
        arrival: ``gmt_create`` as seconds since 1970-01-01 (same clock, no zone).
        status: ``predict_status``.
        exec_s: ``exec_time_seconds``.
        model: ``checkpoint_model_version_id``; "" when empty.
    """

    line: int
    arrival: float
    status: Status
    exec_s: float
    model: str


def read_requests(path: str | Path) -> list[GenaiRequest]:
    """Read ``lora_request_trace.csv`` row by row (see the module doc for valid rows).

    Raises:
        InputError: naming the file, the line and the column.
    """
    out: list[GenaiRequest] = []
    for row in read_rows(path, "lora_request_trace.csv", REQUEST_COLUMNS):
        arrival = row.timestamp("gmt_create")
        raw_status = row.text("predict_status")
        status = _STATUSES.get(raw_status)
        if status is None:
            raise row.error(
                "predict_status", f"{raw_status[:40]!r} is not one of {', '.join(_STATUSES)}"
            )
        exec_s = row.number("exec_time_seconds", MAX_EXEC_S)
        model = row.text("checkpoint_model_version_id")
        if len(model) > MAX_MODEL_ID:
            raise row.error("checkpoint_model_version_id", f"longer than {MAX_MODEL_ID} characters")
        out.append(GenaiRequest(row.line, arrival, status, exec_s, model))
    return out


def read_load_latencies(path: str | Path) -> list[float]:
    """The measured base-model loads of ``basemodel_update_latency_anon.csv``, in
    seconds, in file order.

    Raises:
        InputError: naming the file, the line and the column.
    """
    out: list[float] = []
    for row in read_rows(path, "basemodel_update_latency_anon.csv", LOAD_COLUMNS):
        row.number("timestamp_anon", float("inf"), low=float("-inf"))
        out.append(row.number("value", MAX_LOAD_MS) / 1000.0)
    return out


@dataclass(frozen=True, slots=True)
class Window:
    """Which arrivals to keep.

    Attributes:
        busiest_hours: Keep the busiest window of this many hours (sliding over the
            arrivals); None: see ``start``.
        start: Keep arrivals from this time (seconds since 1970-01-01, the trace's
            clock); None: from the first kept arrival.
        hours: With ``start`` (or from the first arrival): keep this many hours;
            None: to the end.
    """

    busiest_hours: float | None = None
    start: float | None = None
    hours: float | None = None

    def __post_init__(self) -> None:
        for name in ("busiest_hours", "hours"):
            value = getattr(self, name)
            if value is not None and not 0 < value <= 1e5:
                raise ConfigError(f"window {name} must be in (0, 1e5] hours, got {value}")
        if self.busiest_hours is not None and (self.start is not None or self.hours is not None):
            raise ConfigError("a busiest window takes neither a start nor hours")


@dataclass(frozen=True, slots=True)
class GenaiConfig:
    """Knobs of :func:`genai_stream`.

    Attributes:
        window: The arrivals kept.
        compress: Arrival times (from the window's start) are divided by this (> 0).
        top: Keep this many busiest models as services and merge the rest into
            :data:`OTHER`; None: every model is a service.
        drop_failed: Drop ``FAILED`` rows instead of keeping them.
        cold_start_s: Every service's cold start; None: drawn from the loads.
        service_prefix: Put before every service name (to compose two streams).
    """

    window: Window = Window()
    compress: float = 1.0
    top: int | None = None
    drop_failed: bool = False
    cold_start_s: float | None = None
    service_prefix: str = ""

    def __post_init__(self) -> None:
        if not 0 < self.compress <= 1e4:
            raise ConfigError(f"compress must be in (0, 10000], got {self.compress}")
        if self.top is not None and not 1 <= self.top <= 100_000:
            raise ConfigError(f"top must be in [1, 100000], got {self.top}")
        if self.cold_start_s is not None and not 0 <= self.cold_start_s <= 86_400:
            raise ConfigError(f"cold start must be in [0, 86400] s, got {self.cold_start_s}")
        if self.service_prefix and not valid_name(self.service_prefix + "x"):
            raise ConfigError(
                f"service prefix {self.service_prefix!r}: use letters, digits and _.-, "
                "starting with a letter or digit"
            )


def genai_stream(
    trace: Sequence[GenaiRequest],
    config: GenaiConfig,
    rng: np.random.Generator,
    loads_s: Sequence[float] | None = None,
) -> InferenceStream:
    """The inference stream of a GenAI request trace (see the module doc).

    Args:
        trace: The rows (:func:`read_requests`); never mutated.
        config: Window, compression, merging and cold starts.
        rng: Draws the cold starts (unused when ``config.cold_start_s`` is set).
        loads_s: Measured model loads in seconds (:func:`read_load_latencies`); needed
            unless ``config.cold_start_s`` is set.

    Returns:
        Requests sorted by arrival (stable), services by request count (most first,
        ties by model id; ``other`` last), notes and the summary line.

    Raises:
        ConfigError: no request is left, no cold start is given or measured, or the
            compressed times exceed the workload's limit.
    """
    if config.cold_start_s is None and not loads_s:
        raise ConfigError("give a cold start, or the measured model loads to draw them from")
    status_counts = Counter(r.status for r in trace)
    dropped = {Status.PENDING} | ({Status.FAILED} if config.drop_failed else set())
    ran = [r for r in trace if r.status not in dropped]
    kept = [r for r in ran if r.model]
    if not kept:
        raise ConfigError("no request is left: every row is PENDING, dropped or has no model")
    start, end, window_text = _window(kept, config.window)
    inside = [r for r in kept if start <= r.arrival < end]
    if not inside:
        raise ConfigError(f"no request arrives in the window {window_text}")
    by_model = Counter(r.model for r in inside)
    models = sorted(by_model, key=lambda m: (-by_model[m], m))
    top = models if config.top is None else models[: config.top]
    merged = models[len(top) :]
    names = _service_names(top, config.service_prefix)
    other = ""
    if merged:
        other = _free_name(config.service_prefix + OTHER, set(names.values()))
        names.update((m, other) for m in merged)
    zero = 0
    requests: list[Request] = []
    for r in sorted(inside, key=lambda r: r.arrival):
        if r.exec_s == 0:
            zero += 1
        time = (r.arrival - start) / config.compress
        if time > MAX_TIME_S:
            raise ConfigError(f"line {r.line}: arrival {time:g} s exceeds {MAX_TIME_S:g} s")
        requests.append(Request(time, names[r.model], r.exec_s or MIN_DURATION_S))
    order = [names[m] for m in top] + ([other] if other else [])
    colds = _cold_starts(len(order), config.cold_start_s, loads_s, rng)
    specs = [
        ServiceSpec(name=name, model=model, cold_start_s=cold)
        for name, model, cold in zip(order, [*top, *([OTHER] if other else [])], colds, strict=True)
    ]
    busy = demand(requests, {s.name: s.concurrency for s in specs})
    compressed = "" if config.compress == 1 else f", time compressed x{config.compress:g}"
    cold_text = (
        f"cold start {config.cold_start_s:g} s each"
        if config.cold_start_s is not None
        else f"cold starts drawn from {len(loads_s or ())} measured base-model loads"
    )
    notes = [
        GENAI_SOURCE,
        f"Window {window_text}{compressed}; {len(requests):,} requests; {cold_text}.",
        _row_fate(status_counts, config.drop_failed, len(ran) - len(kept), zero),
    ]
    notes += [
        f"service {names[m]!r} is checkpoint_model_version_id {m!r}" for m in top if names[m] != m
    ]
    if merged:
        notes.append(
            f"service {other!r} merges {len(merged)} models (their own cold starts are "
            f"hidden): {', '.join(merged)}"
        )
    summary = (
        f"from-genai: {len(specs)} services, {len(requests):,} requests, window "
        f"{window_text}{compressed}, arrivals over {requests[-1].time / 3600:.2f} h; "
        f"{notes[2]}; demand: mean {busy.mean:.2f} GPUs, peak 10-min {busy.peak:.2f} GPUs; "
        f"{GENAI_SOURCE}"
    )
    return InferenceStream(tuple(requests), tuple(specs), tuple(notes), summary)


def _row_fate(counts: Counter[Status], drop_failed: bool, no_model: int, zero: int) -> str:
    failed = "dropped" if drop_failed else "kept"
    return (
        f"rows: {sum(counts.values()):,} read, {counts[Status.SUCCEED]:,} SUCCEED kept, "
        f"{counts[Status.FAILED]:,} FAILED {failed}, {counts[Status.PROCESSING]:,} "
        f"PROCESSING kept, {counts[Status.PENDING]:,} PENDING dropped, {no_model:,} "
        f"more without a model dropped, {zero:,} zero durations set to {MIN_DURATION_S:g} s"
    )


def _window(kept: Sequence[GenaiRequest], window: Window) -> tuple[float, float, str]:
    """``(start, end, text)``: the arrivals kept are those in ``[start, end)``."""
    arrivals = np.sort(np.fromiter((r.arrival for r in kept), np.float64, len(kept)))
    if window.busiest_hours is not None:
        width = window.busiest_hours * 3600
        counts = np.searchsorted(arrivals, arrivals + width, side="left") - np.arange(len(arrivals))
        start = float(arrivals[int(np.argmax(counts))])
        end = start + width
        return start, end, f"{_when(start)} + {window.busiest_hours:g} h (busiest)"
    start = float(arrivals[0]) if window.start is None else window.start
    if window.hours is None:
        end = float(arrivals[-1]) + 1.0
        return start, end, f"{_when(start)} .. {_when(float(arrivals[-1]))}"
    end = start + window.hours * 3600
    return start, end, f"{_when(start)} + {window.hours:g} h"


def _when(seconds: float) -> str:
    return str(datetime(1970, 1, 1) + timedelta(seconds=seconds))


_BAD = re.compile(r"[^A-Za-z0-9_.-]")


def _service_names(models: Iterable[str], prefix: str) -> dict[str, str]:
    """Model id -> a unique valid service name (see the module doc)."""
    names: dict[str, str] = {}
    for model in models:
        base = prefix + model
        if not valid_name(base):
            base = _BAD.sub("_", base)
            if not base[0].isalnum():
                base = "m" + base
        names[model] = _free_name(base[:63], set(names.values()))
    return names


def _free_name(base: str, taken: set[str]) -> str:
    """``base``, or ``base-2``, ``base-3`` ... (at most 63 characters) not in ``taken``."""
    name, n = base, 1
    while name in taken:
        n += 1
        suffix = f"-{n}"
        name = base[: 63 - len(suffix)] + suffix
    return name


def _cold_starts(
    n: int, given: float | None, loads_s: Sequence[float] | None, rng: np.random.Generator
) -> list[float]:
    if given is not None:
        return [float(given)] * n
    assert loads_s
    picks = rng.integers(len(loads_s), size=n)
    return [float(loads_s[int(i)]) for i in picks]
