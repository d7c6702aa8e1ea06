"""Simulator speed: wall time and peak memory of the runs researchers wait for.

Each case is one ``deepboot simulate`` in its own process (so its peak memory is its
own), one after the other, and the table puts each wall time next to the issue-10
target and, for ``small.csv``, next to the reference DeepBoot artifact's 891 s on
this machine class (the figure the issue quotes; the artifact itself is not run here).

    .venv/bin/python bench/speed.py                 # every case (~1.5 min on 2 cores)
    .venv/bin/python bench/speed.py --only small    # cases whose name contains "small"
    .venv/bin/python bench/speed.py --against cbf8b0d --pairs 3   # side by side

``--against REV`` checks REV out in a temporary git worktree and runs each case with
it and with the working tree, alternating (so both see the same machine noise), each
through its own console-script path; the table gives the medians, the median of the
paired ratios with their range, and whether the summaries are the same (every field
but the wall time and decision latencies). One discarded run of each checkout first
compiles its numba kernels where its cache lacks them.
"""

# ruff: noqa: E402  (BLAS threads must be limited before numpy is imported)
from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import json
import statistics
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
        # The recommended configuration (up's default): the SLO guard's forecast and
        # burstiness, the host cache, 30 s rounds. Its target: twice deepboot's.
        Case("guarded small", ("--workload", str(TRACES / "workloads/small.csv"),
             "--policy", "guarded", *pool), 18.0),
    ]  # fmt: skip
    for i in range(1, 9):
        path = TRACES / "workloads" / "pollux" / f"workload-{i}.csv"
        out.append(Case(f"pollux workload-{i}", ("--workload", str(path),
                        "--policy", "pollux", *shared), 8.0))  # fmt: skip
    return out


_TIMING_FIELDS = frozenset({"wall_s", "decision_ms_median", "decision_ms_max"})

# The console script of whichever code PYTHONPATH puts first (older code has no entry).
_CONSOLE = (
    "import sys; import deepboot.cli.main as m; "
    "m.entry() if hasattr(m, 'entry') else sys.exit(m.main())"
)


def run(case: Case, root: Path | None = None) -> tuple[float, float, dict[str, object]]:
    """(wall s, peak RSS MiB, summary) of one case in a child process: the installed
    console script, or the code under ``root`` (a checkout) when given."""
    with tempfile.TemporaryDirectory() as tmp:
        summary = Path(tmp) / "s.json"
        env = None
        if root is None:
            cmd = [str(REPO / ".venv" / "bin" / "deepboot")]
        else:
            cmd = [str(REPO / ".venv" / "bin" / "python"), "-c", _CONSOLE]
            env = dict(os.environ, PYTHONPATH=str(root))
        cmd += ["simulate", *case.args, "--quiet", "--summary-json", str(summary)]
        started = time.perf_counter()
        proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=root
        )
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise SystemExit(f"{case.name}: exit {proc.returncode}: {err.strip()}")
        return wall, usage.ru_maxrss / 1024.0, json.loads(summary.read_text())


def _results(summary: object) -> object:
    """A summary without its timing fields (what must not change between versions)."""
    if isinstance(summary, dict):
        return {k: _results(v) for k, v in summary.items() if k not in _TIMING_FIELDS}
    if isinstance(summary, list):
        return [_results(v) for v in summary]
    return summary


def side_by_side(rev: str, pairs: int, only: str) -> int:
    """Run each selected case with ``rev`` and with the working tree, alternating."""
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "rev"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(old), rev],
            check=True,
        )
        try:
            table = Table(title=f"Side by side: {rev} vs the working tree ({pairs} pairs)")
            for col in ("case", f"{rev} s", "now s", "before/after", "range", "same results"):
                table.add_column(col, justify="left" if col == "case" else "right")
            selected = [c for c in cases() if only in c.name]
            progress = Console(stderr=True)  # a line per case: the whole run takes minutes
            if selected:  # compiles each checkout's numba kernels where needed
                run(selected[0], old)
                run(selected[0], REPO)
            for case in selected:
                try:  # a case REV cannot run (a flag or a preset it lacks) is a row
                    run(case, old)
                except SystemExit as exc:
                    progress.print(f"{case.name}: not in {rev}: {exc}", highlight=False)
                    table.add_row(case.name, "-", "-", "-", "-", f"not in {rev}")
                    continue
                before: list[float] = []
                after: list[float] = []
                same = True
                for i in range(pairs):
                    order = [(old, before), (REPO, after)]
                    for root, into in order if i % 2 == 0 else order[::-1]:
                        wall, _, summary = run(case, root)
                        into.append(wall)
                        results = _results(summary)
                        if root is old:
                            ref = results
                        else:
                            now = results
                    same = same and ref == now
                ratios = sorted(b / a for a, b in zip(after, before, strict=True))
                progress.print(f"{case.name}: {before} s vs {after} s", highlight=False)
                table.add_row(
                    case.name, f"{statistics.median(before):.2f}",
                    f"{statistics.median(after):.2f}", f"{statistics.median(ratios):.2f}x",
                    f"{ratios[0]:.2f}-{ratios[-1]:.2f}", "yes" if same else "NO",
                )  # fmt: skip
            Console(width=160).print(table)
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)], check=False
            )
            subprocess.run(["git", "-C", str(REPO), "worktree", "prune"], check=False)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    ap.add_argument(
        "--against", metavar="REV", help="also run git revision REV, side by side (see above)"
    )
    ap.add_argument(
        "--pairs", type=int, default=3, help="runs of each version per case (default 3)"
    )
    args = ap.parse_args(argv)
    if not TRACES.is_dir():
        print(f"speed: no traces at {TRACES}", file=sys.stderr)
        return 2
    if args.against:
        return side_by_side(args.against, max(args.pairs, 1), args.only)
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
