"""What serving's own GPUs cost training: Pollux on fewer GPUs, no inference at all.

Issue 23 asks for ``middle.csv``'s SLO-guarded JCT within 5% of the all-GPU limit
(Pollux on all 64 GPUs, the inference dropped). Serving takes GPUs whatever a
policy does: on ``middle.csv`` its tasks keep ~3 GPUs busy on average. This bench
measures the JCT that capacity alone costs: Pollux on the workload's training jobs
on N GPUs (sixteen 4-GPU nodes less 64 - N GPUs taken from the last ones), for each
N of ``--gpus``, the same K replications as ``bench/frontier.py`` (replication i:
policy seed i, submissions jittered by +-30 s with ``default_rng(i)``).

A policy that lends every GPU not serving, at no cost (no idle replica, no reclaim,
no resize), would run training on 64 minus the serving GPUs at each instant; the
row for 64 minus the mean serving GPUs is a rough reference for it (a mean, not a
bound: serving varies over the run).

    .venv/bin/python bench/floor.py --procs 2                  # middle, N = 64..60
    .venv/bin/python bench/floor.py --workload small --gpus 64 62
"""

# ruff: noqa: E402  (BLAS threads must be limited before numpy is imported)
from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import dataclasses
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from deepboot.core.cluster import ClusterSpec, Node, Pool
from deepboot.perf.apps import load_apps
from deepboot.policies import registry
from deepboot.report.stats import mean_interval
from deepboot.sim.config import SimConfig
from deepboot.sim.run import simulate
from deepboot.sim.workload import jitter_submissions, load_workload
from deepboot.world.settings import SharedCluster

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"
GPUS_PER_NODE, NODES = 4, 16


def cluster_of(gpus: int) -> ClusterSpec:
    """``gpus`` GPUs as 4-GPU training nodes, the last one holding the remainder."""
    if not 1 <= gpus <= GPUS_PER_NODE * NODES:
        raise SystemExit(f"--gpus {gpus}: must be in [1, {GPUS_PER_NODE * NODES}]")
    full, rest = divmod(gpus, GPUS_PER_NODE)
    sizes = [GPUS_PER_NODE] * full + ([rest] if rest else [])
    return ClusterSpec(tuple(Node(i, g, Pool.TRAINING) for i, g in enumerate(sizes)))


def one(args: tuple[str, str, int, int]) -> tuple[int, int, float]:
    """(GPUs, replication, average JCT) of Pollux on ``gpus`` GPUs."""
    csv, profiles, gpus, rep = args
    apps = load_apps(profiles)
    workload = load_workload(csv, apps.keys(), {n: a.limits for n, a in apps.items()})
    workload = dataclasses.replace(workload, inference=())
    workload = jitter_submissions(workload, np.random.default_rng(rep), 30.0)
    kwargs = SharedCluster().sim_kwargs(inference_nodes=0, policy="pollux")
    config = SimConfig(interval=60.0, seed=rep, **kwargs)
    result = simulate(workload, cluster_of(gpus), registry.create("pollux"), apps, config)
    jct = float(result.summary("pollux", Path(csv).stem)["training"]["avg_jct_s"])
    return gpus, rep, jct


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Pollux's average JCT on fewer GPUs: what serving's own GPUs cost.",
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--workload", default="middle", help="a DeepBoot workload (default middle)")
    ap.add_argument("--gpus", type=int, nargs="+", default=[64, 63, 62, 61, 60])
    ap.add_argument("--replications", type=int, default=5)
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--traces", type=Path, default=TRACES)
    args = ap.parse_args(argv)
    csv = args.traces / "workloads" / f"{args.workload}.csv"
    if not csv.is_file():
        ap.error(f"no workload {csv}")
    profiles = str(args.traces / "profiles")
    for g in args.gpus:
        cluster_of(g)
    cells = [(str(csv), profiles, g, r) for g in args.gpus for r in range(args.replications)]
    jcts: dict[int, list[float]] = {g: [] for g in args.gpus}
    console = Console(stderr=True)
    with ProcessPoolExecutor(max_workers=max(args.procs, 1)) as pool:
        for i, (g, _, jct) in enumerate(pool.map(one, cells), 1):
            jcts[g].append(jct)
            console.print(f"[{i}/{len(cells)}] {g} GPUs: {jct:,.0f} s", highlight=False)
    full = mean_interval(jcts[max(args.gpus)]).mean
    table = Table(title=f"Pollux on {args.workload}.csv's training jobs, no inference")
    for col in ("GPUs", "avg JCT (s)", f"vs {max(args.gpus)} GPUs"):
        table.add_column(col, justify="right")
    for g in args.gpus:
        iv = mean_interval(jcts[g])
        table.add_row(str(g), f"{iv.mean:,.0f} ± {iv.half:,.0f}", f"{iv.mean / full:.3f}x")
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
