"""The run matrix: named runs of policies on workloads, each simulated alone.

A run is ``NAME=POLICY[:FLAG,FLAG...]`` (:data:`RUN_SYNTAX`; ``NAME=`` may be left
out). :func:`parse_run` reads one, :func:`sim_config` turns it into the simulator
settings ``deepboot simulate`` would use for the equivalent flags, :func:`execute`
simulates one (workload, run) cell and :func:`run_matrix` runs many in worker
processes. ``deepboot compare`` is the command on top of it; the Python API and the
benchmarks use it directly.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import re
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from deepboot.core.cluster import ClusterSpec, Pool
from deepboot.core.errors import ConfigError, DeepbootError, InputError
from deepboot.core.service import DEFAULT_SLO_WAIT_S
from deepboot.perf.apps import load_apps
from deepboot.report.figures import UsagePanel, WaitCurve
from deepboot.report.schema import conform_summary
from deepboot.world.presets import Preset, apply_preset, preset, preset_params
from deepboot.world.settings import MAX_PROTECT_FACTOR

if TYPE_CHECKING:
    from deepboot.core.jobs import Workload
    from deepboot.perf.application import Application
    from deepboot.sim.config import SimConfig

RUN_SYNTAX = """\
run syntax:  --run NAME=POLICY[:FLAG,FLAG...]   (NAME= is optional)
  POLICY            a training policy, or a preset: guarded = deepboot:
                    objective=power-mean,restart_delay=30,hysteresis=0.05,
                    solver=core,slo,host-cache-gb=1,interval=30 (see 'deepboot
                    policies'); flags and parameters after a preset win over its own
  lending           lend idle inference GPUs to training (ATS-I reclaims them)
  no-lending        training-pool-only baseline: training sees only the training
                    pool, inference runs only on the inference pool
  afe / no-afe      keep-alive resizes (AFE) or cold restarts for every change
  lifecycle         the replica lifecycle RUNNING -> PROTECT -> SLEEP
  no-lifecycle      idle replicas go straight to SLEEP (no protect time)
  ats-i=NAME        inference placement policy: ats-i, ats-i-pack, random or lyra
  ats-i.KEY=VALUE   a parameter of the inference placement policy
  protect-factor=X  scale the protect times by X, 0 <= X <= 100
  reserve           predictive lending (ours, beyond the paper): keep back the idle
                    replicas each service's recent load says its next arrivals need
  reserve-target=Q  the reserve's coverage probability, 0 <= Q < 1 (default 0.7;
                    implies reserve)
  slo               SLO-guarded lending (ours, docs/slo.md): forecast each service's
                    demand, pre-warm and reclaim ahead of it, lend the rest
  slo-target=Q      every service's SLO target, 0 < Q < 1 (with slo, warm-pool or
                    oracle; default: each service's slo_target)
  slo-horizon=S     with slo: the forecast horizon's minimum, seconds
  slo-poisson       with slo: size as if arrivals were Poisson (before issue 45)
  slo-idle=Q        with slo: the fraction of relaxed services' cold starts that
                    find an idle GPU instead of a reclaim, 0 < Q < 1 (default 0.75)
  warm-pool         reference: each service's Erlang-B replicas at its true mean
                    load held warm, never lent; the rest lent as deepboot
  oracle            reference: slo holding the exact future demand (clairvoyant)
  host-cache-gb=GB  keep evicted replicas' models in each inference node's host
                    memory, up to GB (ours, docs/slo.md); a replica of a cached
                    model starts from there instead of cold (default 0: off)
  host-cache-preload with host-cache-gb: stage the services' models in the caches
                    before the first request (spread over the nodes)
  no-inference      drop the workload's inference tasks and give training every
                    node (the all-GPU limit)
  event-lending     hand GPUs freed between rounds to the jobs at that event
                    (ours), not at the next round
  interval=S        this run's scheduling interval, seconds (default: --interval)
  KEY=VALUE         a parameter of the training policy (as simulate --param)
