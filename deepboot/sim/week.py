"""A week of a large shared cluster: Philly's arrivals scaled to a stated training load.

:func:`training_week` draws the training side of ``deepboot workload week`` (the
inference side is the GenAI trace's services, composed by
:mod:`deepboot.sim.traces.compose`):

1. Keep the Philly jobs the Pollux generator keeps (:class:`~deepboot.sim.philly.
   PhillyConfig`: long enough, below the largest GPU-time class), and the span of
   ``days`` whole days (from midnight) in which the most of them arrive: the week's
   shape (its days and nights, its weekdays and weekend) is Philly's own.
2. Draw jobs from that span with replacement, each at its Philly arrival plus a
   uniform offset below one minute (the copies of one arrival spread), mapped to a
   model and a user request by its GPU time as the Pollux generator maps them, until
   the jobs' *nominal* GPU-hours reach ``load`` times the training pool's GPU-hours
   over the days. More jobs than Philly had arrive at the same times of day.

A job's nominal GPU time is what it takes at its user's own request (``num_replicas``
GPUs, packed on nodes of ``node_gpus``, its ``batch_size`` with the least
accumulation the per-GPU limit allows), alone, on its model's ground truth
(:func:`nominal_gpu_seconds`): a measure of the load offered, not of what an elastic
policy will use (Pollux's and DeepBoot's batch sizes adapt).

All randomness comes from the injected generator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np

from deepboot.core.errors import ConfigError
from deepboot.core.jobs import TrainingJobSpec
from deepboot.perf.application import Application
from deepboot.sim.philly import JobConfig, PhillyConfig, PhillyJob, _pick_model

_DAY_S = 86_400.0
JITTER_S = 60.0
"""Copies of one Philly arrival spread uniformly over this many seconds after it."""
MAX_JOBS = 1_000_000
"""Most jobs one week may hold (a guard against a load no cluster runs)."""


@dataclass(frozen=True, slots=True)
class WeekConfig:
    """Knobs of :func:`training_week`.

    Attributes:
        days: Whole days of arrivals, in [1, 28].
        training_gpus: GPUs of the training pool (>= 1).
        node_gpus: GPUs per node (a request's packing, for its nominal time).
        load: Nominal training GPU-hours over the training pool's, in (0, 4].
        philly: The Philly filter and model table.
    """

    days: int = 7
    training_gpus: int = 512
    node_gpus: int = 4
    load: float = 0.8
    philly: PhillyConfig = PhillyConfig()

    def __post_init__(self) -> None:
        if not 1 <= self.days <= 28:
            raise ConfigError(f"days must be in [1, 28], got {self.days}")
        if self.training_gpus < 1 or self.node_gpus < 1:
            raise ConfigError("the training pool needs at least one GPU on nodes of one or more")
        if not (math.isfinite(self.load) and 0 < self.load <= 4):
            raise ConfigError(f"load must be in (0, 4], got {self.load}")


@dataclass(frozen=True, slots=True)
class TrainingWeek:
    """What :func:`training_week` drew.

    Attributes:
        jobs: Sorted by submit time, named ``<model>-<index>``.
        start: Midnight of the first day of Philly's span (the trace's clock).
        philly_jobs: Philly's own jobs in that span (after the filter).
        nominal_gpu_hours: The jobs' nominal GPU-hours (the load offered).
        capacity_gpu_hours: The training pool's GPU-hours over the days.
    """

    jobs: tuple[TrainingJobSpec, ...]
    start: datetime
    philly_jobs: int
    nominal_gpu_hours: float
    capacity_gpu_hours: float

    @property
    def load(self) -> float:
        """The nominal load reached (just above the one asked for)."""
        return self.nominal_gpu_hours / self.capacity_gpu_hours


def _shape(replicas: int, node_gpus: int) -> tuple[int, ...]:
    full, rest = divmod(replicas, node_gpus)
    return (node_gpus,) * full + ((rest,) if rest else ())


def nominal_gpu_seconds(app: Application, conf: JobConfig, node_gpus: int) -> float:
    """GPU-seconds ``app`` takes to finish at ``conf`` alone (module docstring).

    Each epoch runs at its ground-truth rate, ``gain / (step + (step - sync) *
    accum)`` (the simulator's, at a fixed batch): the progress of the epoch over it.

    Raises:
        ConfigError: the request's batch cannot run on its GPUs (a per-GPU batch below
            the model's smallest), or its rate is not positive.
    """
    limits = app.limits
    replicas, batch = conf.num_replicas, conf.batch_size
    local = batch / replicas
    accum = max(math.ceil(local / limits.max_local_bsz) - 1, 0)
    atomic = math.ceil(local / (accum + 1))
    if atomic < limits.min_local_bsz:
        atomic = limits.min_local_bsz
    shape = _shape(replicas, node_gpus)
    total = replicas * atomic * (accum + 1)
    step, sync = app.step_time(shape, atomic)
    seconds = 0.0
    for epoch in range(app.max_epochs):
        sqr, var = app.grad_stats(total, epoch)
        scale = total / limits.init_batch_size
        denom = var / scale + sqr
        gain = (var + sqr) / denom if denom > 0 else 1.0
        rate = gain / (step + (step - sync) * accum)
        if not (math.isfinite(rate) and rate > 0):
            raise ConfigError(f"{app.name} at {replicas} GPUs, batch {batch}: no progress")
        seconds += (app.progress_at(epoch + 1) - app.progress_at(epoch)) / rate
    return seconds * replicas


def busiest_days(times: Sequence[datetime], days: int) -> datetime:
    """Midnight of the first of the ``days`` consecutive days with the most arrivals
    (ties: the earliest)."""
    if not times:
        raise ConfigError("no Philly job is left after the filter")
    first = min(times).replace(hour=0, minute=0, second=0, microsecond=0)
    index = np.array([(t - first).days for t in times], dtype=np.int64)
    per_day = np.bincount(index)
    if len(per_day) <= days:
        return first
    window = np.convolve(per_day, np.ones(days, dtype=np.int64), mode="valid")
    return first + timedelta(days=int(np.argmax(window)))


def training_week(
    trace: Sequence[PhillyJob],
    apps: Mapping[str, Application],
    config: WeekConfig,
    rng: np.random.Generator,
) -> TrainingWeek:
    """The training jobs of a week (see the module docstring).

    Args:
        trace: Philly's rows (:func:`~deepboot.sim.philly.read_philly`); never mutated.
        apps: Each model's ground truth (the nominal GPU times).
        config: Days, pool and load.
        rng: The only source of randomness.

    Raises:
        ConfigError: no Philly job in the span, a model missing from ``apps``, or the
            load needs more than :data:`MAX_JOBS` jobs.
    """
    cfg = config.philly
    limit_s = cfg.table[-1].max_gpu_hours * 3600
    eligible = [j for j in trace if j.duration >= cfg.min_duration_s and j.gpu_time < limit_s]
    start = busiest_days([j.timestamp for j in eligible], config.days)
    span = config.days * _DAY_S
    offsets: list[tuple[float, PhillyJob]] = []
    for job in eligible:
        off = (job.timestamp - start).total_seconds()
        if 0 <= off < span:
            offsets.append((off, job))
    if not offsets:
        raise ConfigError(f"no Philly job arrives in the {config.days} days from {start}")
    target = config.load * config.training_gpus * span
    nominal: dict[tuple[str, JobConfig], float] = {}
    drafts: list[tuple[float, str, JobConfig]] = []
    offered = 0.0
    while offered < target:
        if len(drafts) >= MAX_JOBS:
            raise ConfigError(
                f"a load of {config.load:g} on {config.training_gpus} GPUs needs more than "
                f"{MAX_JOBS:,} jobs"
            )
        off, job = offsets[int(rng.integers(len(offsets)))]
        model, conf = _pick_model(job.gpu_time / 3600, cfg.table, rng)
        at = min(off + float(rng.uniform(0.0, JITTER_S)), span - 1.0)
        key = (model, conf)
        if key not in nominal:
            app = apps.get(model)
            if app is None:
                raise ConfigError(f"model {model!r} is not among the applications given")
            nominal[key] = nominal_gpu_seconds(app, conf, config.node_gpus)
        offered += nominal[key]
        drafts.append((round(at, 3), model, conf))
    drafts.sort(key=lambda d: d[0])
    jobs = tuple(
        TrainingJobSpec(f"{model}-{i}", at, model, conf.num_replicas, conf.batch_size)
        for i, (at, model, conf) in enumerate(drafts)
    )
    return TrainingWeek(
        jobs, start, len(offsets), offered / 3600, config.training_gpus * span / 3600
    )
