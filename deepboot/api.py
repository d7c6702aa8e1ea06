"""The Python API: the few names a researcher needs in a notebook or a script.

    import deepboot

    workload = deepboot.load_workload("examples/demo-24.csv")
    result = deepboot.simulate(workload, deepboot.cluster("4x4"), "pollux")
    result.summary["training"]["avg_jct_s"]      # the summary `--summary-json` writes
    result.jobs[0]["jct"]                        # one plain dict per training job
    result.jobs_frame()                          # a pandas DataFrame, if pandas is installed

    # Many runs side by side, in worker processes (the run syntax of `deepboot compare`):
    cells = deepboot.compare(["w.csv"], ["deepboot", "pollux-only=pollux:no-lending,no-afe"])

    # Inference services of a services file (rows "infer-<service>"; cold starts,
    # concurrency and max_replicas from the file):
    workload = deepboot.load_workload("genai-day.csv", services="genai-day.toml")

Everything here is a thin layer over the library (``deepboot.sim``, ``deepboot.perf``,
``deepboot.policies``), with the command line's defaults: the same inputs give the
same summary as ``deepboot simulate``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepboot.core.cluster import ClusterSpec, Pool
from deepboot.core.jobs import Workload
from deepboot.perf.apps import load_apps


def load_workload(
    path: str | Path,
    profiles: str | Path | None = None,
    *,
    services: str | Path | None = None,
) -> Workload:
    """Load a Pollux- or DeepBoot-format workload CSV, checked against the models.

    Args:
        path: The workload CSV.
        profiles: Measured profiles instead of the built-in catalog.
        services: A services file (``[[service]]`` tables): inference rows name its
            services (``infer-<service>``), whose models are labels; each used
            service needs ``cold_start_s``. The workload carries their specs
            (``Workload.services``: cold start, ``concurrency``, ``max_replicas``).

    Raises:
        InputError: a bad row, naming the file, the line and the column; a bad
            services file, naming it, the service's line and the key.
    """
    from deepboot.sim.services import read_services_file
    from deepboot.sim.workload import load_workload as load

    apps = load_apps(profiles)
    table = None if services is None else read_services_file(services)
    return load(path, apps.keys(), {name: app.limits for name, app in apps.items()}, table)


def cluster(shape: str = "16x4", inference_nodes: int = 0) -> ClusterSpec:
    """A cluster of ``NODESxGPUS``; the last ``inference_nodes`` form the inference pool.

    Raises:
        ConfigError: a malformed shape or too many inference nodes.
    """
    return ClusterSpec.parse(shape, inference_nodes)


def policy_names() -> list[str]:
    """Names of the registered training policies."""
    from deepboot.policies import registry

    return registry.names()


@dataclass(frozen=True)
class Result:
    """The outcome of :func:`simulate`, as plain data.

    Attributes:
        summary: The run's summary (the schema of ``--summary-json``).
        jobs: One dict per training job (name, application, submit, first_start,
            completion, jct, queue_delay, restarts, restart_s, gpu_seconds).
        inference: One dict per inference task (name, service, model, submit, start,
            end, cold, delay).
    """

    summary: dict[str, Any]
    jobs: list[dict[str, Any]]
    inference: list[dict[str, Any]]

    def jobs_frame(self) -> Any:
        """The per-job records as a pandas DataFrame.

        Raises:
            ImportError: pandas is not installed (``pip install pandas``).
        """
        return _frame(self.jobs)

    def inference_frame(self) -> Any:
        """The per-task records as a pandas DataFrame (see :meth:`jobs_frame`)."""
        return _frame(self.inference)


def _frame(rows: list[dict[str, Any]]) -> Any:
    try:
        import pandas as pd
    except ImportError as exc:
        raise ImportError("DataFrames need pandas: pip install pandas") from exc
    return pd.DataFrame(rows)


def simulate(
    workload: Workload,
    cluster: ClusterSpec,
    policy: str = "deepboot",
    *,
    params: Mapping[str, object] | None = None,
    profiles: str | Path | None = None,
    seed: int = 0,
    interval: float = 60.0,
    max_time: float | None = None,
    lending: bool = True,
    lifecycle: bool = True,
    protect_factor: float = 1.0,
    afe: bool | None = None,
    ats_i: str | None = None,
    ats_i_params: Mapping[str, object] | None = None,
    reserve: bool = False,
    reserve_target: float | None = None,
    reserve_window: float | None = None,
    services: str | Path | None = None,
    slo: bool = False,
    slo_target: float | None = None,
    slo_horizon: float | None = None,
    slo_idle: float | None = None,
    warm_pool: bool = False,
    oracle: bool = False,
    host_cache_gb: float = 0.0,
    host_cache_preload: bool = False,
    event_lending: bool = False,
) -> Result:
    """Simulate ``policy`` on ``workload`` and ``cluster``, as ``deepboot simulate``.

    Args:
        workload: From :func:`load_workload` (or built by hand).
        cluster: From :func:`cluster`.
        policy: A registered training policy (:func:`policy_names`).
        params: The policy's parameters (``deepboot policies`` lists them).
        profiles: Measured profiles instead of the built-in catalog.
        seed: Seed of the policies' randomness (>= 0).
        interval: Seconds between scheduling rounds.
        max_time: Stop at this simulated time (None: when every job is done).
        lending, lifecycle, protect_factor, afe, ats_i, ats_i_params, reserve,
            reserve_target, reserve_window: the shared-cluster knobs (see ``deepboot
            simulate --help``; :class:`deepboot.world.settings.SharedCluster`).
        services: A services file whose specs the workload's inference services
            take (cold start, ``concurrency``, ``max_replicas``): it must hold every
            service the tasks name (``deepboot simulate --services``). None: the
            workload's own (:func:`load_workload` ``services=``), else per-model
            defaults.
        slo, slo_target, slo_horizon, slo_idle, warm_pool, oracle: SLO-guarded lending and
            its two references (``deepboot simulate --help``, docs/slo.md).
        host_cache_gb: GB of each inference node's host memory that keeps evicted
            replicas' models (``deepboot simulate --host-cache-gb``; 0: off).
        host_cache_preload: Stage the services' models in those caches before the
            first request (``--host-cache-preload``).
        event_lending: Hand GPUs freed between rounds to the jobs at the event that
            frees them (``--event-lending``).

    Returns:
        The summary and the per-job and per-task records.

    Raises:
        InputError: a bad services file, or one without a service the workload uses.
        ConfigError: an unknown policy or parameter, or a value out of range.
        UnschedulableError: a job can never run on this cluster.
        SimulationStalledError: the run stopped making progress.
    """
    from deepboot.core.errors import ConfigError
    from deepboot.policies import registry
    from deepboot.report.schema import conform_summary
    from deepboot.sim.config import SimConfig
    from deepboot.sim.run import simulate as run
    from deepboot.world.settings import SharedCluster

    if not 0 <= seed < 2**63:
        raise ConfigError(f"seed must be in [0, 2**63); got {seed}")
    inference_nodes = len(cluster.pool_nodes(Pool.INFERENCE))
    apps = load_apps(profiles)
    chosen = registry.create(policy, **dict(params or {}))
    settings = SharedCluster(
        lending=lending,
        lifecycle=lifecycle,
        protect_factor=protect_factor,
        afe=afe,
        ats_i=ats_i,
        ats_i_params=ats_i_params or {},
        reserve=reserve,
        reserve_target=reserve_target,
        reserve_window=reserve_window,
        slo=slo,
        slo_target=slo_target,
        slo_horizon=slo_horizon,
        slo_idle=slo_idle,
        warm_pool=warm_pool,
        oracle=oracle,
        host_cache_gb=host_cache_gb,
        host_cache_preload=host_cache_preload,
        event_lending=event_lending,
    ).sim_kwargs(inference_nodes=inference_nodes, policy=policy)
    from deepboot.policies import inference

    inference.make_config(settings["inference_policy"], **settings["inference_params"])
    if services is not None:
        from deepboot.sim.services import bind_services, read_services_file

        workload = bind_services(workload, read_services_file(services))
    if workload.inference and inference_nodes == 0:
        workload = dataclasses.replace(workload, inference=())
    config = SimConfig(interval=interval, seed=seed, max_time=max_time, **settings)
    started = time.perf_counter()
    out = run(workload, cluster, chosen, apps, config)
    summary = dict(out.summary(policy, workload.name))
    summary.setdefault("wall_s", time.perf_counter() - started)
    return Result(
        summary=conform_summary(summary),
        jobs=[dataclasses.asdict(r) for r in out.jobs],
        inference=[dataclasses.asdict(r) for r in out.inference],
    )


@dataclass(frozen=True)
class Cell:
    """One (workload, run) of :func:`compare`.

    Attributes:
        workload: The workload's name (its file stem).
        run: The run's name.
        spec: The run as written (``NAME=POLICY[:FLAG,...]``).
        summary: Its summary (empty when it failed).
        error: Why it failed (a one-line message), or None.
        reference: A bound rather than a contender (a ``no-inference`` run).
    """

    workload: str
    run: str
    spec: str
    summary: dict[str, Any]
    error: str | None = None
    reference: bool = False


def compare(
    workloads: Sequence[str | Path],
    runs: Sequence[str],
    *,
    cluster: str = "16x4",
    inference_nodes: int = 8,
    profiles: str | Path | None = None,
    interval: float = 60.0,
    seed: int = 0,
    max_time: float | None = None,
    procs: int | None = None,
    services: str | Path | None = None,
) -> list[Cell]:
    """Simulate every run on every workload, ``procs`` at a time (``deepboot compare``
    without its outputs; each cell's summary equals that of the same run alone).

    Args:
        workloads: Workload CSV files.
        runs: Runs in the run syntax (``deepboot compare --help``), e.g.
            ``"pollux-only=pollux:no-lending,no-afe"``.
        cluster: ``NODESxGPUS``; the last ``inference_nodes`` nodes are the inference pool.
        inference_nodes: Nodes of the inference pool.
        profiles: Measured profiles instead of the built-in catalog.
        interval, seed, max_time: As :func:`simulate`.
        procs: Worker processes (default: the CPUs, at most one per cell).
        services: A services file the workloads are read with (see
            :func:`load_workload`; ``deepboot compare --services``).

    Returns:
        One :class:`Cell` per (workload, run), workload-major.

    Raises:
        ConfigError: a malformed run, an unknown policy or a bad parameter.
        InputError: a bad workload or services file (read before any run).
    """
    import os

    from deepboot.matrix import RunTask, parse_run, run_matrix

    specs = [parse_run(text) for text in runs]
    names = [Path(w).stem for w in workloads]
    # Each workload is read once, here: the runs get its value (a path such as a
    # shell's <(...) pipe can be read only once, and only by this process).
    loaded = [load_workload(w, profiles, services=services) for w in workloads]
    tasks = [
        RunTask(
            index=i * len(specs) + j,
            workload_path=str(path),
            workload_name=name,
            workload=workload,
            run=run,
            cluster=cluster,
            inference_nodes=inference_nodes,
            profiles=None if profiles is None else str(profiles),
            interval=interval,
            seed=seed,
            max_time=max_time,
            services=None if services is None else str(services),
        )
        for i, (path, name, workload) in enumerate(zip(workloads, names, loaded, strict=True))
        for j, run in enumerate(specs)
    ]
    count = procs or max(1, min(os.cpu_count() or 1, len(tasks)))
    outcomes = run_matrix(tasks, count)
    return [
        Cell(
            workload=t.workload_name,
            run=t.run.name,
            spec=t.run.text,
            summary=dict(o.summary),
            error=o.error,
            reference=t.run.no_inference,
        )
        for t, o in zip(tasks, outcomes, strict=True)
    ]
