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
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from deepboot.cli import limits
from deepboot.cli.files import (
    PathArg,
    check_outputs,
    model_inputs,
    require_path,
    same_file,
    shipped_catalog,
    write_atomic,
    write_text,
)
from deepboot.cli.policy_params import (
    describe,
    parameter_fields,
    resolve_policy,
    shared_cluster_settings,
    split_pairs,
)
from deepboot.cli.progress import SimProgress
from deepboot.cli.services import read_services_arg
from deepboot.core.cluster import ClusterSpec, Pool
from deepboot.core.errors import ConfigError, InputError
from deepboot.report.schema import conform_summary
from deepboot.report.table import inference_table, summary_table

log = logging.getLogger(__name__)


def simulate(args: argparse.Namespace, out: Console, err: Console) -> int:
    """``deepboot simulate``: run one policy on one workload and print the table."""
    from deepboot.perf import gputypes
    from deepboot.perf.apps import load_apps
    from deepboot.policies import registry
    from deepboot.sim.config import SimConfig
    from deepboot.sim.run import simulate as run_simulation
    from deepboot.sim.workload import load_workload

    workload_path = require_path(args.workload, "--workload")
    profiles = None if args.profiles is None else require_path(args.profiles, "--profiles")
    gpu_profiles = args.gpu_profiles
    if gpu_profiles is not None:
        require_path(gpu_profiles, "--gpu-profiles")
    if args.services is not None:
        require_path(args.services, "--services")
    summary_json = args.summary_json
    if summary_json is not None:
        require_path(summary_json, "--summary-json")
    title = resolve_policy(args)
    limits.check_interval(args.interval)
    limits.check_seed(args.seed)
    limits.check_max_time(args.max_time)
    limits.check_cluster(args.cluster, args.inference_nodes)
    cluster = ClusterSpec.parse(args.cluster, args.inference_nodes)
    params = split_pairs(args.param)
    registry.config_class(args.policy)  # unknown policy: fail before loading anything
    if summary_json is not None:
        inputs = [PathArg("--workload", workload_path), *model_inputs(profiles)]
        if args.services is not None:
            inputs.append(PathArg("--services", args.services))
        check_outputs([PathArg("--summary-json", summary_json)], inputs)
    services = read_services_arg(args.services)
    apps = load_apps(profiles)
    apps, typed_apps = gputypes.apps_for_cluster(cluster.gpu_types, apps, gpu_profiles)
    workload = load_workload(
        workload_path, apps.keys(), {n: a.limits for n, a in apps.items()}, services
    )
    if workload.inference and args.inference_nodes == 0:
        log.warning(
            "%s: ignoring its %d inference tasks: there is no inference pool "
            "(give --inference-nodes N to serve them)",
            workload_path,
            len(workload.inference),
        )
        workload = dataclasses.replace(workload, inference=())
    if not workload.training:
        raise InputError(workload_path, 0, "application", "the workload has no training jobs")
    policy = registry.create(args.policy, **params)
    settings = shared_cluster_settings(args, args.inference_nodes, args.policy)
    from deepboot.policies import inference

    # An unknown inference policy or a bad parameter fails before the run, with or
    # without inference rows.
    inference.create(settings["inference_policy"], **settings["inference_params"])
    if args.sia_costs:
        from deepboot.perf.restart import SIA_SLOWDOWNS, sia_restart_cost

        settings["restart"] = sia_restart_cost()
        settings["slowdowns"] = SIA_SLOWDOWNS
    config = SimConfig(interval=args.interval, seed=args.seed, max_time=args.max_time, **settings)

    show = not args.quiet and err.file.isatty()
    started = time.perf_counter()
    with SimProgress(err, total=len(workload.training), enabled=show) as progress:
        result = run_simulation(
            workload, cluster, policy, apps, config, on_progress=progress, typed_apps=typed_apps
        )
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
    if args.preset:
        summary["preset"] = args.preset
    summary = conform_summary(summary)
    if args.preset:
        from deepboot.world.presets import PRESETS

        out.print(f"{args.preset} = {PRESETS[args.preset].parts()}", highlight=False)
    out.print(summary_table(summary, title))
    served = inference_table(summary)
    if served is not None:
        out.print(served)
    if summary_json is not None:
        write_text(summary_json, json.dumps(summary, indent=2) + "\n")
        log.info("wrote %s", summary_json)
    return 0


