"""Workload loaders: the Pollux CSV and the DeepBoot mixed training/inference CSV.

Three headers are accepted (see ``../shared/traces/README.md``), detected by the header
line:

* Pollux: ``name,time,application,num_replicas,batch_size``: training jobs only.
* Pollux with durations: the same plus ``duration`` (``pure_train.csv``): training jobs
  only; the duration column is ignored.
* DeepBoot: the same plus ``duration,num_task``. Rows whose application is
  ``infer-<model>-<k>`` are inference tasks; all others are training jobs, whose
  ``duration`` and ``num_task`` columns are ignored. Read with a services file
  (:mod:`deepboot.sim.services`), a row whose application starts with ``infer-`` is
  an inference task of the service named by the rest, which must be one of the
  file's; its model is the service's (a label, not a catalog entry).

Any of the three may be followed by the optional per-job resize columns, in either
order (:data:`RESIZE_COLUMNS`): ``resize`` (``afe`` or ``restart``; empty: ``afe``,
the default) and ``restart_cost`` (seconds >= 0 of one full restart of a ``restart``
job; empty: what the run's restart-cost model charges a start of its application).
They fill ``TrainingJobSpec.resize`` and ``restart_cost``; inference rows leave them
empty.

Every bad input raises :class:`~deepboot.core.errors.InputError` naming the file, the
1-based line and the column; nothing is half-loaded.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import re
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from deepboot.core.errors import InputError, csv_read_errors
from deepboot.core.jobs import (
    RESIZE_MODES,
    InferenceTaskSpec,
    ResizeMode,
    TrainingJobSpec,
    Workload,
)
from deepboot.core.params import BatchLimits
from deepboot.core.service import ServiceSpec
from deepboot.sim.services import INFER_PREFIX, ServicesFile

POLLUX_COLUMNS: tuple[str, ...] = ("name", "time", "application", "num_replicas", "batch_size")
"""Header of a Pollux workload (training jobs only)."""

PURE_TRAIN_COLUMNS: tuple[str, ...] = (*POLLUX_COLUMNS, "duration")
"""Header of DeepBoot's ``pure_train.csv`` (training jobs; duration unused)."""

DEEPBOOT_COLUMNS: tuple[str, ...] = (*POLLUX_COLUMNS, "duration", "num_task")
"""Header of a DeepBoot mixed workload (training jobs and inference tasks)."""

RESIZE_COLUMNS: tuple[str, ...] = ("resize", "restart_cost")
"""Optional columns after any of the headers: each training job's resize mode and
restart cost (see the module docstring)."""

_HEADERS: tuple[tuple[str, ...], ...] = (POLLUX_COLUMNS, PURE_TRAIN_COLUMNS, DEEPBOOT_COLUMNS)

_INFER_RE = re.compile(r"infer-(?P<model>.+)-(?P<k>\d+)")


@dataclass(frozen=True, slots=True)
class _Row:
    """One data row with where it came from, so every parse error can point at it."""

    path: str
    line: int
    values: dict[str, str]

    def error(self, column: str, message: str) -> InputError:
        return InputError(self.path, self.line, column, message)

    def text(self, column: str) -> str:
        value = self.values[column].strip()
        if not value:
            raise self.error(column, "is empty")
        return value

    def number(self, column: str, *, allow_zero: bool = True) -> float:
        raw = self.text(column)
        try:
            value = float(raw)
        except ValueError:
            raise self.error(column, f"{raw!r} is not a number") from None
        if not math.isfinite(value):
            raise self.error(column, f"{raw!r} is not a finite number")
        if value < 0 or (value == 0 and not allow_zero):
            bound = "non-negative" if allow_zero else "positive"
            raise self.error(column, f"{raw} must be {bound}")
        return value

    def bounded(self, column: str, top: float, *, allow_zero: bool = True) -> float:
        """:meth:`number`, and at most ``top``."""
        value = self.number(column, allow_zero=allow_zero)
        if value > top:
            raise self.error(column, f"{self.values[column].strip()} exceeds the limit {top:g}")
        return value

    def positive_int(self, column: str) -> int:
        raw = self.text(column)
        try:
            value = int(raw)
        except ValueError:
            raise self.error(column, f"{raw!r} is not an integer") from None
        if value <= 0:
            raise self.error(column, f"{raw} must be a positive integer")
        return value

    def optional(self, column: str) -> str:
        """The stripped value of an optional column ("" when empty or absent)."""
        return self.values.get(column, "").strip()

    def resize(self) -> ResizeMode:
        """The row's resize mode (``afe`` when the column is empty or absent)."""
        raw = self.optional("resize").lower()
        if not raw:
            return "afe"
        for mode in RESIZE_MODES:
            if raw == mode:
                return mode
        raise self.error("resize", f"{raw!r} is not a resize mode; use {' or '.join(RESIZE_MODES)}")

    def restart_cost(self, resize: ResizeMode) -> float | None:
        """The row's restart cost in seconds (None when empty or absent).

        Raises:
            InputError: not a number, negative, over the limit, or given on a row
                whose resize mode is not ``restart``.
        """
        if not self.optional("restart_cost"):
            return None
        if resize != "restart":
            raise self.error(
                "restart_cost",
                "is for resize=restart rows only (an AFE job's resizes are priced by "
                "the restart-cost model); leave it empty or set resize to restart",
            )
        return self.bounded("restart_cost", MAX_TIME_S)

    def count(self, column: str, top: float) -> int:
        """A non-negative integer up to ``top``; integral floats such as ``"530.0"`` are
        accepted."""
        value = self.bounded(column, top)
        if value != int(value):
            raise self.error(column, f"{self.values[column].strip()} is not a whole number")
        return int(value)


