"""What the replicated-matrix benches (``real_workloads.py``, ``frontier.py``) share:
their command-line flags, a progress line, and reading a value out of a summary."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from deepboot.matrix import RunSpec, RunTask


def add_matrix_flags(ap: argparse.ArgumentParser, traces: Path) -> None:
    """``--replications``, ``--quick``, ``--procs``, ``--profiles``, ``--out``."""
    ap.add_argument("--replications", type=int, default=5, help="runs per cell, 1-100 (default 5)")
    ap.add_argument("--quick", action="store_true", help="one replication (a smoke test)")
    ap.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--profiles", default=str(traces / "profiles"))
    ap.add_argument("--out", help="output folder (default: a new temporary folder)")


def matrix_setup(
    ap: argparse.ArgumentParser, args: argparse.Namespace, traces: Path, prefix: str
) -> tuple[int, Path]:
    """The replications and the output folder the flags ask for (``ap.error`` on a bad
    count or missing traces)."""
    reps = 1 if args.quick else args.replications
    if not 1 <= reps <= 100:
        ap.error(f"--replications must be in [1, 100]; got {reps}")
    if not traces.is_dir():
        ap.error(f"needs the reference traces in {traces}")
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix=prefix))
    return reps, out


class Ticker:
    """A line on stderr every ``every`` finished runs (a ``MatrixObserver``)."""

    def __init__(self, total: int, every: int = 10) -> None:
        self.total, self.every = total, every
        self.done, self.started = 0, time.perf_counter()

    def update(self, index: int, now: float, completed: int, total: int) -> None:
        pass

    def finished(self, index: int) -> None:
        self.done += 1
        if self.done % self.every == 0 or self.done == self.total:
            took = time.perf_counter() - self.started
            print(f"  {self.done}/{self.total} runs, {took:.0f} s", file=sys.stderr, flush=True)


def bench_task(
    index: int,
    workload: Path,
    name: str,
    run: RunSpec,
    services: Path,
    profiles: str,
    replication: int,
    reps: int,
    cluster: tuple[str, int] = ("16x4", 8),
    interval: float = 60.0,
) -> RunTask:
    """One run of a bench's matrix: ``workload`` (CSV, named ``name``) with its
    ``services`` file, on ``cluster`` (shape, inference nodes), a scheduling round
    every ``interval`` seconds (60: Pollux's and DeepBoot's), policy seed 0; with
    more than one replication, replication ``replication`` (its own seed and
    jittered submissions)."""
    return RunTask(
        index=index,
        workload_path=str(workload),
        workload_name=name,
        run=run,
        cluster=cluster[0],
        inference_nodes=cluster[1],
        profiles=profiles,
        interval=interval,
        seed=0,
        replication=replication if reps > 1 else None,
        services=str(services),
    )


def summary_value(summary: Mapping[str, Any], path: str) -> float:
    """``summary["a"]["b"]`` for ``path`` ``"a.b"``, as a float."""
    node: Any = summary
    for key in path.split("."):
        node = node[key]
    return float(node)
