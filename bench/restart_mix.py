"""Restart jobs beside AFE jobs (issue 46, part 5), one command.

The simulator on DeepBoot's ``middle.csv`` (160 training jobs, 16,000 inference tasks;
16 x 4 GPUs, nodes 8-15 the inference pool, the measured profiles) under the product
default preset ``guarded`` (Pollux's allocator, the SLO guard, a 1 GB host cache,
30 s rounds), four ways:

* ``all-afe``: every training job resizes with AFE (the workload as shipped);
* ``all-restart``: every training job restarts from a checkpoint on every change;
* ``half-restart``: every other training job, in submission order (the 2nd, 4th, ...),
  restarts; the others resize with AFE;
* ``half-uniform``: the same half, with the policy ignoring each job's own restart
  cost (``per_job_delta=false``: Pollux's 30 s delta for every job).

A restart job's change costs the cold delay of its model from DeepBoot's table
(ALGORITHMS.md §2.5; the simulator's default for a ``resize=restart`` job without a
``restart_cost``); an AFE job pays what ``AfeRestartCost`` charges. Each cell is run
``--replications`` times on the same jittered workloads (replication i: policy seed i,
submissions moved by up to ±30 s), and the table gives each run's mean with its 95%
Student-t interval and the paired difference of the average JCT against ``all-afe``
(``deepboot compare --replications``' machinery)::

    .venv/bin/python bench/restart_mix.py                   # 5 replications
    .venv/bin/python bench/restart_mix.py --replications 3  # shorter
    .venv/bin/python bench/restart_mix.py --policy deepboot # the paper's ATS-T (10 s delta)
    .venv/bin/python bench/restart_mix.py --cost afe-scaled # restart = afe x the runtime's ratio

``--cost afe-scaled``: a restart job's every change costs its model's AFE delay times
the runtime's measured ratio of a command job's restart pause to an AFE job's
(:data:`RUNTIME_PAUSES_S`: 8.30 s / 0.34 s, docs/benchmarks.md "Resize cost"), its
``restart_cost``, instead of the table's cold delay.
"""

# ruff: noqa: E402  (BLAS threads must be limited before numpy is imported)
from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import dataclasses
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from deepboot.core.jobs import Workload
from deepboot.matrix import RunTask, parse_run, run_matrix
from deepboot.perf.apps import load_apps
from deepboot.perf.restart import DEEPBOOT_RESTART_TABLE
from deepboot.report.intervals import interval_rows, interval_table, intervals_csv
from deepboot.report.stats import mean_interval, paired_difference
from deepboot.sim.workload import load_workload

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"
WORKLOAD = "middle"
PRESET = "guarded"
BASELINE = "all-afe"

RUNTIME_PAUSES_S = (8.30, 0.34)
"""The runtime's measured median pause of a command job's restart and of an AFE
resize of the same model (docs/benchmarks.md, "Resize cost: AFE against a command
job"; 24x): for context, and the scale of ``--cost afe-scaled``."""


def mark_restart(workload: Workload, every: int, scaled: bool = False) -> Workload:
    """``workload`` with every ``every``-th training job (submission order, from the
    ``every``-th on; 1: all of them) a ``resize="restart"`` job at its model's cold
    delay (``scaled``: at its AFE delay times the runtime's restart/AFE ratio); the
    others unchanged (AFE)."""
    restart, afe = RUNTIME_PAUSES_S

    def cost(app: str) -> float | None:
        return DEEPBOOT_RESTART_TABLE[app].afe * restart / afe if scaled else None

    jobs = tuple(
        dataclasses.replace(j, resize="restart", restart_cost=cost(j.application))
        if (i + 1) % every == 0
        else j
        for i, j in enumerate(workload.training)
    )
    return dataclasses.replace(workload, training=jobs)


def variants(
    workload: Workload, policy: str, scaled: bool = False
) -> list[tuple[str, Workload, str]]:
    """(run name, workload, run text) of the four runs under ``policy`` (a preset or a
    policy with a ``per_job_delta`` parameter)."""
    half = mark_restart(workload, 2, scaled)
    return [
        (BASELINE, workload, policy),
        ("all-restart", mark_restart(workload, 1, scaled), policy),
        ("half-restart", half, policy),
        ("half-uniform", half, f"{policy}:per_job_delta=false"),
    ]


def avg_jcts(
    samples: Mapping[tuple[str, str], Sequence[Mapping[str, Any]]], run: str
) -> list[float]:
    return [float(s["training"]["avg_jct_s"]) for s in samples[(WORKLOAD, run)]]


