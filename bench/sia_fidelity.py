"""Fidelity on several GPU types: the Sia-style reference and Pollux against Sia's table.

Sia (SOSP'23) publishes, for its heterogeneous 64-GPU cluster (6 T4 nodes x 4, 3 RTX
nodes x 8, 2 A100 nodes x 8), the average JCT and makespan of Sia and of Pollux on
the Philly and Helios-Saturn workloads (the shared traces README, ``hetero/``; the
workloads and profiles are Sia's artifact's). This bench runs each of ``--policies``
on each workload of each trace on that cluster with Sia's simulator's costs
(``--sia-costs``: its restart delays and slowdowns) at 60 s rounds, and prints, per
trace and policy, the figures as Sia computes them: the average JCT pooled over every
job of every workload, the makespan averaged over the workloads (each: last
completion minus first submission), both in hours, beside the published ones; the
decision time per round (median, p95) and the share of bert's GPU-hours on A100s.

Pollux here is deepboot's Pollux allocator with a mixed-type allocation cut to its
majority type and a job capped at the smallest type's GPUs (16), Sia's baseline's
rules, and each job keeps one model for every type (a configuration's first
measurement stands, whatever its type), as Sia's baseline; it sees the real nodes,
not Sia's 16 virtual 4-GPU nodes, and searches as deepboot's Pollux does (Sia's
baseline: NSGA-II, unseeded).

    .venv/bin/python bench/sia_fidelity.py --procs 2            # both traces, ~6 min
    .venv/bin/python bench/sia_fidelity.py --traces saturn --policies sia

Credit: Sia's profiles and workloads (github.com/siasosp23/artifacts).
"""

# ruff: noqa: E402  (BLAS threads must be limited before numpy is imported)
from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from deepboot.core.cluster import ClusterSpec
from deepboot.perf.gputypes import apps_for_cluster
from deepboot.perf.profiles import load_profiles
from deepboot.perf.restart import SIA_SLOWDOWNS, sia_restart_cost
from deepboot.policies import registry
from deepboot.sim.config import SimConfig
from deepboot.sim.engine import Simulation
from deepboot.sim.run import simulate
from deepboot.sim.workload import load_workload

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"
CLUSTER = "t4:6x4,rtx:3x8,a100:2x8"
WORKLOADS = {"philly": 8, "saturn": 5}

PUBLISHED = {
    ("philly", "sia"): (0.6, 14.2),
    ("philly", "pollux"): (1.0, 24.5),
    ("saturn", "sia"): (0.7, 14.9),
    ("saturn", "pollux"): (1.0, 25.5),
}
"""(average JCT h, makespan h): Sia's Table 3 (pre-publication draft), heterogeneous."""


Seconds = dict[tuple[str, str | None], float]


class TypeHours:
    """GPU-seconds per (model, GPU type), summed between consecutive events."""

    def __init__(self, cluster: ClusterSpec) -> None:
        self.types = cluster.node_types()
        self.last = 0.0
        self.seconds: Seconds = {}
        self.held: dict[tuple[str, str | None], int] = {}

    def __call__(self, now: float, event: object, sim: Simulation) -> None:
        # The GPUs held since the last event, counted up to this one; then this
        # event's placements.
        span, self.last = now - self.last, now
        for key, gpus in self.held.items():
            self.seconds[key] = self.seconds.get(key, 0.0) + span * gpus
        self.held = {}
        for job in sim.jobs:
            for node in job.placement.node_ids:
                key = (job.spec.application, self.types[node])
                self.held[key] = self.held.get(key, 0) + 1


Run = tuple[
    str, int, str, list[float], float, float, list[float], dict[tuple[str, str | None], float]
]


