"""``deepboot compare``: a matrix of named runs on workloads, one table, CSV, figures, HTML.

A run is ``NAME=POLICY[:FLAG,FLAG...]`` (``NAME=`` may be left out). Each run is
simulated on each workload in its own process; the results are printed as one table
and written into the output folder:

* ``results.csv``: one row per (workload, run), every summary value;
* ``summaries/<workload>--<run>.json``: each run's full summary;
* ``jct-cdf-<workload>.png``, ``gpus-<workload>.png``, ``reclaims-<workload>.png``;
* ``report.html``: all of it in one self-contained page.

Only this module knows the run mini-syntax; it turns each run into a training policy
and a :class:`~deepboot.sim.config.SimConfig`, so a run means exactly what the
equivalent ``deepboot simulate`` flags mean.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import logging
import math
import multiprocessing
import os
import re
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from deepboot import __version__
from deepboot.cli import limits
from deepboot.cli.files import (
    PathArg,
    check_outputs,
    model_inputs,
    require_path,
    write_atomic,
    write_bytes,
    write_text,
)
from deepboot.cli.progress import format_sim_time
from deepboot.core.cluster import ClusterSpec, Pool
from deepboot.core.errors import ConfigError, DeepbootError, InputError
from deepboot.report.figures import UsagePanel
from deepboot.report.html import FigureImage
from deepboot.report.schema import conform_summary
from deepboot.report.table import MatrixRow, matrix_table

if TYPE_CHECKING:
    from deepboot.core.jobs import Workload
    from deepboot.perf.application import Application
    from deepboot.sim.config import SimConfig

log = logging.getLogger(__name__)

DEFAULT_RUNS: tuple[str, ...] = ("deepboot=deepboot", "pollux-only=pollux:no-lending,no-afe")
"""The headline pair, run when no ``--run`` is given: DeepBoot against training-pool-only
Pollux with cold restarts (AFE is part of DeepBoot; the reference artifact's baseline
had none)."""

RUN_SYNTAX = """\
run syntax:  --run NAME=POLICY[:FLAG,FLAG...]   (NAME= is optional)
  POLICY            a training policy (see 'deepboot policies')
  lending           lend idle inference GPUs to training (ATS-I reclaims them)
  no-lending        training-pool-only baseline: training sees only the training
                    pool, inference runs only on the inference pool
  afe / no-afe      keep-alive resizes (AFE) or cold restarts for every change
  lifecycle         the replica lifecycle RUNNING -> PROTECT -> SLEEP
  no-lifecycle      idle replicas go straight to SLEEP (no protect time)
  ats-i=NAME        inference placement policy: ats-i, ats-i-pack, random or lyra
  protect-factor=X  scale the protect times by X, 0 <= X <= 100
  reserve           predictive lending (ours, beyond the paper): keep back the idle
                    replicas each service's recent load says its next arrivals need
  reserve-target=Q  the reserve's coverage probability, 0 <= Q < 1 (default 0.7;
                    implies reserve)
  no-inference      drop the workload's inference tasks and give training every
                    node (the all-GPU limit)
  KEY=VALUE         a parameter of the training policy (as simulate --param)
A flag left out takes 'deepboot simulate's default: lending, lifecycle x1, ATS-I
(lyra for --policy lyra), and AFE restart costs when there is an inference pool
(the flat 30 s of the Pollux runs without one)."""

_COMPARE_EPILOG = f"""\
{RUN_SYNTAX}

examples:
  # the headline: DeepBoot against training-pool-only Pollux, and the ablations
  deepboot compare --workload ../shared/traces/workloads/small.csv \\
      --cluster 16x4 --inference-nodes 8 --profiles ../shared/traces/profiles \\
      --run deepboot=deepboot --run pollux-only=pollux:no-lending,no-afe \\
      --run deepboot-noafe=deepboot:no-afe --run deepboot-random=deepboot:ats-i=random \\
      --out out/compare-small

  # the same matrix on two workloads, four processes
  deepboot compare --workload small.csv --workload middle.csv --inference-nodes 8 \\
      --run deepboot --run pollux:no-lending --out out/both --procs 4