def ratio_table(samples: Mapping[tuple[str, str], Sequence[Mapping[str, Any]]]) -> Table:
    """Mean average JCT of each run over that of another, and the paired difference."""
    table = Table(
        title="Ratios of the mean average JCT (paired differences: mean ± 95% interval)",
        title_justify="left",
    )
    for col in ("run", "over", "ratio", "Δ avg JCT (s)", "real?"):
        table.add_column(col, justify="left" if col in ("run", "over") else "right")
    pairs = [
        ("all-restart", BASELINE),
        ("half-restart", BASELINE),
        ("half-uniform", BASELINE),
        ("half-uniform", "half-restart"),
    ]
    for run, over in pairs:
        mine, theirs = avg_jcts(samples, run), avg_jcts(samples, over)
        ratio = mean_interval(mine).mean / mean_interval(theirs).mean
        diff = paired_difference(mine, theirs) if len(mine) > 1 else None
        cell = "-" if diff is None else f"{diff.mean:+,.0f} ± {diff.half:,.0f}"
        real = "-" if diff is None else ("yes" if diff.excludes_zero else "no")
        table.add_row(run, over, f"{ratio:.3f}", cell, real)
    return table


def cost_table(scaled: bool = False) -> Table:
    """The restart costs the runs charge, per model."""
    restart, afe = RUNTIME_PAUSES_S
    what = f"afe x {restart / afe:.1f}" if scaled else "cold"
    table = Table(title="Delays charged (DeepBoot's table, s)", title_justify="left")
    for col in ("model", f"restart job: every change ({what})", "AFE job: shrink (afe)"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for model, d in sorted(DEEPBOOT_RESTART_TABLE.items()):
        charged = d.afe * restart / afe if scaled else d.cold
        table.add_row(model, f"{charged:.0f}", f"{d.afe:g}")
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--replications", type=int, default=5, help="runs per cell, 1-100 (default 5)")
    ap.add_argument(
        "--policy",
        default=PRESET,
        choices=(PRESET, "deepboot", "pollux"),
        help=f"the preset or policy of every run (default {PRESET}, the product default)",
    )
    ap.add_argument(
        "--cost",
        choices=("cold", "afe-scaled"),
        default="cold",
        help="a restart job's cost per change: its model's cold delay (default), or its AFE "
        "delay times the runtime's measured restart/AFE ratio",
    )
    ap.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--profiles", default=str(TRACES / "profiles"))
    ap.add_argument("--out", help="also write intervals.csv here")
    args = ap.parse_args(argv)
    reps = args.replications
    if not 1 <= reps <= 100:
        ap.error(f"--replications must be in [1, 100]; got {reps}")
    path = TRACES / "workloads" / f"{WORKLOAD}.csv"
    if not path.is_file():
        ap.error(f"needs the reference traces: {path} is missing")

    apps = load_apps(args.profiles)
    workload = load_workload(path, apps.keys(), {n: a.limits for n, a in apps.items()})
    scaled = args.cost == "afe-scaled"
    runs = variants(workload, args.policy, scaled)
    tasks = [
        RunTask(
            index=i * reps + r,
            workload_path=str(path),
            workload_name=WORKLOAD,
            run=dataclasses.replace(parse_run(text), name=name),
            cluster="16x4",
            inference_nodes=8,
            profiles=args.profiles,
            interval=60.0,
            seed=0,
            replication=r if reps > 1 else None,
            workload=variant,
        )
        for i, (name, variant, text) in enumerate(runs)
        for r in range(reps)
    ]
    restart_jobs = sum(j.resize == "restart" for j in runs[2][1].training)
    print(
        f"{WORKLOAD}.csv: {len(workload.training)} training jobs ({restart_jobs} marked restart "
        f"in the half runs: every other job in submission order), {len(workload.inference):,} "
        f"inference tasks; {args.policy}; {len(tasks)} simulations, {args.procs} at a time",
        file=sys.stderr,
    )
    started = time.perf_counter()
    outcomes = run_matrix(tasks, max(1, min(args.procs, len(tasks))))
    wall_s = time.perf_counter() - started
    failed = [(t, o) for t, o in zip(tasks, outcomes, strict=True) if o.error]
    for t, o in failed:
        print(f"failed: {t.run.name} replication {t.replication}: {o.error}", file=sys.stderr)
    if failed:
        return 1

    samples: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for t, o in zip(tasks, outcomes, strict=True):
        samples.setdefault((WORKLOAD, t.run.name), []).append(o.summary)
    rows = interval_rows(samples, BASELINE)
    console = Console(width=200)
    console.print(cost_table(scaled))
    console.print(interval_table(rows, BASELINE, reps))
    console.print(ratio_table(samples))
    restart, afe = RUNTIME_PAUSES_S
    print(
        f"For context, the runtime's measured median pauses: restart {restart:g} s, "
        f"AFE {afe:g} s ({restart / afe:.0f}x; docs/benchmarks.md). "
        f"{len(tasks)} simulations in {wall_s:.0f} s."
    )
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "intervals.csv").write_text(intervals_csv(rows))
        print(f"wrote {out / 'intervals.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