A flag left out takes 'deepboot simulate's default: lending, lifecycle x1, ATS-I
(lyra for --policy lyra), and AFE restart costs when there is an inference pool
(the flat 30 s of the Pollux runs without one)."""

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
_BOOL_FLAGS: Mapping[str, tuple[str, bool]] = MappingProxyType(
    {
        "lending": ("lending", True),
        "no-lending": ("lending", False),
        "afe": ("afe", True),
        "no-afe": ("afe", False),
        "lifecycle": ("lifecycle", True),
        "no-lifecycle": ("lifecycle", False),
        "no-inference": ("no_inference", True),
        "reserve": ("reserve", True),
        "no-reserve": ("reserve", False),
        "slo": ("slo", True),
        "slo-poisson": ("slo_poisson", True),
        "warm-pool": ("warm_pool", True),
        "oracle": ("oracle", True),
        "host-cache-preload": ("host_cache_preload", True),
        "event-lending": ("event_lending", True),
    }
)


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One named run of the matrix, as parsed from ``--run``.

    Attributes:
        name: Run name (file-name safe; unique in the matrix).
        policy: Training policy name.
        lending: Lend inference GPUs to training (None: simulator default).
        afe: AFE resize costs (None: simulator default).
        lifecycle: Replica lifecycle on (None: simulator default).
        inference_policy: ATS-I variant name (None: simulator default).
        protect_factor: Protect-time scale (None: simulator default).
        reserve: Predictive lending reserve on (None: simulator default, off).
        reserve_target: Its coverage probability (None: the default).
        slo: SLO-guarded lending on.
        slo_target: Every service's SLO target (None: each its own).
        slo_horizon: The forecast horizon's minimum, seconds (None: the default).
        slo_idle: The relaxed regime's idle target (None: the default).
        slo_poisson: Size the guard as if arrivals were Poisson.
        warm_pool: The warm-pool reference.
        oracle: The oracle reference.
        host_cache_gb: GB of each inference node's host-memory model cache (None:
            off).
        host_cache_preload: Stage the services' models in those caches first.
        event_lending: Hand GPUs freed between rounds out at the event.
        no_inference: Drop inference tasks and use every node for training.
        interval: This run's scheduling interval, seconds (None: the matrix's).
        preset: The preset the policy and some flags came from ("" for none).
        params: Training-policy parameters, as ``(key, value)`` strings.
        inference_params: Inference-policy parameters (``ats-i.KEY=VALUE`` flags).
        text: The ``--run`` text it came from.
    """

    name: str
    policy: str
    lending: bool | None = None
    afe: bool | None = None
    lifecycle: bool | None = None
    inference_policy: str | None = None
    protect_factor: float | None = None
    reserve: bool | None = None
    reserve_target: float | None = None
    slo: bool = False
    slo_target: float | None = None
    slo_horizon: float | None = None
    slo_idle: float | None = None
    slo_poisson: bool = False
    warm_pool: bool = False
    oracle: bool = False
    host_cache_gb: float | None = None
    host_cache_preload: bool = False
    event_lending: bool = False
    no_inference: bool = False
    interval: float | None = None
    preset: str = ""
    params: tuple[tuple[str, str], ...] = ()
    inference_params: tuple[tuple[str, str], ...] = ()
    text: str = ""


