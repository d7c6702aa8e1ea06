"""The ``deepboot`` command: argument parsing, error reporting and dispatch.

Every :class:`~deepboot.core.errors.DeepbootError` becomes one line on stderr,
``deepboot: error: <message>``, and exit code 2; argparse errors also exit 2.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import NoReturn

from rich.console import Console

from deepboot import __version__
from deepboot.cli import commands, compare, dashboard, limits, load, runtime, timeline, traces
from deepboot.cli.policy_params import (
    POLICY_HELP,
    add_interval_and_seed,
    add_shared_cluster_flags,
)
from deepboot.cli.services import SERVICES_EPILOG, add_services_flag
from deepboot.core.errors import DeepbootError

EXIT_OK = 0
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130

_DESCRIPTION = """\
deepboot schedules elastic deep-learning training and inference together on one GPU
cluster, and simulates policies on workload traces to compare them: DeepBoot (TPDS'23),
Pollux, Tiresias, Optimus and more."""

_EPILOG = """\
examples:
  deepboot simulate --workload examples/demo-24.csv --policy pollux --cluster 4x4
  deepboot workload from-philly --philly philly.csv --jobs 160 --hours 8 --out w.csv
  deepboot workload from-genai --trace lora_request_trace.csv --cold-start 20 --out g.csv
  deepboot catalog fit --profiles ../shared/traces/profiles --out catalog.json
  deepboot policies
  deepboot up --training-nodes 2 --gpus-per-node 2 && deepboot submit job.toml

Run 'deepboot COMMAND --help' for the options of one command."""

_SIMULATE_EPILOG = """\
examples:
  # the shipped demo: 24 jobs, Pollux, 4 nodes x 4 GPUs
  deepboot simulate --workload examples/demo-24.csv --policy pollux --cluster 4x4

  # a reference workload with the measured profiles, summary saved as JSON
  deepboot simulate --workload ../shared/traces/workloads/pollux/workload-6.csv \\
      --policy pollux --cluster 16x4 --profiles ../shared/traces/profiles \\
      --summary-json out/pollux-6.json

  # a policy parameter (see 'deepboot policies' for each policy's parameters)
  deepboot simulate --workload w.csv --policy tiresias --param key=value

Workload formats: the Pollux CSV (name,time,application,num_replicas,batch_size) and
the DeepBoot CSV (the same plus duration,num_task). Inference rows of a DeepBoot
workload run on the inference pool (--inference-nodes N); with no inference pool
they are ignored (with a warning). Either may end with the optional columns
resize (afe, the default, or restart: every change of that job is a full restart
from a checkpoint) and restart_cost (seconds of one such restart; empty: the cold
delay of its model). Pollux and DeepBoot weigh a restart job's resizes by its own
cost where it exceeds their restart_delay; --param per_job_delta=false weighs every
job by restart_delay.

  # DeepBoot: ATS-T training, ATS-I inference placement, lifecycle and AFE
  deepboot simulate --workload ../shared/traces/workloads/small.csv --policy deepboot \\
      --cluster 16x4 --inference-nodes 8 --profiles ../shared/traces/profiles

  # the training-pool-only baseline
  deepboot simulate --workload ../shared/traces/workloads/small.csv --policy pollux \\
      --cluster 16x4 --inference-nodes 8 --no-lending --profiles ../shared/traces/profiles"""

_PHILLY_EPILOG = """\
example:
  deepboot workload from-philly --philly ../shared/traces/philly.csv \\
      --jobs 160 --hours 8 --seed 1 --out my-workload.csv

Jobs are sampled from the busiest --hours window of the (day-folded) Philly trace and
mapped to models by their GPU time: < 1 GPU-hour cifar10/ncf, < 10 deepspeech2/bert,
< 100 yolov3, < 1000 imagenet. The same --seed always gives the same file."""

_CATALOG_EPILOG = """\
examples:
  # fit into a file of your own (load it with deepboot.perf.catalog.load_catalog)
  deepboot catalog fit --profiles ../shared/traces/profiles --out my-catalog.json

  # developers: regenerate the catalog shipped inside the package
  deepboot catalog fit --profiles ../shared/traces/profiles --update-shipped-catalog

One of --out FILE and --update-shipped-catalog is required. The shipped catalog
(deepboot/perf/catalog.json) is what 'deepboot simulate' and 'deepboot compare' use
when no --profiles is given; only --update-shipped-catalog writes it (--out refuses
that path). The file is written atomically: a failed write leaves the previous one."""


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keeps the examples' line breaks and shows defaults (not "None": an option
    left unset says in its own help what happens then)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """argparse's usage errors end with the CLI's own error line: the usage, then
    ``deepboot: error: <message> (see '<command> --help')``; exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_ERROR, f"deepboot: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (exposed for documentation and tests)."""
    parser = _Parser(
        prog="deepboot", description=_DESCRIPTION, epilog=_EPILOG, formatter_class=_Formatter
    )
    parser.add_argument("--version", action="version", version=f"deepboot {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log progress details to stderr"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    sim = sub.add_parser(
        "simulate",
        help="simulate a scheduling policy on a workload and print the result table",
        description="Replay a workload on a simulated cluster under one policy and report "
        "JCT, makespan, queueing, restarts and scheduler latency.",
        epilog=_SIMULATE_EPILOG + "\n\n" + SERVICES_EPILOG,
        formatter_class=_Formatter,
    )
    sim.add_argument("--workload", required=True, metavar="FILE", help="workload CSV")
    add_services_flag(sim)
    sim.add_argument("--policy", required=True, metavar="NAME", help=POLICY_HELP)
    sim.add_argument(
        "--cluster",
        default="16x4",
        metavar="SHAPE",
        help="NODESxGPUS (16x4), or GPU types by group, nodes numbered in the order "
        f"written: TYPE:NODESxGPUS,... (t4:6x4,rtx:3x8,a100:2x8); {limits.CLUSTER_HELP}",
    )
    sim.add_argument(
        "--inference-nodes",
        type=int,
        default=0,
        metavar="N",
        help=f"the last N nodes form the inference pool, {limits.INFERENCE_NODES_HELP}",
    )
    sim.add_argument(
        "--profiles",
        metavar="DIR",
        help="measured profile directory (reference format); default: the built-in catalog",
    )
    sim.add_argument(
        "--gpu-profiles",
        metavar="DIR",
        help="profiles per GPU type (<model>/placements-<type>.csv, scalability-<type>.csv; "
        "Sia's layout, e.g. ../shared/traces/hetero/profiles), for a --cluster naming types "
        "other than t4 (the --profiles folder's type)",
    )
    sim.add_argument(
        "--sia-costs",
        action="store_true",
        help="Sia's simulator's costs, for checking against its published table: its "
        "per-model restart delays on every change (cifar10 50 s, deepspeech2 25, bert 120, "
        "yolov3 80, imagenet 250, ncf 15, others 30; no AFE) and its per-model slowdowns "
        "of real runs against their profiles (cifar10 1.8, ncf 1.5, others 1.2)",
    )
    add_interval_and_seed(sim, "the policy's", preset_sets_it=True)
    sim.add_argument(
        "--max-time",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"stop at this simulated time, {limits.MAX_TIME_HELP} "
        "(default: when every job is done)",
    )
    sim.add_argument(
        "--summary-json",
        metavar="OUT",
        help="also write the summary as JSON (atomically; never onto an input file)",
    )
    sim.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="policy parameter; repeat for several. For example per_job_delta=false "
        "(pollux, deepboot): ignore each restart job's own resize cost",
    )
    sim.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    add_shared_cluster_flags(sim)
    sim.set_defaults(func=commands.simulate)

    wl = sub.add_parser(
        "workload",
        help="generate workload files",
        description="Generate workload files: training jobs from the Philly trace, "
        "inference streams from production traces (Alibaba GenAI 2026, Azure LLM 2023), "
        "rate profiles, and compositions of them.",
        formatter_class=_Formatter,
    )
    wl_sub = wl.add_subparsers(dest="workload_command", metavar="COMMAND", required=True)
    ph = wl_sub.add_parser(
        "from-philly",
        help="sample a new training workload from the Microsoft Philly trace",
        description="Sample a new training workload (Pollux CSV format) from philly.csv.",
        epilog=_PHILLY_EPILOG,
        formatter_class=_Formatter,
    )
    ph.add_argument("--philly", required=True, metavar="FILE", help="philly.csv")
    ph.add_argument(
        "--jobs", type=int, default=160, help=f"number of jobs, {limits.PHILLY_JOBS_HELP}"
    )
    ph.add_argument(
        "--hours", type=float, default=8.0, help="submission window in hours, 0 < HOURS <= 24"
    )
    ph.add_argument(
        "--start-hour",
        type=int,
        default=None,
        metavar="H",
        help="first hour of the window, 0 <= H <= 23 (default: the busiest window)",
    )
    ph.add_argument("--seed", type=int, default=0, help=f"random seed, {limits.SEED_HELP}")
    ph.add_argument(
        "--out",
        required=True,
        metavar="FILE",
        help="output workload CSV (written atomically; not the --philly file)",
    )
    ph.set_defaults(func=commands.workload_from_philly)
    traces.add_parsers(wl_sub, _Formatter)

    cat = sub.add_parser(
        "catalog",
        help="manage the built-in application catalog",
        description="Manage the application catalog shipped in the package.",
        formatter_class=_Formatter,
    )
    cat_sub = cat.add_subparsers(dest="catalog_command", metavar="COMMAND", required=True)
    fit = cat_sub.add_parser(
        "fit",
        help="fit the catalog from measured profiles",
        description="Fit the compact application catalog from a profile directory.",
        epilog=_CATALOG_EPILOG,
        formatter_class=_Formatter,
    )
    fit.add_argument("--profiles", required=True, metavar="DIR", help="profile directory")
    target = fit.add_mutually_exclusive_group()
    target.add_argument(
        "--out",
        metavar="FILE",
        help="output JSON file (required unless --update-shipped-catalog)",
    )
    target.add_argument(
        "--update-shipped-catalog",
        action="store_true",
        help="developers: overwrite the catalog shipped inside the package "
        "(deepboot/perf/catalog.json) instead of writing --out",
    )
    fit.set_defaults(func=commands.catalog_fit)

    pol = sub.add_parser(
        "policies",
        help="list the registered policies and their parameters",
        description="List the registered training policies and their parameters.",
        formatter_class=_Formatter,
    )
    pol.set_defaults(func=commands.list_policies)

    compare.add_parser(sub)
    runtime.add_parsers(sub, _Formatter)
    dashboard.add_parser(sub, _Formatter)
    load.add_parser(sub, _Formatter)
    timeline.add_parser(sub, _Formatter)
    return parser


class _CliFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"deepboot: {record.levelname.lower()}: {record.getMessage()}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``deepboot`` command.

    Args:
        argv: Arguments without the program name; None reads ``sys.argv[1:]``.

    Returns:
        The exit code: 0 on success, 2 on a usage or input error, 130 on Ctrl-C.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse's own exit (errors: 2, --help: 0)
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR

    # The handler is bound to the current stderr for this call only, so repeated
    # in-process calls (tests) never write to a stale stream.
    logger = logging.getLogger("deepboot")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_CliFormatter())
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if args.verbose else logging.WARNING)
    out = Console(file=sys.stdout)
    err = Console(file=sys.stderr)
    func: Callable[[argparse.Namespace, Console, Console], int] = args.func
    try:
        return func(args, out, err)
    except DeepbootError as exc:
        message = " ".join(str(exc).split())
        print(f"deepboot: error: {message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("deepboot: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def entry() -> NoReturn:
    """The ``deepboot`` console script: :func:`main`, then exit with its code.

    After a large simulation, tearing the interpreter down (freeing its memos and
    models object by object, numba's and LLVM's state) took ~0.3 s of a 7 s run. When
    nothing else runs (no other thread), the exit handlers run (atexit: logging, Ray,
    temporary directories, multiprocessing), the standard streams are flushed, and
    the process ends without that teardown. Every output file is written and closed by
    then (files are written whole and atomically). Otherwise it exits normally.
    """
    code = main()
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if threading.active_count() == 1 and run_exit_handlers is not None:
        run_exit_handlers()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
