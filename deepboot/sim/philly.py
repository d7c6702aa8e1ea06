"""Generate training workloads from the Microsoft Philly trace (``philly.csv``).

Follows the reference generator of the Pollux artifact (``simulator/workload.py`` in
petuum/adaptdl) in spirit:

1. Keep Philly jobs that ran at least ``min_duration_s`` and used less than the largest
   GPU-time bound of the model table.
2. Fold every day onto one: a job's arrival is its time of day. Keep the jobs that
   arrive inside a window of ``hours`` hours starting at ``start_hour`` (by default the
   busiest such window of the folded day).
3. Sample ``jobs`` of them without replacement.
4. Map each sampled job to a model by its GPU-time class (:data:`PHILLY_MODEL_TABLE`),
   then pick the user's ``(num_replicas, batch_size)`` uniformly among that model's
   configurations.

The configurations are the ones the reference generator derives from the measured
traces (replica counts whose scaling efficiency lies between 50% and 80% on a 16 x 4
cluster, with the fastest validated batch size); they are written out here as a typed
table so that generation needs nothing but this module and the trace.

All randomness comes from the injected :class:`numpy.random.Generator`.

**Valid rows** of ``philly.csv`` (anything else stops with one
:class:`~deepboot.core.errors.InputError` naming the file, the 1-based line and the
column): ``timestamp`` an ISO date and time (``2017-10-09 07:01:55``); ``duration`` a
finite number of seconds in [0, 365 days] (0 is a job that failed at once, and is
dropped by the ``min_duration_s`` filter; the real trace's longest job ran about 54 days);
``num_gpus`` a whole number in [1, 4096] (the trace's largest job used 128);
``gpu_time`` a finite number of GPU-seconds in [0, 365 days x 4096 GPUs]; ``cluster``
any text. ``gpu_time`` is ``duration x num_gpus`` in the real trace, but is not checked
against them: it only picks a job's model class, and synthetic traces set it on its own
to steer the model mix.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np

from deepboot.core.errors import ConfigError, InputError, csv_read_errors
from deepboot.core.jobs import TrainingJobSpec
from deepboot.sim.workload import POLLUX_COLUMNS, RESIZE_COLUMNS

PHILLY_COLUMNS: tuple[str, ...] = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")
"""Header of ``philly.csv``."""

_DAY_S = 24 * 3600

MAX_DURATION_S = 365.0 * _DAY_S
"""Longest Philly job accepted: one year."""
MAX_GPUS = 4096
"""Most GPUs one Philly job may have used."""
MAX_GPU_TIME_S = MAX_DURATION_S * MAX_GPUS
"""Largest ``gpu_time`` accepted (GPU-seconds)."""


@dataclass(frozen=True, slots=True)
class PhillyJob:
    """One row of ``philly.csv``.

    Attributes:
        line: 1-based line in the source file (for error messages).
        timestamp: Submission time.
        duration: Run time in seconds.
        num_gpus: GPUs the job used.
        gpu_time: GPU-seconds (duration x GPUs).
        cluster: Virtual cluster id.
    """

    line: int
    timestamp: datetime
    duration: float
    num_gpus: int
    gpu_time: float
    cluster: str

    @property
    def second_of_day(self) -> int:
        t = self.timestamp
        return t.hour * 3600 + t.minute * 60 + t.second


@dataclass(frozen=True, slots=True)
class JobConfig:
    """A user's request: total GPUs and total batch size."""

    num_replicas: int
    batch_size: int


@dataclass(frozen=True, slots=True)
class ModelChoice:
    """A model a GPU-time class maps to, with its relative weight and configurations."""

    model: str
    weight: float
    configs: tuple[JobConfig, ...]


@dataclass(frozen=True, slots=True)
class GpuTimeClass:
    """Philly jobs with ``gpu_time < max_gpu_hours`` hours (and above the class before)."""

    max_gpu_hours: float
    choices: tuple[ModelChoice, ...]


def _configs(*pairs: tuple[int, int]) -> tuple[JobConfig, ...]:
    return tuple(JobConfig(r, b) for r, b in pairs)