MAX_TIME_S = 1e9
"""Largest submission time or task duration accepted (about 31 years): virtual times
beyond it lose the sub-second precision the engine's clock needs."""

MAX_REPLICAS = 4096
"""Most GPUs one training row may ask for."""


def load_workload(
    path: str | Path,
    known_apps: Collection[str],
    limits: Mapping[str, BatchLimits] | None = None,
    services: ServicesFile | None = None,
) -> Workload:
    """Load a Pollux or DeepBoot workload CSV.

    Valid ranges (anything else is an :class:`InputError` naming the row and column):
    ``time`` in [0, 1e9] s; training ``num_replicas`` in [1, 4096] and ``batch_size``
    in [1, the model's ``max_batch_size``] (when ``limits`` are given); inference
    rows run one task on one GPU, so their ``num_replicas`` and ``batch_size`` are 1,
    ``duration`` in (0, 1e9] s and ``num_task`` in [0, 1e9]. The optional ``resize``
    column holds ``afe`` (default, also when empty) or ``restart``; ``restart_cost``
    is empty or in [0, 1e9] s, on ``restart`` rows only; both are empty on inference
    rows.

    Args:
        path: The CSV file. Its stem becomes the workload's name.
        known_apps: Model names the caller can simulate (catalog or profile keys).
            Training rows and inference services must name one of them.
        limits: Batch limits per model, to check each training row's batch size.
        services: A services file: inference rows name its services
            (``infer-<service>``) instead of ``infer-<model>-<k>``; the workload keeps
            the specs of those it uses (``Workload.services``).

    Returns:
        A :class:`Workload` whose training jobs and inference tasks are each sorted by
        submit time (stable: rows submitted at the same second keep file order).

    Raises:
        InputError: the file is missing or unreadable, empty, has only a header or an
            unknown header, or a row is malformed (wrong column count, non-numeric or
            negative time, non-positive replicas or batch size, unknown model or
            service, duplicate name, a bad resize mode or restart cost). The error
            names the file, the 1-based line and the column; a used service without
            ``cold_start_s`` names the services file, the service's line and
            ``cold_start_s``.
    """
    p = Path(path)
    spath = str(path)
    known = frozenset(known_apps)
    training: list[TrainingJobSpec] = []
    inference: list[InferenceTaskSpec] = []
    used: dict[str, ServiceSpec] = {}
    seen: dict[str, int] = {}
    for row in _rows(p, spath):
        name = row.text("name")
        if name in seen:
            raise row.error("name", f"duplicate job name {name!r} (first on line {seen[name]})")
        seen[name] = row.line
        time = row.bounded("time", MAX_TIME_S)
        application = row.text("application")
        if services is not None:
            if application.startswith(INFER_PREFIX) and "num_task" in row.values:
                service = application[len(INFER_PREFIX) :]
                spec = used.get(service)
                if spec is None:
                    if service not in services.specs:
                        raise row.error(
                            "application",
                            f"{service!r} is not a service of {services.path}; {services.known()}",
                        )
                    spec = services.for_simulation(service, f"{spath} line {row.line}")
                    used[service] = spec
                inference.append(_task(row, name, time, service, spec.model))
                continue
            match = None
        else:
            match = _INFER_RE.fullmatch(application)
        if match is not None and "num_task" in row.values:
            model = match.group("model")
            if model not in known:
                raise row.error(
                    "application", f"unknown model {model!r} in {application!r}; {_known(known)}"
                )
            inference.append(_task(row, name, time, application, model))
            continue
        if application not in known:
            hint = ""
            if match is not None or (services is not None and application.startswith(INFER_PREFIX)):
                hint = " (inference rows need the DeepBoot header with duration,num_task)"
            raise row.error("application", f"unknown model {application!r}{hint}; {_known(known)}")
        replicas = row.positive_int("num_replicas")
        if replicas > MAX_REPLICAS:
            raise row.error("num_replicas", f"{replicas} exceeds the limit of {MAX_REPLICAS} GPUs")
        batch = row.positive_int("batch_size")
        lim = None if limits is None else limits.get(application)
        if lim is not None and batch > lim.max_batch_size:
            raise row.error(
                "batch_size",
                f"{batch} exceeds {application}'s largest batch size {lim.max_batch_size}",
            )
        resize = row.resize()
        training.append(
            TrainingJobSpec(
                name=name,
                submit_time=time,
                application=application,
                num_replicas=replicas,
                batch_size=batch,
                resize=resize,
                restart_cost=row.restart_cost(resize),
            )
        )
    training.sort(key=lambda j: j.submit_time)
    inference.sort(key=lambda t: t.submit_time)
    return Workload(
        name=p.stem,
        training=tuple(training),
        inference=tuple(inference),
        services=tuple(used.values()),
    )