Outputs in --out: results.csv, summaries/*.json, *.png figures, report.html."""

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
        no_inference: Drop inference tasks and use every node for training.
        params: Training-policy parameters, as ``(key, value)`` strings.
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
    no_inference: bool = False
    params: tuple[tuple[str, str], ...] = ()
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
    if not _NAME_RE.fullmatch(name):
        raise ConfigError(
            f"--run {text!r}: run name {name!r} must be letters, digits and . _ + - "
            "(it names output files)"
        )
    values: dict[str, Any] = {}
    params: dict[str, str] = {}
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
        elif key == "protect-factor":
            values["protect_factor"] = _positive(text, key, value)
        elif key == "reserve-target":
            values["reserve_target"] = _positive(text, key, value)
        else:
            if not key or key in params:
                raise ConfigError(f"--run {text!r}: bad or repeated parameter {flag!r}")
            params[key] = value
    return RunSpec(name, policy, params=tuple(params.items()), text=raw, **values)


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
    from deepboot.cli.params import shared_cluster_settings
    from deepboot.sim.config import SimConfig

    flags = argparse.Namespace(
        lending=False if run.no_inference else (True if run.lending is None else run.lending),
        lifecycle=True if run.lifecycle is None else run.lifecycle,
        protect_factor=1.0 if run.protect_factor is None else run.protect_factor,
        afe=run.afe,
        ats_i=run.inference_policy,
        # reserve-target=Q alone turns the reserve on.
        reserve=run.reserve if run.reserve is not None else run.reserve_target is not None,
        reserve_target=run.reserve_target,
    )
    nodes = 0 if run.no_inference else inference_nodes
    settings = shared_cluster_settings(flags, nodes, run.policy)
    return SimConfig(interval=interval, seed=seed, **settings)


def describe_config(run: RunSpec, config: SimConfig) -> str:
    """How a run is configured, every default made explicit (for the report)."""
    from deepboot.perf.restart import AfeRestartCost, FlatRestartCost

    parts = [f"policy {run.policy}"]
    parts += [f"{k}={v}" for k, v in run.params]
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
    return ", ".join(parts)


# ------------------------------------------------------------------ one simulation


@dataclass(frozen=True, slots=True)
class RunTask:
    """One (workload, run) cell, everything a worker process needs (picklable).

    Attributes:
        index: Position in the matrix (workload-major).
        workload_path: Workload CSV.
        workload_name: Its display name.
        run: The run.
        cluster: ``NODESxGPUS``.
        inference_nodes: Inference nodes (``run.no_inference`` overrides it with 0).
        profiles: Profile directory, or None for the built-in catalog.
        interval: Scheduling interval (s).
        seed: Policy seed.
        max_time: Virtual-time limit (None: until every job completes).
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
        error: The error message when the run failed with a :class:`DeepbootError`.
    """

    index: int
    summary: Mapping[str, Any] = field(default_factory=dict)
    jcts: tuple[float, ...] = ()
    usage: UsagePanel | None = None
    reclaim_times: tuple[float, ...] = ()
    error: str | None = None

    @property
    def end_s(self) -> float:
        """Virtual time the GPU-use timeline ends (0.0 without one)."""
        edges = None if self.usage is None else self.usage.edges
        return float(edges[-1]) if edges is not None and edges.size else 0.0


ProgressFn = Callable[[int, float, int, int], None]
"""``progress(index, sim_now, completed_jobs, total_jobs)``."""


def _load_apps(profiles: str | None) -> Mapping[str, Application]:
    if profiles:
        from deepboot.perf.profiles import load_profiles

        return load_profiles(profiles)
    from deepboot.perf.catalog import load_catalog

    return load_catalog()


def _task_inputs(
    task: RunTask, apps: Mapping[str, Application]
) -> tuple[Workload, ClusterSpec, SimConfig]:
    from deepboot.sim.workload import load_workload

    workload = load_workload(
        task.workload_path, apps.keys(), {n: a.limits for n, a in apps.items()}
    )
    if task.run.no_inference:
        workload = dataclasses.replace(workload, inference=())
    if not workload.training:
        raise InputError(task.workload_path, 0, "application", "the workload has no training jobs")
    nodes = 0 if task.run.no_inference else task.inference_nodes
    cluster = ClusterSpec.parse(task.cluster, nodes)
    config = sim_config(task.run, task.interval, task.seed, task.inference_nodes)
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
        apps = _load_apps(task.profiles)
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
        # Reduced here so a long timeline is not pickled back point by point.
        usage = UsagePanel.from_timeline(
            task.run.name,
            result.timeline,
            training_pool_gpus=sum(n.gpus for n in cluster.pool_nodes(Pool.TRAINING)),
        )
        return RunOutcome(
            index=task.index,
            summary=summary,
            jcts=tuple(r.jct for r in result.jobs if r.jct is not None),
            usage=usage,
            reclaim_times=result.reclaim_times,
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


def _execute_in_worker(task: RunTask, queue: Any) -> RunOutcome:
    return execute(task, _QueueProgress(queue) if queue is not None else None)


# ------------------------------------------------------------------ the matrix


class MatrixProgress:
    """A rich progress display: one overall bar plus one line per running cell."""

    def __init__(self, console: Console, tasks: Sequence[RunTask], enabled: bool) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=console,
            disable=not enabled,
        )
        self._overall = self._progress.add_task("runs", total=len(tasks), detail="")
        self._rows: dict[int, TaskID] = {}
        self._tasks = {t.index: t for t in tasks}

    def __enter__(self) -> MatrixProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def update(self, index: int, now: float, completed: int, total: int) -> None:
        row = self._rows.get(index)
        if row is None:
            task = self._tasks[index]
            label = f"  {task.run.name} / {task.workload_name}"
            row = self._rows[index] = self._progress.add_task(label, total=total, detail="")
        self._progress.update(
            row, completed=completed, total=total, detail=f"jobs  sim {format_sim_time(now)}"
        )

    def finished(self, index: int) -> None:
        row = self._rows.get(index)
        if row is not None:
            self._progress.update(row, visible=False)
        self._progress.advance(self._overall)


def run_matrix(tasks: Sequence[RunTask], procs: int, display: MatrixProgress) -> list[RunOutcome]:
    """Run every task, ``procs`` at a time in worker processes (1: in this process).

    Returns:
        The outcomes in task order.
    """
    outcomes: dict[int, RunOutcome] = {}
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


def _drain(queue: Any, display: MatrixProgress) -> None:
    while not queue.empty():
        display.update(*queue.get_nowait())


# ------------------------------------------------------------------ the command


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the epilog's line breaks; shows a default only where there is one."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        quiet = default is None or default is False or default == [] or default == argparse.SUPPRESS
        if "%(default)" not in text and action.option_strings and not quiet:
            text += " (default: %(default)s)"
        return text


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``compare`` on the ``deepboot`` subcommand parser."""
    p = sub.add_parser(
        "compare",
        help="simulate a matrix of policies and variants; table, CSV, figures and HTML report",
        description="Simulate every --run on every --workload, in parallel processes.\n"
        "Print one table and write results.csv, per-run summary JSON, figures and a\n"
        "self-contained report.html into --out.",
        epilog=_COMPARE_EPILOG,
        formatter_class=_Formatter,
    )
    p.add_argument(
        "--workload", action="append", required=True, metavar="FILE", help="workload CSV; repeat"
    )
    p.add_argument(
        "--run",
        action="append",
        default=[],
        metavar="SPEC",
        help="NAME=POLICY[:FLAG,...]; repeat (default: "
        + " ".join(DEFAULT_RUNS)
        + "); see the run syntax below",
    )
    p.add_argument(
        "--cluster",
        default="16x4",
        metavar="NODESxGPUS",
        help=f"cluster shape, {limits.CLUSTER_HELP}",
    )
    p.add_argument(
        "--inference-nodes",
        type=int,
        default=8,
        metavar="N",
        help=f"the last N nodes form the inference pool, {limits.INFERENCE_NODES_HELP}",
    )
    p.add_argument(
        "--profiles",
        metavar="DIR",
        help="measured profile directory (reference format); default: the built-in catalog",
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="output folder (created); its files are written atomically and never "
        "onto an input of the run",
    )
    p.add_argument(
        "--procs",
        type=int,
        default=None,
        metavar="N",
        help=f"parallel processes, {limits.PROCS_HELP} (default: min(CPUs, runs))",
    )
    p.add_argument(
        "--baseline",
        metavar="NAME",
        help="run the average JCT is compared with (default: the first run)",
    )
    p.add_argument(
        "--interval",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help=f"scheduling interval, {limits.INTERVAL_HELP}",
    )
    p.add_argument(
        "--seed", type=int, default=0, help=f"seed of the policies' randomness, {limits.SEED_HELP}"
    )
    p.add_argument(
        "--max-time",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"stop each run at this simulated time, {limits.MAX_TIME_HELP} "
        "(default: when every job is done)",
    )
    p.add_argument(
        "--no-figures", action="store_true", help="skip the PNG figures (no matplotlib needed)"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=compare)


def command_line(args: argparse.Namespace) -> str:
    """The canonical ``deepboot compare`` command line equivalent to ``args``."""
    words = ["deepboot", "compare"]
    for w in args.workload:
        words += ["--workload", w]
    words += ["--cluster", args.cluster, "--inference-nodes", str(args.inference_nodes)]
    if args.profiles:
        words += ["--profiles", args.profiles]
    for r in args.run or DEFAULT_RUNS:
        words += ["--run", r]
    words += ["--interval", f"{args.interval:g}", "--seed", str(args.seed)]
    if args.max_time is not None:
        words += ["--max-time", f"{args.max_time:g}"]
    if args.baseline:
        words += ["--baseline", args.baseline]
    if args.no_figures:
        words.append("--no-figures")
    words += ["--out", args.out]
    return shlex.join(words)


def _workload_names(paths: Sequence[str]) -> list[str]:
    names = [Path(p).stem for p in paths]
    seen: dict[str, str] = {}
    for path, name in zip(paths, names, strict=True):
        if name in seen:
            raise ConfigError(
                f"--workload {path} and {seen[name]} share the name {name!r}; "
                "rename one (its file stem names its outputs)"
            )
        seen[name] = path
    return names


def output_files(args: argparse.Namespace, runs: Sequence[RunSpec]) -> list[PathArg]:
    """Every file ``compare`` may write into ``--out`` (see the module docstring)."""
    out_dir = Path(args.out)
    names = [Path(p).stem for p in args.workload]
    files = [out_dir / "results.csv", out_dir / "report.html"]
    files += [out_dir / "summaries" / f"{w}--{r.name}.json" for w in names for r in runs]
    if not args.no_figures:
        kinds = ("jct-cdf", "gpus", "reclaims")
        files += [out_dir / f"{kind}-{w}.png" for w in names for kind in kinds]
    return [PathArg("--out", str(f)) for f in files]


def _validate(args: argparse.Namespace, runs: Sequence[RunSpec]) -> Mapping[str, str]:
    """Check everything before any simulation; returns run name -> description.

    Raises:
        ConfigError, InputError, UnknownPolicyError: the first problem found (a flag
            out of its range, an empty path, an output that would overwrite an input).
    """
    from deepboot.policies import inference, registry
    from deepboot.sim.workload import load_workload

    for path in args.workload:
        require_path(path, "--workload")
    if args.profiles is not None:
        require_path(args.profiles, "--profiles")
    require_path(args.out, "--out")
    limits.check_interval(args.interval)
    limits.check_seed(args.seed)
    limits.check_procs(args.procs)
    limits.check_max_time(args.max_time)
    limits.check_cluster(args.cluster, args.inference_nodes)
    ClusterSpec.parse(args.cluster, args.inference_nodes)
    seen: set[str] = set()
    for run in runs:
        if run.name in seen:
            raise ConfigError(f"two runs are named {run.name!r}; give each --run a unique NAME=")
        seen.add(run.name)
    if args.baseline and args.baseline not in seen:
        raise ConfigError(
            f"--baseline {args.baseline!r} is not a run name; runs: {', '.join(seen)}"
        )
    described: dict[str, str] = {}
    for run in runs:
        registry.create(run.policy, **dict(run.params))  # unknown policy or bad parameter
        config = sim_config(run, args.interval, args.seed, args.inference_nodes)
        inference.create(config.inference_policy)  # unknown inference policy
        described[run.name] = describe_config(run, config)
    if not args.no_figures:
        from deepboot.report.figures import _matplotlib_figure_class

        _matplotlib_figure_class()  # missing matplotlib: fail now, not after the runs
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise ConfigError(f"--out {args.out} is not a directory; give an output folder")
    check_outputs(
        output_files(args, runs),
        [*(PathArg("--workload", w) for w in args.workload), *model_inputs(args.profiles)],
        need_directory=False,
    )
    apps = _load_apps(args.profiles)
    for path in args.workload:
        workload = load_workload(path, apps.keys(), {n: a.limits for n, a in apps.items()})
        if not workload.training:
            raise InputError(path, 0, "application", "the workload has no training jobs")
    return described


def compare(args: argparse.Namespace, out: Console, err: Console) -> int:
    """``deepboot compare``: run the matrix, print the table, write every output."""
    from deepboot.report.csvout import write_results_csv

    runs = [parse_run(text) for text in (args.run or DEFAULT_RUNS)]
    names = _workload_names(args.workload)
    described = _validate(args, runs)
    out_dir = Path(args.out)
    try:
        (out_dir / "summaries").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(str(out_dir), 0, "", f"cannot create: {exc.strerror or exc}") from None

    tasks = [
        RunTask(
            index=i * len(runs) + j,
            workload_path=path,
            workload_name=name,
            run=run,
            cluster=args.cluster,
            inference_nodes=args.inference_nodes,
            profiles=args.profiles,
            interval=args.interval,
            seed=args.seed,
            max_time=args.max_time,
        )
        for i, (path, name) in enumerate(zip(args.workload, names, strict=True))
        for j, run in enumerate(runs)
    ]
    procs = args.procs or max(1, min(os.cpu_count() or 1, len(tasks)))
    show = not args.quiet and err.file.isatty()
    started = time.perf_counter()
    with MatrixProgress(err, tasks, enabled=show) as display:
        outcomes = run_matrix(tasks, procs, display)
    wall_s = time.perf_counter() - started

    failures = [
        f"run {t.run.name} on {t.workload_name}: {o.error}"
        for t, o in zip(tasks, outcomes, strict=True)
        if o.error is not None
    ]
    good = [(t, o) for t, o in zip(tasks, outcomes, strict=True) if o.error is None]
    # A no-inference run is the all-GPU bound, not a contender.
    rows = [
        MatrixRow(t.workload_name, t.run.name, o.summary, reference=t.run.no_inference)
        for t, o in good
    ]
    for t, o in good:
        data = {**o.summary, "run": {"name": t.run.name, "spec": t.run.text}}
        _write_json(out_dir / "summaries" / f"{t.workload_name}--{t.run.name}.json", data)
    specs = {r.name: r.text for r in runs}
    write_atomic(out_dir / "results.csv", lambda p: write_results_csv(p, rows, specs))
    if rows:
        table = matrix_table(rows, args.baseline, title=f"Comparison ({len(rows)} runs)")
        _print_wide(out, table)

    from deepboot.report.html import ReportPage, render_report

    figures: list[FigureImage] = []
    if not args.no_figures and good:
        figures = _figures(good, names, out_dir)
    page = ReportPage(
        title="deepboot compare: " + ", ".join(names),
        command=command_line(args),
        settings=_settings(args, procs, wall_s),
        rows=rows,
        baseline=args.baseline,
        runs={r.name: f"{r.text}  ({described[r.name]})" for r in runs},
        figures=figures,
        notes=failures,
    )
    write_text(out_dir / "report.html", render_report(page))
    log.info("wrote %s", out_dir / "report.html")
    out.print(
        f"wrote {out_dir}/results.csv, report.html, {len(figures)} figures and "
        f"{len(rows)} summaries in {wall_s:.1f} s",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    for line in failures:
        err.print(f"deepboot: error: {line}", markup=False, highlight=False, soft_wrap=True)
    return 2 if failures else 0


def _print_wide(console: Console, table: Table) -> None:
    """Print ``table`` at its natural width, past a narrow console if need be.

    Squeezed to 80 columns the numbers would turn into ellipses; a wide table that
    the terminal wraps, or a file with long lines, still reads right.
    """
    natural = console.measure(table, options=console.options.update(max_width=1000)).maximum
    saved = console.width
    console.width = max(saved, natural)
    try:
        console.print(table, crop=False)
    finally:
        console.width = saved


def _settings(args: argparse.Namespace, procs: int, wall_s: float) -> dict[str, str]:
    return {
        "workloads": ", ".join(args.workload),
        "cluster": f"{args.cluster}, last {args.inference_nodes} nodes = inference pool",
        "profiles": args.profiles or "built-in catalog",
        "scheduling interval": f"{args.interval:g} s",
        "seed": str(args.seed),
        "max simulated time": "none" if args.max_time is None else f"{args.max_time:g} s",
        "processes": str(procs),
        "wall time": f"{wall_s:.1f} s",
        "deepboot version": __version__,
        "generated": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def _figures(
    good: Sequence[tuple[RunTask, RunOutcome]], names: Sequence[str], out_dir: Path
) -> list[FigureImage]:
    from deepboot.report.figures import gpu_usage_figure, jct_cdf_figure, reclaims_figure

    figures: list[FigureImage] = []
    for name in names:
        cells = [(t, o) for t, o in good if t.workload_name == name]
        if not cells:
            continue
        made = [
            (
                f"jct-cdf-{name}",
                f"Training JCT CDF: {name}",
                jct_cdf_figure(
                    {t.run.name: o.jcts for t, o in cells}, title=f"Training JCT CDF: {name}"
                ),
                "Fraction of training jobs finished within a given JCT (log scale, hours); "
                "a curve further left and higher is better. The legend gives each run's "
                "average JCT.",
            ),
            (
                f"gpus-{name}",
                f"GPUs over time: {name}",
                gpu_usage_figure(
                    [o.usage for _, o in cells if o.usage is not None],
                    title=f"GPUs over time, stacked by use: {name}",
                ),
                "Every GPU of the cluster by state, time-averaged per bin. Dark blue is "
                "training on the training pool, light blue training on lent inference "
                "GPUs; red, orange and purple are inference replicas serving, kept warm "
                "(PROTECT) and sleeping (lendable). The dashed line is the training-pool size.",
            ),
            (
                f"reclaims-{name}",
                f"Reclaims over time: {name}",
                reclaims_figure(
                    {t.run.name: o.reclaim_times for t, o in cells},
                    title=f"Lent GPUs reclaimed for inference: {name}",
                    end_s=max((o.end_s for _, o in cells), default=0.0),
                ),
                "Cumulative number of lent GPUs taken back from training for inference "
                "(the legend gives each run's total).",
            ),
        ]
        for stem, title, png, caption in made:
            write_bytes(out_dir / f"{stem}.png", png)
            figures.append(FigureImage(title, png, caption, anchor=stem))
    return figures


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    write_text(path, json.dumps(data, indent=2) + "\n")
