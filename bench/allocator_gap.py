"""Why DeepBoot's training allocator (ATS-T) trails Pollux's with no inference (issue 49).

``bench/frontier.py --host-cache`` measures ``limit-deepboot`` (``deepboot:no-inference``)
at 1.097x the average JCT of ``limit`` (``pollux:no-inference``) on ``middle.csv``'s
160 training jobs, 16x4 GPUs, all of them training. This bench runs the same setting
(60 s rounds, flat 30 s restarts, replication i: policy seed i and submissions
jittered by +-30 s with ``default_rng(i)``, as ``bench/frontier.py``) for a set of
allocator variants, and prints, per variant, the average JCT with its 95% interval,
the paired ratio against Pollux, and what the allocator did: restarts, GPU-hours
held, queueing delay, jobs left with no GPU per round, jobs spanning nodes, and
the sum and harmonic mean of the speedups it chose (each job's own fitted model,
over its goodput at the fair share, as both policies score it).

Variants (``--variants``, comma-separated; default: all):

* ``pollux``: ``pollux`` (p = -1, delta 30 s): the reference.
* ``deepboot``: ``deepboot`` (sum of speedups, delta 10 s, best fit).
* ``pollux-p1``: Pollux's search with p = 1: the arithmetic mean, i.e. DeepBoot's
  sum-of-speedups objective, with Pollux's placement and delta.
* ``pollux-p1-d10``: and DeepBoot's delta (10 s).
* ``pollux-d10``: Pollux with delta 10 s.
* ``pollux-noia``: Pollux without interference avoidance.
* ``deepboot-d30``: DeepBoot with delta 30 s.
* ``deepboot-hm``: DeepBoot's knapsack and best-fit placement with Pollux's
  objective, ``deepboot:objective=power-mean`` (item value ``floor^p - (s * scale *
  penalty + floor)^p``, p = -1, floor 1e-3, scale = nodes / GPUs: the power mean is
  separable over jobs, so the same group knapsack maximizes it exactly;
  ``deepboot.policies.deepboot.power_mean_values``). ``deepboot-gm``,
  ``deepboot-hm-p0.5``, ``deepboot-hm-p2``: p = 0, -0.5, -2.
* ``deepboot-admit``: DeepBoot's sum plus a large bonus for holding >= 1 GPU.
* ``deepboot-hm-d30``: and Pollux's delta (30 s).
* ``deepboot-hm-d30-core``: and the knapsack solved by the exact core reduction
  (``deepboot:solver=core``: the same optimal value, ties may go otherwise).
* ``deepboot-hm-d30-h05-core``: and ``hysteresis=0.05`` (a changed count must be
  worth 5% more than the penalty alone says: fewer restarts).
* ``deepboot-mostfree``: DeepBoot with most-free packing.

Usage::

    .venv/bin/python bench/allocator_gap.py --procs 2                     # 5 reps, all
    .venv/bin/python bench/allocator_gap.py --variants pollux,deepboot --reps 1
    .venv/bin/python bench/allocator_gap.py --load out.json              # re-print

``--json`` saves every run's per-job records and per-round statistics; ``--load``
prints the tables from such a file (and ``--jobs`` the per-job breakdown).
"""

# ruff: noqa: E402  (BLAS threads must be limited before numpy is imported)
from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from deepboot.core.cluster import ClusterSpec
from deepboot.core.modes import JobMode
from deepboot.core.placement import Allocation
from deepboot.core.state import ClusterState
from deepboot.matrix import parse_run, sim_config
from deepboot.perf.apps import load_apps
from deepboot.perf.speedup import adaptive_speedup
from deepboot.policies.allocation import (
    fair_replicas,
    fair_share_base,
    group_knapsack,
)
from deepboot.policies.base import TrainingPolicy
from deepboot.policies.deepboot import (
    DeepBootConfig,
    DeepBootPolicy,
    Objective,
    Solver,
    ats_t_items,
)
from deepboot.policies.packing import Packing
from deepboot.policies.pollux import PolluxConfig, PolluxPolicy
from deepboot.report.stats import mean_interval
from deepboot.sim.run import simulate
from deepboot.sim.workload import jitter_submissions, load_workload

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"
FLOOR = 1e-3


