"""The handlers of the ``deepboot`` subcommands.

Each handler takes the parsed arguments and the stdout/stderr consoles and returns an
exit code; errors are raised as :class:`~deepboot.core.errors.DeepbootError` and turned
into one stderr line by :func:`deepboot.cli.main.main`.

The simulation stack (perf, policies, sim) is imported inside the handlers that need
it, so ``deepboot --help`` and the workload tools start fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from deepboot.cli.params import (
    describe,
    parameter_fields,
    shared_cluster_settings,
    split_pairs,
)
from deepboot.cli.progress import SimProgress
from deepboot.core.cluster import ClusterSpec, Pool
from deepboot.core.errors import ConfigError, InputError
from deepboot.report.schema import conform_summary
from deepboot.report.table import summary_table

if TYPE_CHECKING:
    from deepboot.perf.application import Application

log = logging.getLogger(__name__)


def simulate(args: argparse.Namespace, out: Console, err: Console) -> int:
    """``deepboot simulate``: run one policy on one workload and print the table."""
    from deepboot.policies import registry
    from deepboot.sim.config import SimConfig
    from deepboot.sim.run import simulate as run_simulation
    from deepboot.sim.workload import load_workload

    if not (math.isfinite(args.interval) and args.interval > 0):
        raise ConfigError(f"--interval must be a positive number of seconds, got {args.interval}")
    cluster = ClusterSpec.parse(args.cluster, args.inference_nodes)
    params = split_pairs(args.param)
    registry.config_class(args.policy)  # unknown policy: fail before loading anything
    apps = _load_apps(args.profiles)
    workload = load_workload(args.workload, apps.keys())
    if workload.inference and args.inference_nodes == 0:
        log.warning(
            "%s: ignoring its %d inference tasks: there is no inference pool "
            "(give --inference-nodes N to serve them)",
            args.workload,
            len(workload.inference),
        )
        workload = dataclasses.replace(workload, inference=())
    if not workload.training:
        raise InputError(args.workload, 0, "application", "the workload has no training jobs")
    policy = registry.create(args.policy, **params)
    settings = shared_cluster_settings(args, args.inference_nodes, args.policy)
    if workload.inference:
        from deepboot.policies import inference

        inference.create(settings["inference_policy"])  # unknown name: fail early
    config = SimConfig(interval=args.interval, seed=args.seed, **settings)

    show = not args.quiet and err.file.isatty()
    started = time.perf_counter()
    with SimProgress(err, total=len(workload.training), enabled=show) as progress:
        result = run_simulation(workload, cluster, policy, apps, config, on_progress=progress)
    wall_s = time.perf_counter() - started

    summary: dict[str, Any] = dict(result.summary(args.policy, workload.name))
    # The engine owns these numbers; fill them only if it left them out.
    summary.setdefault("wall_s", wall_s)
    summary.setdefault(
        "cluster",
        {
            "nodes": cluster.num_nodes,
            "gpus_per_node": cluster.gpus_per_node,
            "inference_nodes": len(cluster.pool_nodes(Pool.INFERENCE)),
        },
    )
    summary = conform_summary(summary)
    out.print(summary_table(summary))
    if args.summary_json:
        _write_json(Path(args.summary_json), summary)
        log.info("wrote %s", args.summary_json)
    return 0


def _load_apps(profiles: str | None) -> Mapping[str, Application]:
    """Measured profiles from ``profiles`` if given, else the built-in catalog."""
    if profiles:
        from deepboot.perf.profiles import load_profiles

        return load_profiles(profiles)
    from deepboot.perf.catalog import load_catalog

    return load_catalog()


def _write_json(path: Path, data: dict[str, Any]) -> None:
    try:
        path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise InputError(str(path), 0, "", f"cannot write: {exc.strerror or exc}") from None


def workload_from_philly(args: argparse.Namespace, out: Console, err: Console) -> int:
    """``deepboot workload from-philly``: sample a workload CSV from philly.csv."""
    from deepboot.sim.philly import PhillyConfig, generate_from_philly, write_workload_csv

    config = PhillyConfig(start_hour=args.start_hour)
    rng = np.random.default_rng(args.seed)
    jobs = generate_from_philly(args.philly, args.jobs, args.hours, rng, config)
    try:
        write_workload_csv(args.out, jobs)
    except OSError as exc:
        raise InputError(args.out, 0, "", f"cannot write: {exc.strerror or exc}") from None
    mix = Counter((j.application, j.num_replicas, j.batch_size) for j in jobs)
    table = Table(title="Model mix", title_justify="left")
    for col in ("application", "num_replicas", "batch_size", "jobs"):
        table.add_column(col, justify="left" if col == "application" else "right")
    for (app, replicas, batch), n in sorted(mix.items()):
        table.add_row(Text(app), str(replicas), str(batch), str(n))
    out.print(table)
    out.print(
        f"{len(jobs)} jobs written to {args.out}", markup=False, highlight=False, soft_wrap=True
    )
    return 0


def catalog_fit(args: argparse.Namespace, out: Console, err: Console) -> int:
    """``deepboot catalog fit``: fit the application catalog from profiles."""
    import deepboot.perf
    from deepboot.perf.catalog import write_catalog

    target = Path(args.out) if args.out else Path(deepboot.perf.__file__).parent / "catalog.json"
    try:
        write_catalog(args.profiles, target)
    except OSError as exc:
        raise InputError(str(target), 0, "", f"cannot write: {exc.strerror or exc}") from None
    out.print(f"wrote {target}", markup=False, highlight=False, soft_wrap=True)
    return 0


def list_policies(args: argparse.Namespace, out: Console, err: Console) -> int:
    """``deepboot policies``: the registered policies and their parameters."""
    from deepboot.policies import registry

    table = Table(
        title="Registered training policies",
        title_justify="left",
        caption="set a parameter with: deepboot simulate ... --param KEY=VALUE",
        caption_justify="left",
    )
    table.add_column("policy")
    table.add_column("parameters (type = default)")
    for name in sorted(registry.names()):
        fields = parameter_fields(registry.config_class(name))
        lines = [f"{key}: {describe(tp, default)}" for key, (tp, default) in fields.items()]
        table.add_row(Text(name), Text("\n".join(lines) or "(none)"))
    out.print(table)
    return 0