CIFAR10 = _configs((6, 2048), (8, 2048), (12, 4096), (16, 4096))
NCF = _configs((1, 32768))
DEEPSPEECH2 = _configs((6, 320), (8, 320), (12, 640))
BERT = _configs((6, 384), (8, 384), (12, 384), (16, 384))
YOLOV3 = _configs((4, 64))
IMAGENET = _configs((24, 3200), (32, 6400), (48, 6400))

PHILLY_MODEL_TABLE: tuple[GpuTimeClass, ...] = (
    # Short jobs (< 1 GPU-hour): small image classification or recommendation, 50/50.
    GpuTimeClass(1.0, (ModelChoice("cifar10", 0.5, CIFAR10), ModelChoice("ncf", 0.5, NCF))),
    # Medium jobs (< 10 GPU-hours): speech or language models, 50/50. The reference
    # draws deepspeech2 and turns half of them into bert.
    GpuTimeClass(
        10.0, (ModelChoice("deepspeech2", 0.5, DEEPSPEECH2), ModelChoice("bert", 0.5, BERT))
    ),
    # Long jobs (< 100 GPU-hours): object detection.
    GpuTimeClass(100.0, (ModelChoice("yolov3", 1.0, YOLOV3),)),
    # Very long jobs (< 1000 GPU-hours): ImageNet. Longer Philly jobs are dropped.
    GpuTimeClass(1000.0, (ModelChoice("imagenet", 1.0, IMAGENET),)),
)
"""Philly GPU-time class -> model mix and each model's ``(num_replicas, batch_size)``
configurations. Classes are ordered by ascending bound; a job falls in the first class
whose bound exceeds its GPU-hours. Jobs at or above the last bound are not sampled."""


@dataclass(frozen=True, slots=True)
class PhillyConfig:
    """Knobs of the generator.

    Attributes:
        min_duration_s: Drop Philly jobs shorter than this (failed or trivial runs).
        start_hour: First hour of the day of the window; None picks the busiest
            window of ``hours`` hours (on the whole hour) after filtering.
        table: The GPU-time class -> model table.
    """

    min_duration_s: float = 60.0
    start_hour: int | None = None
    table: tuple[GpuTimeClass, ...] = field(default=PHILLY_MODEL_TABLE)

    def __post_init__(self) -> None:
        if self.min_duration_s < 0:
            raise ConfigError(f"min_duration_s must be >= 0, got {self.min_duration_s}")
        if self.start_hour is not None and not 0 <= self.start_hour < 24:
            raise ConfigError(f"start hour must be in [0, 23], got {self.start_hour}")
        if not self.table:
            raise ConfigError("the philly model table is empty")
        bounds = [c.max_gpu_hours for c in self.table]
        if bounds != sorted(bounds) or len(set(bounds)) != len(bounds):
            raise ConfigError("philly model table classes must have strictly ascending bounds")
        for cls in self.table:
            if not cls.choices or any(c.weight <= 0 or not c.configs for c in cls.choices):
                raise ConfigError(
                    f"class < {cls.max_gpu_hours} GPU-hours needs models with positive "
                    "weights and at least one configuration each"
                )


def read_philly(path: str | Path) -> list[PhillyJob]:
    """Parse ``philly.csv``; blank lines are skipped.

    Raises:
        InputError: missing or unreadable file, wrong header, or a malformed row
            (wrong column count, or a value outside the ranges in the module doc),
            naming the line and the column.
    """
    spath = str(path)
    jobs: list[PhillyJob] = []
    with (
        csv_read_errors(spath, "philly.csv"),
        Path(path).open(newline="", encoding="utf-8-sig") as f,
    ):
        reader = csv.reader(f)
        # Blank lines are skipped, before the header too.
        header = next((v for v in reader if any(c.strip() for c in v)), None)
        if header is None:
            raise InputError(spath, 1, "header", "the file is empty; expected a header")
        head_line = reader.line_num
        if tuple(h.strip() for h in header) != PHILLY_COLUMNS:
            raise InputError(
                spath, head_line, "header", f"expected header {','.join(PHILLY_COLUMNS)}"
            )
        for values in reader:
            if not values or all(not v.strip() for v in values):
                continue
            jobs.append(_parse_philly_row(spath, reader.line_num, values))
    if not jobs:
        raise InputError(spath, head_line, "header", "the file has a header but no rows")
    return jobs