def workload_from_philly(args: argparse.Namespace, out: Console, err: Console) -> int:
    """``deepboot workload from-philly``: sample a workload CSV from philly.csv."""
    from deepboot.sim.philly import PhillyConfig, generate_from_philly, write_workload_csv

    philly = require_path(args.philly, "--philly")
    out_path = require_path(args.out, "--out")
    limits.check_philly_jobs(args.jobs)
    limits.check_philly_hours(args.hours)
    limits.check_start_hour(args.start_hour)
    limits.check_seed(args.seed)
    check_outputs([PathArg("--out", out_path)], [PathArg("--philly", philly)])
    config = PhillyConfig(start_hour=args.start_hour)
    rng = np.random.default_rng(args.seed)
    jobs = generate_from_philly(philly, args.jobs, args.hours, rng, config)
    write_atomic(out_path, lambda p: write_workload_csv(p, jobs))
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
    """``deepboot catalog fit``: fit the application catalog from profiles.

    Writes ``--out FILE``, or, with ``--update-shipped-catalog`` (developers only), the
    catalog shipped inside the package; ``--out`` never writes the shipped one.
    """
    from deepboot.perf.catalog import catalog_json

    profiles = require_path(args.profiles, "--profiles")
    shipped = shipped_catalog()
    if args.update_shipped_catalog:
        target = PathArg("--update-shipped-catalog", str(shipped))
    elif args.out is None:
        raise ConfigError(
            "catalog fit needs --out FILE (developers regenerate the catalog shipped "
            "in the package with --update-shipped-catalog)"
        )
    else:
        target = PathArg("--out", require_path(args.out, "--out"))
        if same_file(target.path, shipped):
            raise ConfigError(
                f"--out {target.path} is the catalog shipped inside the package; "
                "regenerate it only with --update-shipped-catalog"
            )
    check_outputs([target], [PathArg("--profiles", profiles)])
    write_text(target.path, catalog_json(profiles))
    out.print(f"wrote {target.path}", markup=False, highlight=False, soft_wrap=True)
    return 0


def list_policies(args: argparse.Namespace, out: Console, err: Console) -> int:
    """``deepboot policies``: the registered policies of both kinds and their parameters."""
    from deepboot.policies import inference, registry

    out.print(
        _policy_table(
            "Registered training policies",
            "set a parameter with: deepboot simulate ... --param KEY=VALUE",
            registry.names(),
            registry.config_class,
        )
    )
    out.print(
        _policy_table(
            "Registered inference-placement policies",
            "choose one with --ats-i NAME, set a parameter with --ats-i-param KEY=VALUE",
            inference.names(),
            inference.config_class,
        )
    )
    out.print(_preset_table())
    return 0


def _preset_table() -> Table:
    """The presets: each with its parts and the figures measured for exactly them."""
    from deepboot.world.presets import DEFAULT_PRESET, PRESETS

    table = Table(
        title="Presets: a training policy with the flags it runs best with",
        title_justify="left",
        caption="run one with --policy NAME (simulate, up) or --run NAME (compare); flags "
        f"given beside it win over its own. 'deepboot up' runs {DEFAULT_PRESET} unless "
        "given --policy; the paper's DeepBoot is --policy deepboot",
        caption_justify="left",
    )
    table.add_column("preset")
    table.add_column("what it runs, and what was measured")
    for name, p in sorted(PRESETS.items()):
        label = f"{name}\n(up's default)" if name == DEFAULT_PRESET else name
        lines = [p.parts(), p.summary, *(f"- {f}" for f in p.figures)]
        table.add_row(Text(label), Text("\n".join(lines)))
    return table


def _policy_table(
    title: str, caption: str, names: list[str], config_class: Callable[[str], type[Any]]
) -> Table:
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    table.add_column("policy")
    table.add_column("parameters (type = default)")
    for name in sorted(names):
        fields = parameter_fields(config_class(name))
        lines = [f"{key}: {describe(tp, default)}" for key, (tp, default) in fields.items()]
        table.add_row(Text(name), Text("\n".join(lines) or "(none)"))
    return table