def parse_run(text: str) -> RunSpec:
    """Parse one ``--run`` value (see :data:`RUN_SYNTAX`).

    Without ``NAME=`` the name is the policy and its flags joined by ``-``
    (``pollux:no-lending`` -> ``pollux-no-lending``).

    Raises:
        ConfigError: the text is malformed, a flag is unknown or repeated, or the
            name is not file-name safe.
    """
    raw = text.strip()
    head, colon, tail = raw.partition(":")
    name, eq, policy = head.partition("=")
    if not eq:
        name, policy = "", head
    name, policy = name.strip(), policy.strip()
    if not policy:
        raise ConfigError(f"--run {text!r}: no policy; expected NAME=POLICY[:FLAG,...]")
    flags = [f.strip() for f in tail.split(",")] if colon else []
    if any(not f for f in flags):
        raise ConfigError(f"--run {text!r}: empty flag (a stray ',' or ':'?)")
    if not name:
        name = "-".join([policy, *(f.replace("=", "-") for f in flags)])
    found = preset(policy)
    if found is not None:
        own = {flag.partition("=")[0].strip() for flag in flags}
        given = [f"{k}={v}" for k, v in preset_params(found.name, own).items()]
        flags = [*given, *_preset_flags(found, flags), *flags]
        policy = found.policy
    if not _NAME_RE.fullmatch(name):
        raise ConfigError(
            f"--run {text!r}: run name {name!r} must be letters, digits and . _ + - "
            "(it names output files)"
        )
    values: dict[str, Any] = {}
    params: dict[str, str] = {}
    inference_params: dict[str, str] = {}
    for flag in flags:
        key, has_value, value = (part.strip() for part in flag.partition("="))
        if not has_value:
            if flag not in _BOOL_FLAGS:
                known = ", ".join(_BOOL_FLAGS)
                raise ConfigError(f"--run {text!r}: unknown flag {flag!r}; known: {known}")
            attr, setting = _BOOL_FLAGS[flag]
            if attr in values:
                raise ConfigError(f"--run {text!r}: {attr.replace('_', '-')} is set twice")
            values[attr] = setting
        elif key == "ats-i":
            if not value or "inference_policy" in values:
                raise ConfigError(f"--run {text!r}: ats-i needs one inference policy name")
            values["inference_policy"] = value
        elif key.startswith("ats-i."):
            sub = key.removeprefix("ats-i.")
            if not sub or sub in inference_params:
                raise ConfigError(f"--run {text!r}: bad or repeated parameter {flag!r}")
            inference_params[sub] = value
        elif key == "protect-factor":
            factor = _positive(text, key, value)
            if factor > MAX_PROTECT_FACTOR:
                raise ConfigError(
                    f"--run {text!r}: protect-factor must be in [0, {MAX_PROTECT_FACTOR:g}]; "
                    f"got {value!r}"
                )
            values["protect_factor"] = factor
        elif key == "reserve-target":
            values["reserve_target"] = _positive(text, key, value)
        elif key in ("slo-target", "slo-horizon", "slo-idle", "host-cache-gb"):
            values[key.replace("-", "_")] = _positive(text, key, value)
        elif key == "interval":
            seconds = _positive(text, key, value)
            if seconds <= 0:
                raise ConfigError(f"--run {text!r}: interval must be > 0 seconds; got {value!r}")
            values["interval"] = seconds
        else:
            if not key or key in params:
                raise ConfigError(f"--run {text!r}: bad or repeated parameter {flag!r}")
            params[key] = value
    return RunSpec(
        name,
        policy,
        preset=found.name if found else "",
        params=tuple(params.items()),
        inference_params=tuple(inference_params.items()),
        text=raw,
        **values,
    )


def _flag_key(flag: str) -> str:
    """What a run flag sets: ``no-lending`` -> ``lending``, ``slo-idle=0.8`` ->
    ``slo_idle``."""
    key = flag.partition("=")[0].strip()
    if key in _BOOL_FLAGS:
        return _BOOL_FLAGS[key][0]
    return key.replace("-", "_")


def _preset_flags(found: Preset, given: list[str]) -> list[str]:
    """The flags of preset ``found`` that the run's own flags (``given``) leave, in
    the run syntax: :func:`~deepboot.world.presets.apply_preset` decides, as for the
    command line (those the run sets itself win; ``reserve`` or ``no-lending`` drop
    the guard)."""
    chosen: dict[str, object] = {dest: None for dest in found.flags}
    for flag in given:
        key = flag.partition("=")[0].strip()
        if key in _BOOL_FLAGS:
            attr, on = _BOOL_FLAGS[key]
            chosen[attr] = on
        else:
            chosen[_flag_key(flag)] = flag
    _, filled = apply_preset(found.name, chosen)
    return [found.run_flag(dest) for dest in found.flags if dest in filled]


def _positive(text: str, key: str, value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and x >= 0):
        raise ConfigError(f"--run {text!r}: {key} must be a number >= 0; got {value!r}")
    return x


# ------------------------------------------------------------------ run settings


def sim_config(run: RunSpec, interval: float, seed: int, inference_nodes: int) -> SimConfig:
    """The simulator settings of ``run``: what ``deepboot simulate`` would use with the
    equivalent flags (the same resolver, so defaults cannot drift apart).

    Args:
        run: The run.
        interval: Scheduling interval (s).
        seed: Policy seed.
        inference_nodes: Inference-pool nodes of the matrix (AFE defaults on with an
            inference pool); ``run.no_inference`` makes it 0.

    Raises:
        ConfigError: a value is invalid.
    """
    from deepboot.sim.config import SimConfig
    from deepboot.world.settings import SharedCluster

    settings = SharedCluster(
        lending=False if run.no_inference else (True if run.lending is None else run.lending),
        lifecycle=True if run.lifecycle is None else run.lifecycle,
        protect_factor=1.0 if run.protect_factor is None else run.protect_factor,
        afe=run.afe,
        ats_i=run.inference_policy,
        ats_i_params=dict(run.inference_params),
        # reserve-target=Q alone turns the reserve on.
        reserve=run.reserve if run.reserve is not None else run.reserve_target is not None,
        reserve_target=run.reserve_target,
        slo=run.slo,
        slo_target=run.slo_target,
        slo_horizon=run.slo_horizon,
        slo_idle=run.slo_idle,
        slo_poisson=run.slo_poisson,
        warm_pool=run.warm_pool,
        oracle=run.oracle,
        host_cache_gb=run.host_cache_gb or 0.0,
        host_cache_preload=run.host_cache_preload,
        event_lending=run.event_lending,
    ).sim_kwargs(inference_nodes=0 if run.no_inference else inference_nodes, policy=run.policy)
    own = interval if run.interval is None else run.interval
    return SimConfig(interval=own, seed=seed, **settings)


