"""Simulator speed: wall time and peak memory of the runs researchers wait for.

Each case is one ``deepboot simulate`` in its own process (so its peak memory is its
own), one after the other, and the table puts each wall time next to the issue-10
target and, for ``small.csv``, next to the reference DeepBoot artifact's 891 s on
this machine class (the figure the issue quotes; the artifact itself is not run here).

    .venv/bin/python bench/speed.py                 # every case (~6 min on 2 cores)
    .venv/bin/python bench/speed.py --only small    # cases whose name contains "small"
"""

# ruff: noqa: E402  (BLAS threads must be limited before numpy is imported)
from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"
REFERENCE_SMALL_S = 891.0
"""The reference DeepBoot artifact on small.csv, on this machine class (issue 10)."""


@dataclass(frozen=True)
class Case:
    name: str
    args: tuple[str, ...]
    target_s: float


def cases() -> list[Case]:
    shared = ("--cluster", "16x4", "--profiles", str(TRACES / "profiles"))
    pool = (*shared, "--inference-nodes", "8")
    out = [
        Case("deepboot small", ("--workload", str(TRACES / "workloads/small.csv"),
             "--policy", "deepboot", *pool), 9.0),
        Case("deepboot middle", ("--workload", str(TRACES / "workloads/middle.csv"),
             "--policy", "deepboot", *pool), 20.0),
        Case("pollux --no-lending small", ("--workload", str(TRACES / "workloads/small.csv"),
             "--policy", "pollux", "--no-lending", *pool), 10.0),
    ]  # fmt: skip
    for i in range(1, 9):
        path = TRACES / "workloads" / "pollux" / f"workload-{i}.csv"
        out.append(Case(f"pollux workload-{i}", ("--workload", str(path),
                        "--policy", "pollux", *shared), 8.0))  # fmt: skip
    return out


def run(case: Case) -> tuple[float, float, dict[str, object]]:
    """(wall s, peak RSS MiB, summary) of one case in a child process."""
    with tempfile.TemporaryDirectory() as tmp:
        summary = Path(tmp) / "s.json"
        cmd = [str(REPO / ".venv" / "bin" / "deepboot"), "simulate", *case.args]
        cmd += ["--quiet", "--summary-json", str(summary)]
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise SystemExit(f"{case.name}: exit {proc.returncode}: {err.strip()}")
        return wall, usage.ru_maxrss / 1024.0, json.loads(summary.read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    args = ap.parse_args(argv)
    if not TRACES.is_dir():
        print(f"speed: no traces at {TRACES}", file=sys.stderr)
        return 2
    table = Table(title="Simulator speed (one process per case, one at a time)")
    for col in ("case", "wall s", "target s", "x target", "vs reference", "peak MiB", "avg JCT s"):
        table.add_column(col, justify="left" if col == "case" else "right")
    for case in cases():
        if args.only not in case.name:
            continue
        wall, rss, summary = run(case)
        ref = f"{REFERENCE_SMALL_S / wall:.0f}x faster" if case.name == "deepboot small" else ""
        jct = summary["training"]["avg_jct_s"]  # type: ignore[index]
        table.add_row(
            case.name, f"{wall:.1f}", f"{case.target_s:g}", f"{wall / case.target_s:.2f}",
            ref, f"{rss:.0f}", f"{jct:,.0f}",
        )  # fmt: skip
    Console(width=160).print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
