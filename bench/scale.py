"""A week of a 1,024-GPU cluster in the simulator (issue 49, item 3).

Generates the week with ``deepboot workload week`` (256 nodes x 4 GPUs, the last 128
nodes the inference pool; Philly's busiest week at a nominal training load of 0.8;
the GenAI trace's busiest week at a peak busy fraction of 0.8 of the inference pool)
unless ``--workload`` names one, then simulates it under the recommended
configuration (``--run``, default the ``guarded`` preset) and prints what it took:
wall time, events handled per second, peak memory (the process's largest resident
set), rounds and their decision times, and what the run finished.

``--hours H`` stops the simulated clock at H hours (a part of the week: the table
says how far it got); ``--profile`` prints cProfile's top functions.

    .venv/bin/python bench/scale.py --hours 24            # a day of the week
    .venv/bin/python bench/scale.py                       # the whole week
    .venv/bin/python bench/scale.py --hours 6 --profile   # where the time goes

Sources: Microsoft Philly trace; Alibaba cluster-trace-v2026-GenAI (CC-BY-4.0).
"""

# ruff: noqa: E402  (BLAS threads must be limited before numpy is imported)
from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import cProfile
import pstats
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from deepboot.matrix import RunTask, _task_inputs, parse_run
from deepboot.perf.apps import load_apps
from deepboot.policies import registry
from deepboot.sim.run import simulate

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"
GENAI = TRACES / "inference" / "alibaba-genai-2026"
CLUSTER, INFERENCE_NODES = "256x4", 128


def generate(folder: Path, seed: int, days: int) -> tuple[Path, Path]:
    """``deepboot workload week`` into ``folder``: the workload and its services."""
    from deepboot.cli.main import main as cli

    out = folder / "week.csv"
    code = cli(
        [
            "workload", "week", "--philly", str(TRACES / "philly.csv"),
            "--genai", str(GENAI / "lora_request_trace.csv"),
            "--load-latency", str(GENAI / "basemodel_update_latency_anon.csv"),
            "--profiles", str(TRACES / "profiles"), "--cluster", CLUSTER,
            "--inference-nodes", str(INFERENCE_NODES), "--days", str(days),
            "--seed", str(seed), "--out", str(out),
        ]
    )  # fmt: skip
    if code:
        raise SystemExit(f"deepboot workload week failed ({code})")
    return out, out.with_suffix(".toml")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workload", help="a workload CSV (default: generate the week)")
    ap.add_argument("--services", help="its services file (default: beside it, .toml)")
    ap.add_argument("--days", type=int, default=7, help="days generated (default 7)")
    ap.add_argument("--seed", type=int, default=1, help="the generator's seed (default 1)")
    ap.add_argument("--run", default="guarded", help="the run, as compare --run (default guarded)")
    ap.add_argument("--hours", type=float, help="stop the simulated clock here (default: the end)")
    ap.add_argument("--profile", action="store_true", help="print cProfile's top 30 functions")
    args = ap.parse_args(argv)
    if args.workload is None and not TRACES.is_dir():
        ap.error(f"needs the reference traces in {TRACES} (or --workload)")
    folder = Path(tempfile.mkdtemp(prefix="deepboot-scale-"))
    t0 = time.perf_counter()
    if args.workload is None:
        workload, services = generate(folder, args.seed, args.days)
    else:
        workload = Path(args.workload)
        services = Path(args.services) if args.services else workload.with_suffix(".toml")
    generated_s = time.perf_counter() - t0
    run = parse_run(args.run)
    profiles = str(TRACES / "profiles") if TRACES.is_dir() else None
    task = RunTask(
        0, str(workload), workload.stem, run, CLUSTER, INFERENCE_NODES, profiles,
        run.interval or 60.0, 0,
        max_time=None if args.hours is None else args.hours * 3600.0,
        services=str(services) if services.exists() else None,
    )  # fmt: skip
    t0 = time.perf_counter()
    apps = load_apps(profiles)
    loaded, cluster, config = _task_inputs(task, apps)
    loaded_s = time.perf_counter() - t0
    policy = registry.create(run.policy, **dict(run.params))
    events = 0

    def count(now: float, event: object, sim: object) -> None:
        nonlocal events
        events += 1

    def progress(now: float, done: int, total: int) -> None:
        if int(now) % 21_600 < config.interval:
            took = time.perf_counter() - t0
            print(
                f"  {now / 3600:6.1f} h simulated, {done:,}/{total:,} jobs done, "
                f"{events:,} events, {took:,.0f} s",
                file=sys.stderr,
                flush=True,
            )

    prof = cProfile.Profile() if args.profile else None
    t0 = time.perf_counter()
    if prof is not None:
        prof.enable()
    result = simulate(loaded, cluster, policy, apps, config, progress, on_event=count)
    if prof is not None:
        prof.disable()
    wall = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    done = sum(1 for r in result.jobs if r.completion is not None)
    ms = np.asarray(result.decision_ms) if result.decision_ms else np.zeros(1)
    table = Table(title=f"{workload.name} on {CLUSTER} ({INFERENCE_NODES} inference nodes), "
                  f"run {run.text}")  # fmt: skip
    table.add_column("what")
    table.add_column("value", justify="right")
    rows = [
        ("training jobs (finished)", f"{len(loaded.training):,} ({done:,})"),
        ("inference requests", f"{len(loaded.inference):,}"),
        ("simulated (h)", f"{(result.end_time - result.start_time) / 3600:,.1f}"),
        ("generate / load (s)", f"{generated_s:,.1f} / {loaded_s:,.1f}"),
        ("simulate, wall (s)", f"{wall:,.1f}"),
        ("events", f"{events:,}"),
        ("events per second", f"{events / wall:,.0f}"),
        ("peak memory (MB, max RSS)", f"{peak_mb:,.0f}"),
        ("rounds", f"{result.rounds:,}"),
        ("decision ms (median / p99)", f"{np.median(ms):,.1f} / {np.percentile(ms, 99):,.1f}"),
    ]
    for what, value in rows:
        table.add_row(what, value)
    Console(width=120).print(table)
    if prof is not None:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
