"""Fidelity benchmark: our Pollux, Tiresias and Optimus against the published figures.

Runs every policy on the eight Pollux workloads (16 x 4 GPUs), once with the measured
reference profiles (``--profiles``) and once with the built-in catalog, and prints our
average JCT next to the published numbers, with the ratio ours / published, and the
wall time and scheduler decision latency of each run.

    .venv/bin/python bench/fidelity.py                      # everything (~10-20 min on 2 cores)
    .venv/bin/python bench/fidelity.py --workloads 6 --no-catalog   # a quick look

Published (Pollux, OSDI'21, 64 GPUs): mean over the 8 workloads Pollux 2751 s,
Tiresias 4038 s, Optimus+Oracle 5682 s; workload-6: 2446 s, 3470 s, 5302 s.
"""

# ruff: noqa: E402  (BLAS threads must be limited before numpy is imported)
from __future__ import annotations

import os

# One BLAS thread per process: the fits are tiny and threads only contend (see tests/conftest.py).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"

PUBLISHED_MEAN = {"pollux": 2751.0, "tiresias": 4038.0, "optimus": 5682.0}
PUBLISHED_W6 = {"pollux": 2446.0, "tiresias": 3470.0, "optimus": 5302.0}
TOLERANCE = {"profiles": 0.10, "catalog": 0.15}


@dataclass(frozen=True)
class Run:
    policy: str
    workload: int
    source: str  # "profiles" or "catalog"


def run_one(run: Run, profiles: str, interval: float, seed: int) -> dict[str, object]:
    """Run one simulation in this process and return its summary dict."""
    from deepboot.core import ClusterSpec
    from deepboot.perf.catalog import load_catalog
    from deepboot.perf.profiles import load_profiles
    from deepboot.policies import registry
    from deepboot.sim.config import SimConfig
    from deepboot.sim.run import simulate
    from deepboot.sim.workload import load_workload

    apps = load_profiles(profiles) if run.source == "profiles" else load_catalog()
    path = TRACES / "workloads" / "pollux" / f"workload-{run.workload}.csv"
    workload = load_workload(path, apps.keys())
    cluster = ClusterSpec.parse("16x4")
    policy = registry.create(run.policy)
    result = simulate(workload, cluster, policy, apps, SimConfig(interval=interval, seed=seed))
    summary = result.summary(run.policy, path.name)
    summary["source"] = run.source
    summary["workload_id"] = run.workload
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--profiles", default=str(TRACES / "profiles"))
    ap.add_argument("--policies", nargs="+", default=["pollux", "tiresias", "optimus"])
    ap.add_argument("--workloads", nargs="+", type=int, default=list(range(1, 9)))
    ap.add_argument("--no-catalog", action="store_true", help="skip the built-in catalog runs")
    ap.add_argument("--interval", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "fidelity.json"))
    args = ap.parse_args(argv)

    sources = ["profiles"] if args.no_catalog else ["profiles", "catalog"]
    runs = [Run(p, w, s) for s in sources for p in args.policies for w in args.workloads]
    console = Console()
    t0 = time.perf_counter()
    results: list[dict[str, object]] = []
    with ProcessPoolExecutor(max_workers=args.procs) as pool:
        futs = [pool.submit(run_one, r, args.profiles, args.interval, args.seed) for r in runs]
        for r, fut in zip(runs, futs, strict=True):
            res = fut.result()
            results.append(res)
            tr = res["training"]
            assert isinstance(tr, dict)
            console.print(
                f"  {r.source:8s} {r.policy:9s} workload-{r.workload}: "
                f"avg JCT {tr['avg_jct_s']:8.0f} s"
                f"  ({res['wall_s']:.1f} s wall)",
                highlight=False,
            )
    total = time.perf_counter() - t0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))

    ok = True
    for source in sources:
        table = Table(title=f"Average JCT (s), 16x4 GPUs, ground truth = {source}")
        table.add_column("workload")
        for p in args.policies:
            table.add_column(p, justify="right")
        by = {(r["policy"], r["workload_id"]): r for r in results if r["source"] == source}
        for w in args.workloads:
            cells = []
            for p in args.policies:
                jct = by[(p, w)]["training"]["avg_jct_s"]  # type: ignore[index]
                cell = f"{jct:.0f}"
                if w == 6 and p in PUBLISHED_W6:
                    cell += f" (pub {PUBLISHED_W6[p]:.0f}, x{jct / PUBLISHED_W6[p]:.2f})"
                cells.append(cell)
            table.add_row(f"workload-{w}", *cells)
        means = {}
        cells = []
        for p in args.policies:
            means[p] = statistics.fmean(by[(p, w)]["training"]["avg_jct_s"] for w in args.workloads)  # type: ignore[index]
            cell = f"{means[p]:.0f}"
            if p in PUBLISHED_MEAN and len(args.workloads) == 8:
                ratio = means[p] / PUBLISHED_MEAN[p]
                within = abs(ratio - 1) <= TOLERANCE[source]
                ok &= within
                cell += f" (pub {PUBLISHED_MEAN[p]:.0f}, x{ratio:.2f} {'ok' if within else 'OUT'})"
            cells.append(cell)
        table.add_row("mean", *cells, style="bold")
        console.print(table)

        speed = Table(title=f"Speed ({source}): per run, median over workloads")
        speed.add_column("policy")
        speed.add_column("wall s (median / max)", justify="right")
        speed.add_column("decision ms median", justify="right")
        speed.add_column("decision ms max", justify="right")
        speed.add_column("rounds (median)", justify="right")
        for p in args.policies:
            rs = [by[(p, w)] for w in args.workloads]
            walls = [float(r["wall_s"]) for r in rs]  # type: ignore[arg-type]
            sch = [r["scheduler"] for r in rs]
            speed.add_row(
                p,
                f"{statistics.median(walls):.1f} / {max(walls):.1f}",
                f"{statistics.median(s['decision_ms_median'] for s in sch):.2f}",  # type: ignore[index]
                f"{max(s['decision_ms_max'] for s in sch):.1f}",  # type: ignore[index]
                f"{statistics.median(s['rounds'] for s in sch):.0f}",  # type: ignore[index]
            )
        console.print(speed)
    console.print(
        f"total bench wall time {total:.0f} s on {args.procs} processes; results in {args.out}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
