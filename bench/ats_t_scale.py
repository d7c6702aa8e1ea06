"""ATS-T decision time against cluster size and job count (DeepBoot §2.4, goal §5).

Builds random snapshots (every job fitted, each with its own throughput parameters,
half of them running) and times ``DeepBootPolicy.allocate`` side by side:

* cold: the first decision on the snapshot, speedup memos empty (every job's goodput
  optimized from scratch, as after a refit);
* warm: the same decision again (memos filled, as for jobs whose model did not change);
* knapsack: the group-knapsack DP alone, on the values of that decision;
* cold CPU / warm CPU: the CPU seconds of those decisions (this process only: on a
  shared, loaded machine wall times swell, CPU times much less).

``K`` is the largest ``max_replicas``: "mixed" draws each job's from {1, 2, 4, 8, 16, 32,
64} (jobs that ran at few GPUs have a small cap, as in the simulator), "64" gives every
job the global cap, the DP's worst case.

    .venv/bin/python bench/ats_t_scale.py            # the full table (~1-2 min on 2 cores)
    .venv/bin/python bench/ats_t_scale.py --quick    # small sizes only
    .venv/bin/python bench/ats_t_scale.py --size 4096x2000   # one size (repeatable)
    .venv/bin/python bench/ats_t_scale.py --objective power-mean   # Pollux's objective
    .venv/bin/python bench/ats_t_scale.py --policy pollux --size 64x100   # Pollux's search
    .venv/bin/python bench/ats_t_scale.py --objective power-mean --solver core  # recommended

Not a test: nothing fails on a wall-clock figure.
"""

from __future__ import annotations

import os

# One BLAS thread: the arrays are small and threads only contend (see tests/conftest.py).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from deepboot.core import (  # noqa: E402
    BatchLimits,
    ClusterSpec,
    ClusterState,
    GradParams,
    JobView,
    Node,
    PerfParams,
    Placement,
)
from deepboot.perf.speedup import adaptive_speedup  # noqa: E402
from deepboot.policies.allocation import group_knapsack  # noqa: E402
from deepboot.policies.base import TrainingPolicy  # noqa: E402
from deepboot.policies.deepboot import (  # noqa: E402
    DeepBootConfig,
    DeepBootPolicy,
    Objective,
    Solver,
)
from deepboot.policies.pollux import PolluxPolicy  # noqa: E402

LIMITS = BatchLimits(init_batch_size=128, max_batch_size=4096, min_local_bsz=32, max_local_bsz=1024)
CAPS = (1, 2, 4, 8, 16, 32, 64)