def describe_config(run: RunSpec, config: SimConfig) -> str:
    """How a run is configured, every default made explicit (for the report)."""
    from deepboot.perf.restart import AfeRestartCost, FlatRestartCost

    parts = [f"preset {run.preset}: policy {run.policy}" if run.preset else f"policy {run.policy}"]
    parts += [f"{k}={v}" for k, v in run.params]
    if run.interval is not None:
        parts.append(f"{config.interval:g} s rounds")
    restart = config.restart
    if isinstance(restart, AfeRestartCost):
        parts.append("AFE restarts" if restart.afe else "cold restarts (no AFE)")
    elif isinstance(restart, FlatRestartCost):
        parts.append(f"flat {restart.seconds:g} s restarts")
    if run.no_inference:
        parts.append("no inference: every node trains")
        return ", ".join(parts)
    parts.append("lending" if config.lending else "no lending")
    parts.append(f"inference placement {config.inference_policy}")
    if config.lifecycle.enabled:
        parts.append(f"lifecycle x{config.lifecycle.factor:g}")
    else:
        parts.append("no lifecycle")
    if config.lend_reserve.enabled:
        parts.append(f"lending reserve q={config.lend_reserve.target:g}")
    if config.slo.enabled or config.slo_reference:
        what = {"": "SLO-guarded lending", "warm-pool": "warm-pool reference"}
        parts.append(what.get(config.slo_reference, "oracle reference"))
        if config.slo.target is not None:
            parts.append(f"SLO target {config.slo.target:g}")
        if config.slo.horizon_s is not None:
            parts.append(f"horizon >= {config.slo.horizon_s:g} s")
        if run.slo_idle is not None:
            parts.append(f"idle target {config.slo.idle_target:g}")
        if not config.slo.burst_sizing:
            parts.append("sized as Poisson")
    if config.host_cache.enabled:
        parts.append(f"host cache {config.host_cache.capacity_gb:g} GB per node")
        if config.host_cache.preload:
            parts.append("models preloaded")
    if config.event_lending:
        parts.append("freed GPUs lent at the event")
    return ", ".join(parts)


# ------------------------------------------------------------------ one simulation


@dataclass(frozen=True, slots=True)
class RunTask:
    """One (workload, run) cell, everything a worker process needs (picklable).

    Attributes:
        index: Position in the matrix (workload-major).
        workload_path: Workload CSV (read by the run when ``workload`` is None).
        workload_name: Its display name.
        run: The run.
        cluster: ``NODESxGPUS``.
        inference_nodes: Inference nodes (``run.no_inference`` overrides it with 0).
        profiles: Profile directory, or None for the built-in catalog.
        interval: Scheduling interval (s).
        seed: Policy seed.
        max_time: Virtual-time limit (None: until every job completes).
        replication: Replication i of the cell: policy seed i (``seed`` is ignored)
            and every submission time jittered by a uniform draw in
            ±``jitter_s`` from ``numpy.random.default_rng(i)``, so every run of the
            matrix sees the same K perturbed workloads (None: the workload as is).
        jitter_s: The jitter of a replication, seconds.
        workload: The workload, loaded by the caller from ``workload_path`` (with the
            apps of ``profiles``), or None for the run to load it. Loaded once in the
            parent and sent with the task, it reaches worker processes and Ray tasks
            even when the path is a pipe (``--workload <(cat w.csv)``) they could not
            open or read again.
        services: A services file the run reads ``workload_path`` with when
            ``workload`` is None (a loaded workload carries its services' specs).
    """

    index: int
    workload_path: str
    workload_name: str
    run: RunSpec
    cluster: str
    inference_nodes: int
    profiles: str | None
    interval: float
    seed: int
    max_time: float | None = None
    replication: int | None = None
    jitter_s: float = 30.0
    workload: Workload | None = None
    services: str | None = None


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """What a worker sends back: the summary and the figures' data, or an error.

    Attributes:
        index: The task's index.
        summary: The run summary (empty on error).
        jcts: Completed jobs' JCTs (s).
        usage: GPUs over time by use, reduced to at most 1500 segments (None on
            error).
        reclaim_times: Times of the reclaims (s).
        waits: The inference requests' waits, reduced to at most 500 points of their
            complementary CDF plus counts (None on error; no points without requests).
        error: The error message when the run failed with a :class:`DeepbootError`.
    """

    index: int
    summary: Mapping[str, Any] = field(default_factory=dict)
    jcts: tuple[float, ...] = ()
    usage: UsagePanel | None = None
    reclaim_times: tuple[float, ...] = ()
    waits: WaitCurve | None = None
    error: str | None = None

    @property
    def end_s(self) -> float:
        """Virtual time the GPU-use timeline ends (0.0 without one)."""
        edges = None if self.usage is None else self.usage.edges
        return float(edges[-1]) if edges is not None and edges.size else 0.0