def run_one(task: tuple[str, int, str]) -> Run:
    """(trace, workload, policy, JCTs s, makespan s, wall s, decision ms, GPU-seconds
    per (model, type)) of one run."""
    trace, number, policy = task
    cluster = ClusterSpec.parse(CLUSTER)
    apps, typed = apps_for_cluster(
        cluster.gpu_types, load_profiles(TRACES / "profiles"), TRACES / "hetero" / "profiles"
    )
    path = TRACES / "hetero" / "workloads" / trace / f"workload-{number}.csv"
    workload = load_workload(path, apps.keys(), {n: a.limits for n, a in apps.items()})
    # Sia's Pollux baseline caps a job at the smallest type's GPUs (16 here).
    cap = min(sum(n.gpus for n in cluster.nodes if n.gpu_type == t) for t in cluster.gpu_types)
    config = SimConfig(
        interval=60.0,
        seed=0,
        restart=sia_restart_cost(),
        slowdowns=SIA_SLOWDOWNS,
        replica_cap=cap if policy == "pollux" else 64,
        model_per_type=policy != "pollux",
    )
    started = time.perf_counter()
    hours = TypeHours(cluster)
    result = simulate(
        workload, cluster, registry.create(policy), apps, config, on_event=hours, typed_apps=typed
    )
    wall = time.perf_counter() - started
    jcts = [r.completion - r.submit for r in result.jobs if r.completion is not None]
    if len(jcts) != len(result.jobs):
        raise SystemExit(f"{trace} {number} {policy}: not every job finished")
    makespan = max(r.completion or 0.0 for r in result.jobs) - min(r.submit for r in result.jobs)
    return trace, number, policy, jcts, makespan, wall, list(result.decision_ms), hours.seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--traces", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--policies", nargs="+", default=["sia", "pollux"])
    parser.add_argument("--procs", type=int, default=1, help="runs at once (default 1)")
    parser.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    args = parser.parse_args()
    if not (TRACES / "hetero").is_dir():
        raise SystemExit(f"{TRACES / 'hetero'} is absent")
    tasks = [
        (trace, n, policy)
        for trace in args.traces
        for policy in args.policies
        for n in range(1, WORKLOADS[trace] + 1)
    ]
    with ProcessPoolExecutor(max_workers=max(args.procs, 1)) as pool:
        results = list(pool.map(run_one, tasks))
    table = Table(title=f"Sia's heterogeneous cluster ({CLUSTER}), --sia-costs, 60 s rounds")
    for col in ("trace", "policy", "runs", "avg JCT h", "published", "ratio"):
        table.add_column(col, justify="right")
    for col in ("makespan h", "published", "ratio", "wall s/run", "decision ms p50/p95"):
        table.add_column(col, justify="right")
    table.add_column("bert on a100", justify="right")
    rows = []
    for trace in args.traces:
        for policy in args.policies:
            mine = [r for r in results if r[0] == trace and r[2] == policy]
            jcts = [j for r in mine for j in r[3]]
            jct_h = sum(jcts) / len(jcts) / 3600
            span_h = sum(r[4] for r in mine) / len(mine) / 3600
            wall = sum(r[5] for r in mine) / len(mine)
            decisions = np.array([d for r in mine for d in r[6]])
            bert = {t: sum(r[7].get(("bert", t), 0.0) for r in mine) for t in ("t4", "rtx", "a100")}
            bert_total = sum(bert.values())
            pub = PUBLISHED.get((trace, policy))
            cells = [
                trace,
                policy,
                str(len(mine)),
                f"{jct_h:.2f}",
                f"{pub[0]:.1f}" if pub else "-",
                f"{jct_h / pub[0]:.2f}x" if pub else "-",
                f"{span_h:.1f}",
                f"{pub[1]:.1f}" if pub else "-",
                f"{span_h / pub[1]:.2f}x" if pub else "-",
                f"{wall:.1f}",
                f"{np.median(decisions):.1f} / {np.percentile(decisions, 95):.1f}",
                f"{bert['a100'] / bert_total:.0%}" if bert_total else "-",
            ]
            table.add_row(*cells)
            rows.append(cells)
    Console().print(table)
    if args.markdown:
        print("| trace | policy | runs | avg JCT h | published | ratio | makespan h | published "
              "| ratio | wall s/run | decision ms p50 / p95 | bert GPU-h on a100 |")  # fmt: skip
        print("|---" * 12 + "|")
        for cells in rows:
            print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