def make_snapshot(gpus: int, num_jobs: int, caps: str, seed: int) -> ClusterState:
    """A cluster of ``gpus`` GPUs (8 per node, 4 below 64) with ``num_jobs`` fitted jobs."""
    rng = np.random.default_rng(seed)
    per_node = 4 if gpus < 64 else 8
    cluster = ClusterSpec(tuple(Node(i, per_node) for i in range(gpus // per_node)))
    free = {n.node_id: n.gpus for n in cluster.nodes}
    jobs: list[JobView] = []
    for i in range(num_jobs):
        perf = PerfParams(
            alpha_c=float(rng.uniform(0.01, 0.05)),
            beta_c=float(rng.uniform(2e-4, 2e-3)),
            alpha_n=float(rng.uniform(0.05, 0.3)),
            beta_n=float(rng.uniform(1e-4, 3e-3)),
            alpha_r=float(rng.uniform(0.01, 0.05)),
            beta_r=float(rng.uniform(1e-4, 1e-3)),
            gamma=float(rng.uniform(1.0, 3.0)),
        )
        grad = GradParams(sqr=float(rng.uniform(0.05, 1.0)), var=float(rng.uniform(0.5, 10.0)))
        cap = 64 if caps == "64" else int(rng.choice(CAPS))
        placement: list[int] = []
        if rng.random() < 0.5:
            want = int(rng.integers(1, max(cap // 2, 1) + 1))
            for node in rng.permutation(len(free)):
                take = min(free[int(node)], want - len(placement))
                free[int(node)] -= take
                placement.extend([int(node)] * take)
                if len(placement) == want:
                    break
        jobs.append(
            JobView(
                name=f"job{i}",
                application="synthetic",
                submit_time=float(rng.uniform(0, 3000)),
                attained_service=float(rng.uniform(0, 1e5)),
                num_restarts=int(rng.integers(0, 10)),
                placement=Placement.of(placement),
                min_replicas=0,
                max_replicas=cap,
                limits=LIMITS,
                perf_params=perf,
                grad_params=grad,
            )
        )
    jobs.sort(key=lambda j: (j.submit_time, j.name))
    return ClusterState.training_view(3600.0, cluster, tuple(jobs))


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def knapsack_only(state: ClusterState) -> tuple[float, float]:
    """Seconds of the DP alone on this state's values (values built outside the timer)."""
    values, lows = [], []
    for job in state.jobs:
        ks = np.arange(1, job.max_replicas + 1)
        ns = np.minimum((ks + 7) // 8, ks)
        values.append(np.asarray(adaptive_speedup(job)(ns, ks), dtype=np.float64))
        lows.append(1)
    return timed(lambda: group_knapsack(values, lows, state.total_capacity))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--size", action="append", metavar="GPUSxJOBS", help="only this size (repeatable)"
    )
    parser.add_argument(
        "--objective",
        choices=[o.value for o in Objective],
        default=Objective.SUM.value,
        help="ATS-T's objective: the paper's sum of speedups (default), or Pollux's "
        "power mean (deepboot:objective=power-mean)",
    )
    parser.add_argument(
        "--solver",
        choices=[o.value for o in Solver],
        default=Solver.DP.value,
        help="how ATS-T's knapsack is solved: the reference DP (default), or the exact "
        "core reduction (deepboot:solver=core)",
    )
    parser.add_argument(
        "--policy",
        choices=("deepboot", "pollux"),
        default="deepboot",
        help="whose decision to time: ATS-T (default), or Pollux's search (its reference "
        "settings; the knapsack column is ATS-T's DP alone either way)",
    )
    args = parser.parse_args()
    sizes = (
        [(64, 100), (512, 500)]
        if args.quick
        else [
            (64, 100),
            (512, 500),
            (1024, 1000),
            (4096, 500),
            (4096, 2000),
        ]
    )
    if args.size:
        sizes = [(int(g), int(j)) for g, j in (size.lower().split("x") for size in args.size)]
    policy: TrainingPolicy = (
        PolluxPolicy()
        if args.policy == "pollux"
        else DeepBootPolicy(
            DeepBootConfig(objective=Objective(args.objective), solver=Solver(args.solver))
        )
    )
    rng = np.random.default_rng(args.seed)
    what = (
        "Pollux's search"
        if args.policy == "pollux"
        else f"ATS-T, objective {args.objective}, solver {args.solver}"
    )
    table = Table(title=f"Decision time (seconds): {what}")
    cols = ("GPUs", "jobs", "K", "cold", "warm", "knapsack", "cold CPU", "warm CPU", "GPUs given")
    for col in cols:
        table.add_column(col, justify="right")
    for gpus, num_jobs in sizes:
        for caps in ("mixed", "64"):
            state = make_snapshot(gpus, num_jobs, caps, args.seed + gpus + num_jobs)
            cold, cold_cpu = timed(lambda s=state: policy.allocate(s, rng))
            warm, warm_cpu = timed(lambda s=state: policy.allocate(s, rng))
            dp, _ = knapsack_only(state)
            given = sum(p.num_replicas for p in policy.allocate(state, rng).values())
            row = (cold, warm, dp, cold_cpu, warm_cpu)
            table.add_row(str(gpus), str(num_jobs), caps, *(f"{x:.3f}" for x in row), str(given))
    Console(width=max(Console().width, 110)).print(table)


if __name__ == "__main__":
    main()