ProgressFn = Callable[[int, float, int, int], None]
"""``progress(index, sim_now, completed_jobs, total_jobs)``."""


def _task_inputs(
    task: RunTask, apps: Mapping[str, Application]
) -> tuple[Workload, ClusterSpec, SimConfig]:
    from deepboot.sim.services import read_services_file
    from deepboot.sim.workload import jitter_submissions, load_workload

    workload = task.workload
    if workload is None:
        services = None if task.services is None else read_services_file(task.services)
        workload = load_workload(
            task.workload_path, apps.keys(), {n: a.limits for n, a in apps.items()}, services
        )
    if task.run.no_inference:
        workload = dataclasses.replace(workload, inference=())
    seed = task.seed
    if task.replication is not None:
        workload = jitter_submissions(
            workload, np.random.default_rng(task.replication), task.jitter_s
        )
        seed = task.replication
    if not workload.training:
        raise InputError(task.workload_path, 0, "application", "the workload has no training jobs")
    nodes = 0 if task.run.no_inference else task.inference_nodes
    cluster = ClusterSpec.parse(task.cluster, nodes)
    config = sim_config(task.run, task.interval, seed, task.inference_nodes)
    if task.max_time is not None:
        config = dataclasses.replace(config, max_time=task.max_time)
    return workload, cluster, config


def execute(task: RunTask, progress: ProgressFn | None = None) -> RunOutcome:
    """Simulate one cell; a :class:`DeepbootError` becomes ``RunOutcome.error``.

    Deterministic for a given task (only ``wall_s`` and decision latencies vary).
    """
    from deepboot.policies import registry
    from deepboot.sim.run import simulate

    try:
        apps = load_apps(task.profiles)
        workload, cluster, config = _task_inputs(task, apps)
        policy = registry.create(task.run.policy, **dict(task.run.params))
        callback = None
        if progress is not None:

            def callback(now: float, completed: int, total: int) -> None:
                progress(task.index, now, completed, total)

        started = time.perf_counter()
        result = simulate(workload, cluster, policy, apps, config, on_progress=callback)
        wall_s = time.perf_counter() - started
        summary = dict(result.summary(task.run.policy, task.workload_name))
        summary.setdefault("wall_s", wall_s)
        conform_summary(summary)  # a summary missing a schema key is a bug: fail loudly
        # Reduced here so a long timeline, or a day of requests, is not pickled back
        # point by point.
        usage = UsagePanel.from_timeline(
            task.run.name,
            result.timeline,
            training_pool_gpus=sum(n.gpus for n in cluster.pool_nodes(Pool.TRAINING)),
        )
        waits = WaitCurve.from_records(
            task.run.name, result.inference, result.slo_wait_s, DEFAULT_SLO_WAIT_S
        )
        return RunOutcome(
            index=task.index,
            summary=summary,
            jcts=tuple(r.jct for r in result.jobs if r.jct is not None),
            usage=usage,
            reclaim_times=result.reclaim_times,
            waits=waits,
        )
    except DeepbootError as exc:
        # Custom exceptions may not survive pickling back to the parent: send text.
        return RunOutcome(index=task.index, error=" ".join(str(exc).split()))


class _QueueProgress:
    """Picklable progress sink of a worker: throttled puts on a manager queue."""

    def __init__(self, queue: Any, min_gap_s: float = 0.25) -> None:
        self.queue = queue
        self.min_gap_s = min_gap_s
        self._last = -math.inf

    def __call__(self, index: int, now: float, completed: int, total: int) -> None:
        t = time.monotonic()
        if t - self._last >= self.min_gap_s or completed == total:
            self._last = t
            self.queue.put((index, now, completed, total))