POWER_MEAN = DeepBootConfig(objective=Objective.POWER_MEAN)
"""ATS-T with Pollux's objective (``deepboot:objective=power-mean``, p = -1)."""


@dataclass(frozen=True, slots=True)
class AdmitDeepBoot(DeepBootPolicy):
    """DeepBoot's sum of speedups with ``admit`` added to every item (k >= 1): the
    knapsack first maximizes the number of jobs holding a GPU, then the sum of
    speedups (isolates admission from the split among running jobs)."""

    admit: float = 100.0
    name: ClassVar[str] = "deepboot-admit"

    def gpu_counts(self, state: ClusterState) -> dict[str, int]:
        jobs, lows, values, total = ats_t_items(state, self.config)
        if not values:
            return {j.name: 0 for j in jobs}
        counts = group_knapsack([v + self.admit for v in values], lows, total)
        return {job.name: k for job, k in zip(jobs, counts, strict=True)}


class _Wrapping:
    """A policy that wraps ``inner``: its name and job mode are ``inner``'s."""

    inner: TrainingPolicy

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def job_mode(self) -> JobMode:
        return self.inner.job_mode


@dataclass
class Recorder(_Wrapping):
    """Wraps a policy; records per-round statistics of the allocations it returns."""

    inner: TrainingPolicy
    rounds: list[dict[str, float]] = field(default_factory=list)
    per_job: dict[str, dict[str, int]] = field(default_factory=dict)

    def allocate(self, state: ClusterState, rng: np.random.Generator) -> Allocation:
        alloc = self.inner.allocate(state, rng)
        total = sum(state.capacity.values())
        jobs = state.jobs
        fair = fair_replicas(total, len(jobs))
        sums, inv, used, multi, queued, changed, preempted = 0.0, 0.0, 0, 0, 0, 0, 0
        grown, shrunk, frag = 0, 0, 0
        for job in jobs:
            pl = alloc.get(job.name)
            k = pl.num_replicas if pl else 0
            n = pl.num_nodes if pl else 0
            rec = self.per_job.setdefault(
                job.name, {"rounds": 0, "zero": 0, "multi": 0, "gpus": 0, "changed": 0}
            )
            rec["rounds"] += 1
            rec["gpus"] += k
            cur = job.placement.num_replicas
            if (pl or None) != (job.placement or None) and not (k == 0 and cur == 0):
                changed += 1
                rec["changed"] += 1
                if k > cur:
                    grown += 1
                elif k < cur:
                    shrunk += 1
            if k == 0:
                queued += 1
                rec["zero"] += 1
                if cur > 0:
                    preempted += 1
                x = 0.0
            else:
                fn = adaptive_speedup(job)
                base = fair_share_base(fn, fair)
                x = float(fn(np.array([n]), np.array([k]))[0]) / base
                used += k
                if n > 1:
                    multi += 1
                    rec["multi"] += 1
                if n > -(-k // 4):
                    frag += 1
            sums += x
            inv += 1.0 / (x * 16 / total + FLOOR)
        self.rounds.append(
            {
                "t": state.now,
                "jobs": len(jobs),
                "used": used,
                "queued": queued,
                "multi": multi,
                "frag": frag,
                "changed": changed,
                "grown": grown,
                "shrunk": shrunk,
                "preempted": preempted,
                "sum_speedup": sums,
                "hmean": len(jobs) / inv if jobs else 0.0,
            }
        )
        return alloc


@dataclass
class SameState(_Wrapping):
    """Runs ``inner`` and, on every round's very state, also asks each of ``others``
    for its GPU counts (``gpu_counts``): GPUs per application and jobs left at 0 under
    each, on identical inputs (a counterfactual that the run does not follow)."""

    inner: DeepBootPolicy
    others: dict[str, DeepBootPolicy]
    gpus: dict[str, dict[str, float]] = field(default_factory=dict)
    zero: dict[str, float] = field(default_factory=dict)
    rounds: int = 0

    def allocate(self, state: ClusterState, rng: np.random.Generator) -> Allocation:
        if state.jobs:
            self.rounds += 1
            for label, pol in {"run": self.inner, **self.others}.items():
                counts = pol.gpu_counts(state)
                per = self.gpus.setdefault(label, {})
                for job in state.jobs:
                    per[job.application] = per.get(job.application, 0) + counts[job.name]
                self.zero[label] = self.zero.get(label, 0) + sum(
                    1 for c in counts.values() if c == 0
                )
        return self.inner.allocate(state, rng)


def same_state(csv: str, profiles: str, rep: int) -> None:
    """``--same-state``: DeepBoot's run, each round also solved with Pollux's objective."""
    apps = load_apps(profiles)
    workload = load_workload(csv, apps.keys(), {n: a.limits for n, a in apps.items()})
    workload = dataclasses.replace(workload, inference=())
    workload = jitter_submissions(workload, np.random.default_rng(rep), 30.0)
    config = sim_config(parse_run("x=pollux:no-inference"), 60.0, rep, 8)
    rec = SameState(
        DeepBootPolicy(DeepBootConfig()),
        {
            "p=-1 (hm)": DeepBootPolicy(POWER_MEAN),
            "p=-1, delta 30": DeepBootPolicy(replace(POWER_MEAN, restart_delay=30.0)),
        },
    )
    simulate(workload, ClusterSpec.parse("16x4", 0), rec, apps, config)
    names = sorted(rec.gpus["run"])
    print(f"DeepBoot's run, replication {rep}: {rec.rounds} rounds; GPUs per round by")
    print("application, and jobs at 0 GPUs per round, on the same states:")
    print("| objective | " + " | ".join(names) + " | jobs at 0 |")
    print("|" + "---|" * (len(names) + 2))
    for label, per in rec.gpus.items():
        cells = [f"{per.get(a, 0) / rec.rounds:.2f}" for a in names]
        zero = rec.zero[label] / rec.rounds
        print(f"| {'sum (DeepBoot)' if label == 'run' else label} | " + " | ".join(cells)
              + f" | {zero:.2f} |")  # fmt: skip


VARIANTS: dict[str, Callable[[], TrainingPolicy]] = {
    "pollux": lambda: PolluxPolicy(PolluxConfig()),
    "deepboot": lambda: DeepBootPolicy(DeepBootConfig()),
    "pollux-p1": lambda: PolluxPolicy(PolluxConfig(p=1.0)),
    "pollux-p1-d10": lambda: PolluxPolicy(PolluxConfig(p=1.0, restart_delay=10.0)),
    "pollux-d10": lambda: PolluxPolicy(PolluxConfig(restart_delay=10.0)),
    "pollux-noia": lambda: PolluxPolicy(PolluxConfig(interference_avoidance=False)),
    "deepboot-d30": lambda: DeepBootPolicy(DeepBootConfig(restart_delay=30.0)),
    "deepboot-hm": lambda: DeepBootPolicy(POWER_MEAN),
    "deepboot-hm-d30": lambda: DeepBootPolicy(replace(POWER_MEAN, restart_delay=30.0)),
    "deepboot-hm-d30-core": lambda: DeepBootPolicy(
        replace(POWER_MEAN, restart_delay=30.0, solver=Solver.CORE)
    ),
    "deepboot-hm-d30-h05-core": lambda: DeepBootPolicy(
        replace(POWER_MEAN, restart_delay=30.0, hysteresis=0.05, solver=Solver.CORE)
    ),
    "deepboot-mostfree": lambda: DeepBootPolicy(DeepBootConfig(packing=Packing.MOST_FREE)),
    "deepboot-admit": lambda: AdmitDeepBoot(DeepBootConfig()),
    "deepboot-gm": lambda: DeepBootPolicy(replace(POWER_MEAN, p=0.0)),
    "deepboot-hm-p0.5": lambda: DeepBootPolicy(replace(POWER_MEAN, p=-0.5)),
    "deepboot-hm-p2": lambda: DeepBootPolicy(replace(POWER_MEAN, p=-2.0)),
}


def run_one(args: tuple[str, int, str, str, str, float]) -> dict[str, Any]:
    """One simulation: (variant, replication, workload CSV, profiles, lending flags,
    round interval) -> its records. Without flags: no inference (frontier.py's
    ``limit`` settings); with flags (a ``--run`` text's flags, e.g.
    ``slo,slo-target=0.99``): the workload's inference on 8 inference nodes, in
    frontier.py's ``1s`` setting."""
    variant, rep, csv, profiles, flags, interval = args
    started = time.perf_counter()
    apps = load_apps(profiles)
    limits = {n: a.limits for n, a in apps.items()}
    if flags:
        import tempfile

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from frontier import Workload, _deepboot_services, services_file

        from deepboot.sim.services import read_services_file

        w = Workload(Path(csv).stem, Path(csv), _deepboot_services(Path(csv)))
        with tempfile.TemporaryDirectory() as tmp:
            services = read_services_file(str(services_file(Path(tmp), w, "1s")))
        workload = load_workload(csv, apps.keys(), limits, services)
        config = sim_config(parse_run(f"x=deepboot:{flags}"), interval, rep, 8)
        cluster = ClusterSpec.parse("16x4", 8)
    else:
        workload = load_workload(csv, apps.keys(), limits)
        workload = dataclasses.replace(workload, inference=())
        # The exact settings of frontier.py's limit runs (no inference: flat 30 s restarts).
        config = sim_config(parse_run("x=pollux:no-inference"), interval, rep, 8)
        cluster = ClusterSpec.parse("16x4", 0)
    workload = jitter_submissions(workload, np.random.default_rng(rep), 30.0)
    rec = Recorder(VARIANTS[variant]())
    result = simulate(workload, cluster, rec, apps, config)
    jobs = [
        {
            "name": j.name,
            "app": j.application,
            "submit": j.submit,
            "jct": j.jct,
            "queue": j.queue_delay,
            "restarts": j.restarts,
            "restart_s": j.restart_s,
            "gpu_s": j.gpu_seconds,
            **{f"r_{k}": v for k, v in rec.per_job.get(j.name, {}).items()},
        }
        for j in result.jobs
    ]
    return {
        "variant": variant,
        "rep": rep,
        "jobs": jobs,
        "rounds": rec.rounds,
        "makespan": result.end_time,
        "attainment": (
            float(result.summary(variant, "w")["inference"]["slo_attainment"])
            if result.inference
            else None
        ),
        "wall_s": time.perf_counter() - started,
    }


def _iv(xs: Sequence[float], fmt: str = ",.0f") -> str:
    iv = mean_interval(list(xs))
    return f"{iv.mean:{fmt}}" if iv.n < 2 else f"{iv.mean:{fmt}} ± {iv.half:{fmt}}"


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def per_run(r: dict[str, Any]) -> dict[str, float]:
    jobs = r["jobs"]
    done = [j for j in jobs if j["jct"] is not None]
    rounds = [x for x in r["rounds"] if x["jobs"] > 0]
    return {
        "jct": _mean([j["jct"] for j in done]),
        "unfinished": len(jobs) - len(done),
        "queue": _mean([j["queue"] for j in done]),
        "restarts": _mean([j["restarts"] for j in jobs]),
        "restart_s": _mean([j["restart_s"] for j in done]),
        "run": _mean([j["jct"] - j["queue"] - j["restart_s"] for j in done]),
        "gpu_h": sum(j["gpu_s"] for j in jobs) / 3600.0,
        "used": _mean([x["used"] for x in rounds]),
        "queued": _mean([x["queued"] for x in rounds]),
        "multi": _mean([x["multi"] for x in rounds]),
        "frag": _mean([x["frag"] for x in rounds]),
        "changed": _mean([x["changed"] for x in rounds]),
        "preempted": sum(x["preempted"] for x in rounds),
        "sum_speedup": _mean([x["sum_speedup"] for x in rounds]),
        "hmean": _mean([x["hmean"] for x in rounds]),
        "makespan": r["makespan"],
        "attainment": 100 * r["attainment"] if r.get("attainment") is not None else math.nan,
    }


def tables(runs: list[dict[str, Any]], jobs_table: bool) -> None:
    by: dict[str, dict[int, dict[str, Any]]] = {}
    for r in runs:
        by.setdefault(r["variant"], {})[r["rep"]] = r
    ref = by.get("pollux", {})
    cols = ("variant", "avg JCT (s)", "vs pollux (paired)", "queue (s)", "restart s/job",
            "run s/job", "restarts/job", "GPU-h held", "GPUs used/round", "jobs at 0/round",
            "multi-node/round", "over-spread/round", "changes/round", "preemptions",
            "sum speedup", "hmean speedup", "makespan (h)", "attainment (%)")  # fmt: skip
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for v, reps in by.items():
        stats = {i: per_run(r) for i, r in sorted(reps.items())}

        def col(
            key: str, fmt: str = ",.0f", scale: float = 1.0, stats: dict[int, Any] = stats
        ) -> str:
            return _iv([s[key] * scale for s in stats.values()], fmt)

        common = [i for i in stats if i in ref]
        ratio = "-"
        if common and v != "pollux":
            rs = [stats[i]["jct"] / per_run(ref[i])["jct"] for i in common]
            ratio = _iv(rs, ".3f") + "x"
        print("| " + " | ".join([
            v, col("jct"), ratio, col("queue"), col("restart_s"), col("run"),
            col("restarts", ".2f"), col("gpu_h", ",.0f"),
            col("used", ".1f"), col("queued", ".2f"), col("multi", ".2f"), col("frag", ".2f"),
            col("changed", ".2f"), col("preempted", ",.0f"), col("sum_speedup", ".1f"),
            col("hmean", ".3f"), col("makespan", ".2f", 1 / 3600),
            col("attainment", ".2f") if all(
                not math.isnan(x["attainment"]) for x in stats.values()) else "-",
        ]) + " |")  # fmt: skip
    if jobs_table and "pollux" in by:
        job_breakdown(by)


def job_breakdown(by: dict[str, dict[int, dict[str, Any]]]) -> None:
    """Per job class: mean JCT per variant (classes by app and by Pollux's JCT)."""
    ref = by["pollux"]
    # Job classes from Pollux's JCT of the same job (same replication).
    classes: dict[tuple[int, str], str] = {}
    for i, r in ref.items():
        jcts = sorted(j["jct"] for j in r["jobs"] if j["jct"] is not None)
        q = [jcts[len(jcts) * k // 4] for k in (1, 2, 3)]
        for j in r["jobs"]:
            x = j["jct"]
            tag = "Q1" if x < q[0] else "Q2" if x < q[1] else "Q3" if x < q[2] else "Q4"
            classes[(i, j["name"])] = tag
    keys = ["all", "Q1", "Q2", "Q3", "Q4"] + sorted({j["app"] for j in ref[0]["jobs"]})
    print()
    print("Per-job class: sum of JCT over the class (thousand s), mean over replications;")
    print("Q1..Q4: quartiles of the job's JCT under pollux (same replication).")
    print("| variant | " + " | ".join(keys) + " |")
    print("|" + "---|" * (len(keys) + 1))
    for v, reps in by.items():
        cells = []
        for key in keys:
            sums = []
            for i, r in reps.items():
                s = 0.0
                for j in r["jobs"]:
                    if j["jct"] is None:
                        continue
                    if key == "all" or key == j["app"] or key == classes.get((i, j["name"])):
                        s += j["jct"]
                sums.append(s / 1000)
            cells.append(_iv(sums, ",.0f"))
        print(f"| {v} | " + " | ".join(cells) + " |")
    # Per class: restarts, GPU-h, queue delay and rounds at 0 GPUs, per job.
    print()
    print("Per job class, mean per job over replications: restarts / GPU-h / queue (s) / "
          "rounds at 0 GPUs (queue included) / multi-node rounds / "
          "avg GPUs after start")  # fmt: skip
    print("| variant | " + " | ".join(keys) + " |")
    print("|" + "---|" * (len(keys) + 1))
    for v, reps in by.items():
        cells = []
        for key in keys:
            pick = [
                j for i, r in reps.items() for j in r["jobs"]
                if key == "all" or key == j["app"] or key == classes.get((i, j["name"]))
            ]  # fmt: skip
            if not pick:
                cells.append("-")
                continue
            cells.append(
                f"{_mean([j['restarts'] for j in pick]):.1f} / "
                f"{_mean([j['gpu_s'] for j in pick]) / 3600:.2f} / "
                f"{_mean([j['queue'] or 0 for j in pick]):.0f} / "
                f"{_mean([j.get('r_zero', 0) for j in pick]):.1f} / "
                f"{_mean([j.get('r_multi', 0) for j in pick]):.1f} / "
                f"{_mean([j['gpu_s'] / max(j['jct'] - j['queue'], 1) for j in pick if j['jct']]):.2f}"  # noqa: E501
            )
        print(f"| {v} | " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--first-rep", type=int, default=0)
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--workload", default=str(TRACES / "workloads" / "middle.csv"))
    ap.add_argument("--profiles", default=str(TRACES / "profiles"))
    ap.add_argument("--json", help="save every run's records here")
    ap.add_argument(
        "--lending",
        default="",
        help="keep the inference: these run flags (e.g. 'slo,slo-target=0.99,"
        "host-cache-gb=1,host-cache-preload'), frontier.py's 1s setting",
    )
    ap.add_argument(
        "--interval", type=float, default=60.0, help="seconds between rounds (default 60)"
    )
    ap.add_argument("--load", nargs="*", help="print from saved --json files instead")
    ap.add_argument("--jobs", action="store_true", help="also the per-job-class tables")
    ap.add_argument(
        "--same-state",
        action="store_true",
        help="instead: DeepBoot's run (replication --first-rep), each round's state also "
        "solved with Pollux's objective: GPUs per application under each",
    )
    args = ap.parse_args(argv)
    if args.same_state:
        same_state(args.workload, args.profiles, args.first_rep)
        return 0
    if args.load:
        tables([r for path in args.load for r in json.loads(Path(path).read_text())], args.jobs)
        return 0
    names = [v for v in args.variants.split(",") if v]
    for v in names:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r}; known: {', '.join(VARIANTS)}")
    tasks = [
        (v, rep, args.workload, args.profiles, args.lending, args.interval)
        for rep in range(args.first_rep, args.first_rep + args.reps)
        for v in names
    ]
    started = time.perf_counter()
    runs: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=args.procs) as pool:
        for r in pool.map(run_one, tasks):
            runs.append(r)
            print(f"  {r['variant']} #{r['rep']}: {per_run(r)['jct']:.0f} s "
                  f"({r['wall_s']:.0f} s wall)", file=sys.stderr, flush=True)  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(runs), encoding="utf-8")
    tables(runs, args.jobs)
    print(f"{len(runs)} runs in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