def _parse_philly_row(spath: str, line: int, values: Sequence[str]) -> PhillyJob:
    if len(values) != len(PHILLY_COLUMNS):
        col = PHILLY_COLUMNS[min(len(values), len(PHILLY_COLUMNS) - 1)]
        raise InputError(
            spath, line, col, f"the row has {len(values)} values, expected {len(PHILLY_COLUMNS)}"
        )
    ts_raw, dur_raw, gpus_raw, gpu_time_raw, cluster = (v.strip() for v in values)

    def shown(raw: str) -> str:
        return repr(raw if len(raw) <= 40 else raw[:37] + "...")

    try:
        timestamp = datetime.fromisoformat(ts_raw)
    except ValueError:
        raise InputError(
            spath, line, "timestamp", f"{shown(ts_raw)} is not a timestamp like 2017-10-09 07:01:55"
        ) from None

    def non_negative(column: str, raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise InputError(spath, line, column, f"{shown(raw)} is not a number") from None
        if not math.isfinite(value) or value < 0:
            raise InputError(spath, line, column, f"{shown(raw)} must be a non-negative number")
        return value

    duration = non_negative("duration", dur_raw)
    if duration > MAX_DURATION_S:
        raise InputError(
            spath,
            line,
            "duration",
            f"{shown(dur_raw)} s exceeds the limit of {MAX_DURATION_S:g} s (365 days)",
        )
    gpu_time = non_negative("gpu_time", gpu_time_raw)
    if gpu_time > MAX_GPU_TIME_S:
        raise InputError(
            spath,
            line,
            "gpu_time",
            f"{shown(gpu_time_raw)} GPU-seconds exceed the limit of {MAX_GPU_TIME_S:g} "
            f"(365 days on {MAX_GPUS} GPUs)",
        )
    try:
        num_gpus = int(gpus_raw)
    except ValueError:
        raise InputError(spath, line, "num_gpus", f"{shown(gpus_raw)} is not an integer") from None
    if num_gpus <= 0:
        raise InputError(spath, line, "num_gpus", f"{shown(gpus_raw)} must be a positive integer")
    if num_gpus > MAX_GPUS:
        raise InputError(
            spath, line, "num_gpus", f"{shown(gpus_raw)} exceeds the limit of {MAX_GPUS} GPUs"
        )
    return PhillyJob(line, timestamp, duration, num_gpus, gpu_time, cluster)


def busiest_start_hour(seconds_of_day: Iterable[int], hours: float) -> int:
    """The whole hour at which a window of ``hours`` hours holds the most arrivals.

    The day wraps around (a window may start at 22:00 and end at 06:00). Ties go to
    the earliest hour.

    Args:
        seconds_of_day: Arrival second of each job within its day, in [0, 86400).
        hours: Window length in hours, in (0, 24].
    """
    arrivals = np.fromiter(seconds_of_day, dtype=np.int64)
    best_hour, best_count = 0, -1
    width = int(round(hours * 3600))
    for hour in range(24):
        offset = (arrivals - hour * 3600) % _DAY_S
        count = int(np.count_nonzero(offset < width))
        if count > best_count:
            best_hour, best_count = hour, count
    return best_hour


def generate_from_philly(
    philly_path: str | Path,
    jobs: int,
    hours: float,
    rng: np.random.Generator,
    config: PhillyConfig | None = None,
) -> list[TrainingJobSpec]:
    """Generate a training workload from the Philly trace at ``philly_path``.

    Args:
        philly_path: ``philly.csv`` (``timestamp,duration,num_gpus,gpu_time,cluster``).
        jobs: How many jobs to generate (> 0).
        hours: Length of the submission window in hours, in (0, 24].
        rng: The only source of randomness; the same seed gives the same workload.
        config: Filter, window and model table; defaults to :class:`PhillyConfig`.

    Returns:
        ``jobs`` training jobs sorted by submit time, named ``<model>-<index>``, with
        submit times in ``[0, hours * 3600)`` seconds from the window start.

    Raises:
        InputError: the trace is missing or malformed (see :func:`read_philly`).
        ConfigError: ``jobs`` or ``hours`` is out of range, or the window holds fewer
            eligible Philly jobs than requested.
    """
    return generate_from_jobs(read_philly(philly_path), jobs, hours, rng, config)


def generate_from_jobs(
    trace: Sequence[PhillyJob],
    jobs: int,
    hours: float,
    rng: np.random.Generator,
    config: PhillyConfig | None = None,
) -> list[TrainingJobSpec]:
    """:func:`generate_from_philly` on already-parsed Philly rows (never mutated)."""
    cfg = config or PhillyConfig()
    if jobs <= 0:
        raise ConfigError(f"--jobs must be positive, got {jobs}")
    if not 0 < hours <= 24:
        raise ConfigError(f"--hours must be in (0, 24] (days are folded onto one), got {hours}")
    limit_s = cfg.table[-1].max_gpu_hours * 3600
    eligible = [j for j in trace if j.duration >= cfg.min_duration_s and j.gpu_time < limit_s]
    start = cfg.start_hour
    if start is None:
        start = busiest_start_hour((j.second_of_day for j in eligible), hours)
    width = hours * 3600
    offsets = [(j.second_of_day - start * 3600) % _DAY_S for j in eligible]
    window = [(off, j) for off, j in zip(offsets, eligible, strict=True) if off < width]
    if len(window) < jobs:
        raise ConfigError(
            f"only {len(window)} Philly jobs arrive in the {hours} h window from "
            f"{start:02d}:00; asked for {jobs}"
        )
    picked = rng.choice(len(window), size=jobs, replace=False)
    drafts: list[tuple[float, str, JobConfig]] = []
    for i in picked:
        offset, job = window[int(i)]
        model, conf = _pick_model(job.gpu_time / 3600, cfg.table, rng)
        drafts.append((float(offset), model, conf))
    drafts.sort(key=lambda d: d[0])
    return [
        TrainingJobSpec(
            name=f"{model}-{idx}",
            submit_time=time,
            application=model,
            num_replicas=conf.num_replicas,
            batch_size=conf.batch_size,
        )
        for idx, (time, model, conf) in enumerate(drafts)
    ]


def _pick_model(
    gpu_hours: float, table: Sequence[GpuTimeClass], rng: np.random.Generator
) -> tuple[str, JobConfig]:
    cls = next(c for c in table if gpu_hours < c.max_gpu_hours)
    weights = np.array([c.weight for c in cls.choices], dtype=np.float64)
    choice = cls.choices[int(rng.choice(len(cls.choices), p=weights / weights.sum()))]
    conf = choice.configs[int(rng.integers(len(choice.configs)))]
    return choice.model, conf


def write_workload_csv(path: str | Path, jobs: Iterable[TrainingJobSpec]) -> None:
    """Write training jobs as a Pollux workload CSV (``name,time,application,...``).

    Whole-second submit times are written as integers. When some job is not an AFE
    job with no restart cost (the defaults), the ``resize,restart_cost`` columns
    follow (:data:`~deepboot.sim.workload.RESIZE_COLUMNS`). The file is readable by
    :func:`deepboot.sim.workload.load_workload`.

    Raises:
        OSError: the file cannot be written.
    """
    rows = list(jobs)
    resize = any(j.resize != "afe" or j.restart_cost is not None for j in rows)
    with Path(path).open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow((*POLLUX_COLUMNS, *RESIZE_COLUMNS) if resize else POLLUX_COLUMNS)
        for j in rows:
            t = j.submit_time
            time = str(int(t)) if float(t).is_integer() else repr(float(t))
            row: tuple[object, ...] = (j.name, time, j.application, j.num_replicas, j.batch_size)
            if resize:
                cost = "" if j.restart_cost is None else repr(float(j.restart_cost))
                row = (*row, j.resize, cost)
            writer.writerow(row)