def _execute_in_worker(task: RunTask, queue: Any, workload: Workload | None = None) -> RunOutcome:
    """:func:`execute` in a worker; ``workload``, when given, is the task's workload
    sent apart from it (a Ray object stored once for every task of the workload)."""
    if workload is not None:
        task = dataclasses.replace(task, workload=workload)
    return execute(task, _QueueProgress(queue) if queue is not None else None)


class MatrixObserver(Protocol):
    """What :func:`run_matrix` tells about progress (a progress bar, or nothing)."""

    def update(self, index: int, now: float, completed: int, total: int) -> None:
        """Cell ``index`` is at simulated time ``now`` with ``completed`` of ``total`` jobs."""

    def finished(self, index: int) -> None:
        """Cell ``index`` is done."""


class MatrixInterrupted(DeepbootError):
    """Ctrl-C during a sweep. ``outcomes`` holds every cell in task order: the
    finished ones as they ended, the others with an "interrupted" error."""

    def __init__(self, outcomes: list[RunOutcome]) -> None:
        done = sum(o.error != INTERRUPTED for o in outcomes)
        super().__init__(f"interrupted: {done} of {len(outcomes)} runs had finished")
        self.outcomes = outcomes

    @classmethod
    def of(cls, tasks: Sequence[RunTask], done: Mapping[int, RunOutcome]) -> MatrixInterrupted:
        return cls(
            [done.get(t.index) or RunOutcome(index=t.index, error=INTERRUPTED) for t in tasks]
        )


INTERRUPTED = "interrupted before it finished"


class MatrixError(DeepbootError):
    """The matrix could not run: its worker processes (or Ray) failed, not a run."""


class _Silent:
    def update(self, index: int, now: float, completed: int, total: int) -> None:
        pass

    def finished(self, index: int) -> None:
        pass


def run_matrix(
    tasks: Sequence[RunTask], procs: int, display: MatrixObserver | None = None
) -> list[RunOutcome]:
    """Run every task, ``procs`` at a time in worker processes (1: in this process).

    Each task's outcome equals :func:`execute` of it alone (a simulation is a pure
    function of its task); only ``wall_s`` and the decision latencies differ.

    Args:
        tasks: The cells.
        procs: Worker processes (spawned).
        display: Told of each cell's progress and end (None: nobody is).

    Returns:
        The outcomes in task order.

    Raises:
        MatrixInterrupted: Ctrl-C; carries the runs that finished.
        MatrixError: a worker process ended abruptly (killed, out of memory).
    """
    display = display or _Silent()
    outcomes: dict[int, RunOutcome] = {}
    try:
        return _run_matrix(tasks, procs, display, outcomes)
    except KeyboardInterrupt:
        raise MatrixInterrupted.of(tasks, outcomes) from None
    except BrokenProcessPool:
        raise MatrixError(
            "the run matrix could not run: a worker process ended abruptly (killed? out "
            f"of memory?) after {len(outcomes)} of {len(tasks)} runs had finished"
        ) from None


def _run_matrix(
    tasks: Sequence[RunTask],
    procs: int,
    display: MatrixObserver,
    outcomes: dict[int, RunOutcome],
) -> list[RunOutcome]:
    if procs <= 1 or len(tasks) <= 1:
        for task in tasks:
            outcomes[task.index] = execute(task, display.update)
            display.finished(task.index)
        return [outcomes[t.index] for t in tasks]
    # spawn: workers start clean (no inherited threads or locks of the parent's
    # progress display) and behave the same on every OS.
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        queue = manager.Queue()
        pool = ProcessPoolExecutor(procs, mp_context=context)
        finished = False
        try:
            pending: set[Future[RunOutcome]] = {
                pool.submit(_execute_in_worker, task, queue) for task in tasks
            }
            while pending:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                _drain(queue, display)
                for future in done:
                    outcome = future.result()
                    outcomes[outcome.index] = outcome
                    display.finished(outcome.index)
            finished = True
        finally:
            # On Ctrl-C or a crash, do not wait for the runs still going.
            pool.shutdown(wait=finished, cancel_futures=True)
    return [outcomes[t.index] for t in tasks]


def _drain(queue: Any, display: MatrixObserver) -> None:
    while not queue.empty():
        display.update(*queue.get_nowait())