def _task(row: _Row, name: str, time: float, service: str, model: str) -> InferenceTaskSpec:
    """The inference task of ``row`` (its replicas and batch size must be 1, its resize
    columns empty)."""
    for column in ("num_replicas", "batch_size"):
        if row.positive_int(column) != 1:
            raise row.error(column, "must be 1 for an inference row (each task runs on one GPU)")
    for column in RESIZE_COLUMNS:
        if row.optional(column):
            raise row.error(column, "must be empty for an inference row (it holds no training job)")
    return InferenceTaskSpec(
        name=name,
        submit_time=time,
        service=service,
        model=model,
        duration=row.bounded("duration", MAX_TIME_S, allow_zero=False),
        num_task=row.count("num_task", MAX_TIME_S),
    )


def _known(known: frozenset[str]) -> str:
    return "known models: " + (", ".join(sorted(known)) if known else "(none)")


def _rows(p: Path, spath: str) -> Iterator[_Row]:
    """Yield the data rows of ``p``; blank lines are skipped.

    Raises:
        InputError: missing/unreadable file, empty file, unknown header, header only,
            or a row with the wrong number of values.
    """
    # utf-8-sig: spreadsheets often save a byte-order mark before the header.
    with (
        csv_read_errors(spath, "a workload CSV file"),
        p.open(newline="", encoding="utf-8-sig") as f,
    ):
        reader = csv.reader(f)
        header = _header(reader, spath)
        any_row = False
        for values in reader:
            if not values or all(not v.strip() for v in values):
                continue
            any_row = True
            line = reader.line_num
            if len(values) != len(header):
                raise InputError(spath, line, *_count_problem(header, values))
            yield _Row(spath, line, dict(zip(header, values, strict=True)))
    if not any_row:
        raise InputError(spath, 1, "header", "the file has a header but no rows: no jobs")


def _header(reader: Iterator[list[str]], spath: str) -> tuple[str, ...]:
    for values in reader:
        if not values or all(not v.strip() for v in values):
            continue
        header = tuple(v.strip() for v in values)
        # The longest known header the line starts with; the rest optional columns.
        base = max((h for h in _HEADERS if header[: len(h)] == h), key=len, default=None)
        extra = header[len(base) :] if base is not None else ()
        if base is not None and all(c in RESIZE_COLUMNS for c in extra):
            if len(set(extra)) == len(extra):
                return header
            twice = next(c for i, c in enumerate(extra) if c in extra[:i])
            line = getattr(reader, "line_num", 1)
            raise InputError(spath, line, twice, "the column appears twice in the header")
        expected = " | ".join(",".join(h) for h in _HEADERS)
        expected += f"; optionally followed by {' and/or '.join(RESIZE_COLUMNS)}"
        field = next(
            (
                c
                for i, c in enumerate(header)
                if i >= len(DEEPBOOT_COLUMNS) or c != DEEPBOOT_COLUMNS[i]
            ),
            header[-1],
        )
        line = getattr(reader, "line_num", 1)
        raise InputError(spath, line, field, f"unknown header; expected one of: {expected}")
    raise InputError(spath, 1, "header", "the file is empty; expected a CSV header line")


def _count_problem(header: Sequence[str], values: Sequence[str]) -> tuple[str, str]:
    """(column, message) for a row with the wrong number of values."""
    n, m = len(values), len(header)
    if n < m:
        return header[n], f"missing: the row has {n} values, the header {m}"
    return header[-1], f"the row has {n} values, the header {m}: extra values after it"


def jitter_submissions(workload: Workload, rng: np.random.Generator, jitter_s: float) -> Workload:
    """A copy of ``workload`` whose every submission time moved by a uniform draw in
    [-jitter_s, jitter_s] (clamped at 0), training jobs first, then inference tasks,
    each in workload order; both kept sorted by time (stable).

    Raises:
        ValueError: ``jitter_s`` is negative or not finite.
    """
    if not (math.isfinite(jitter_s) and jitter_s >= 0):
        raise ValueError(f"jitter must be a finite number >= 0; got {jitter_s}")
    n_train, n_infer = len(workload.training), len(workload.inference)
    shifts = rng.uniform(-jitter_s, jitter_s, size=n_train + n_infer)
    training = [
        dataclasses.replace(j, submit_time=max(j.submit_time + float(d), 0.0))
        for j, d in zip(workload.training, shifts[:n_train], strict=True)
    ]
    inference = [
        dataclasses.replace(t, submit_time=max(t.submit_time + float(d), 0.0))
        for t, d in zip(workload.inference, shifts[n_train:], strict=True)
    ]
    training.sort(key=lambda j: j.submit_time)
    inference.sort(key=lambda t: t.submit_time)
    return dataclasses.replace(workload, training=tuple(training), inference=tuple(inference))
