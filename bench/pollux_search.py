"""Pollux search benchmark: our search against the reference's NSGA-II, side by side.

For each random but realistic cluster snapshot (8-16 nodes x 4 GPUs, 10-80 jobs with
fitted models drawn around the shipped catalog's, some holding placements), it runs

* ours: ``deepboot.policies.pollux.pollux_allocate`` (knapsack + packing + local
  search), and
* NSGA-II from pymoo, population 100, 100 generations, over the same integer
  jobs x nodes matrix, seeded with the current allocation, with crossover, mutation
  and a repair operator (node capacity, one distributed job per node, max replicas,
  at most 16 nodes per job, min replicas) in the spirit of the reference's
  ``simulator/pollux.py``, and the reference's second objective (cluster utility),

and scores both results with the same function, ``pollux_fitness``. It prints the
fitness of each, the ratio ours / NSGA-II (>= 1 means ours is at least as good), the
wall time of each, and the speed ratio. Ours runs first, so any speedup memo the perf
layer keeps across calls helps NSGA-II, not us.

    .venv/bin/python bench/pollux_search.py              # 6 states, about a minute
    .venv/bin/python bench/pollux_search.py --states 20  # more states
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np
from pymoo.algorithms.moo.nsga2 import NSGA2
from pymoo.core.crossover import Crossover
from pymoo.core.mutation import Mutation
from pymoo.core.problem import Problem
from pymoo.core.repair import Repair
from pymoo.optimize import minimize
from rich.console import Console
from rich.table import Table

from deepboot.core import (
    ClusterSpec,
    ClusterState,
    GradParams,
    JobView,
    Node,
    PerfParams,
    Placement,
)
from deepboot.perf.catalog import load_catalog
from deepboot.policies.pollux import pollux_allocate
from deepboot.policies.pollux_fitness import PolluxConfig, PolluxProblem, pollux_fitness

GPUS_PER_NODE = 4


# --------------------------------------------------------------------------- states


def _perturb(perf: PerfParams, rng: np.random.Generator) -> PerfParams:
    """Each parameter times a log-normal factor (sigma 0.25); gamma kept in [1, 10]."""

    def jitter(value: float) -> float:
        return value * float(rng.lognormal(0.0, 0.25))

    return PerfParams(
        alpha_c=jitter(perf.alpha_c),
        beta_c=jitter(perf.beta_c),
        alpha_n=jitter(perf.alpha_n),
        beta_n=jitter(perf.beta_n),
        alpha_r=jitter(perf.alpha_r),
        beta_r=jitter(perf.beta_r),
        gamma=min(max(perf.gamma * float(rng.lognormal(0.0, 0.1)), 1.0), 10.0),
    )


def _random_placements(
    jobs: list[JobView], capacity: list[int], rng: np.random.Generator
) -> dict[str, tuple[int, ...]]:
    """A feasible current allocation for about half of the fitted jobs."""
    free = list(capacity)
    owner = [-1] * len(capacity)
    out: dict[str, tuple[int, ...]] = {}
    for idx, job in enumerate(jobs):
        if job.perf_params is None or rng.random() < 0.5:
            continue
        want = int(rng.integers(1, job.max_replicas + 1))
        nodes: list[int] = []
        order = list(rng.permutation(len(capacity)))
        single = [v for v in order if free[v] >= want]
        if single:
            nodes = [single[0]] * want
        else:
            for v in order:
                if owner[v] >= 0 or free[v] == 0:
                    continue
                take = min(free[v], want - len(nodes))
                nodes.extend([v] * take)
                if len(nodes) == want:
                    break
            if len(nodes) < want:
                continue
        for v in nodes:
            free[v] -= 1
        if len(set(nodes)) > 1:
            for v in set(nodes):
                owner[v] = idx
        out[job.name] = tuple(sorted(nodes))
    return out


def make_random_state(rng: np.random.Generator) -> ClusterState:
    """A realistic snapshot: catalog models, perturbed fits, mixed ages and placements."""
    catalog = load_catalog()
    models = sorted(catalog)
    num_nodes = int(rng.integers(8, 17))
    num_jobs = int(rng.integers(10, 81))
    now = 8 * 3600.0
    jobs: list[JobView] = []
    for i in range(num_jobs):
        app = catalog[str(rng.choice(models))]
        lim = app.limits
        fitted = rng.random() < 0.8
        cap = min(64, lim.max_batch_size // lim.min_local_bsz)
        if app.name == "ncf":
            cap = 1
        perf: PerfParams | None = None
        grad: GradParams | None = None
        max_replicas = 1
        if fitted:
            perf = _perturb(app.perf, rng)
            epoch = int(rng.integers(0, app.max_epochs))
            batch = int(lim.init_batch_size * 2 ** int(rng.integers(0, 4)))
            batch = min(batch, lim.max_batch_size)
            sqr, var = app.grad_stats(batch, epoch)
            grad = GradParams(sqr, var)
            profiled = int(2 ** int(rng.integers(0, 5)))
            max_replicas = max(min(2 * profiled, cap), 1)
        submit = now - float(rng.uniform(10.0, 4 * 3600.0))
        jobs.append(
            JobView(
                name=f"job-{i:03d}",
                application=app.name,
                submit_time=submit,
                attained_service=float(rng.uniform(0.0, 20 * 3600.0)) if fitted else 0.0,
                num_restarts=int(rng.integers(0, 6)) if fitted else 0,
                placement=Placement(()),
                min_replicas=0,
                max_replicas=max_replicas,
                limits=lim,
                perf_params=perf,
                grad_params=grad,
            )
        )
    capacity = [GPUS_PER_NODE] * num_nodes
    current = _random_placements(jobs, capacity, rng)
    jobs = [dataclasses.replace(j, placement=Placement(current.get(j.name, ()))) for j in jobs]
    jobs.sort(key=lambda j: (j.submit_time, j.name))
    cluster = ClusterSpec(tuple(Node(v, GPUS_PER_NODE) for v in range(num_nodes)))
    return ClusterState.training_view(now, cluster, tuple(jobs))


# --------------------------------------------------------------------------- NSGA-II


class PolluxNsgaProblem(Problem):  # type: ignore[misc]
    """The Pollux objective for pymoo: minimize (-fitness, -cluster utility)."""

    def __init__(self, problem: PolluxProblem, rng: np.random.Generator) -> None:
        self.p = problem
        self.rng = rng  # the repair's node shuffles (pymoo passes no generator to repairs)
        shape = problem.base.shape
        self.shape = shape
        xu = np.broadcast_to(problem.capacity[None, :], shape).ravel()
        super().__init__(n_var=int(np.prod(shape)), n_obj=2, xl=0, xu=xu, vtype=int)

    def states(self, x: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.asarray(x, dtype=np.int64).reshape(x.shape[0], *self.shape)
        return out

    def fitness(self, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(P,) fitness and (P,) cluster utility of (P, J, V) states."""
        p = self.p
        pop, num_jobs = states.shape[0], states.shape[1]
        k = states.sum(axis=2)
        n = np.count_nonzero(states, axis=2)
        short = k < p.min_replicas[None, :]
        k = np.where(short, 0, k)
        n = np.where(short, 0, n)
        changed = np.any(states != p.base[None], axis=2) | p.base_outside[None, :]
        jobs = np.broadcast_to(np.arange(num_jobs)[None, :], (pop, num_jobs))
        total = p.costs(jobs, n, k, changed).sum(axis=1)
        fit = np.array([p.fitness_of_total(float(t)) for t in total])
        # Reference utility: speedup-weighted share of the active nodes' GPUs.
        speed = p.speedup(jobs, n, k)
        active = (states.sum(axis=1) > 0) * p.capacity[None, :]
        denom = np.maximum(active.sum(axis=1), 1)
        util = speed.sum(axis=1) / denom
        return fit, util

    def _evaluate(self, x: np.ndarray, out: dict[str, object], *args: object, **kw: object) -> None:
        fit, util = self.fitness(self.states(x))
        out["F"] = np.column_stack([-fit, -util])


class JobCrossover(Crossover):  # type: ignore[misc]
    """Single-point crossover over the job axis (the reference's)."""

    def __init__(self) -> None:
        super().__init__(n_parents=2, n_offsprings=2)

    def _do(
        self,
        problem: PolluxNsgaProblem,
        X: np.ndarray,
        *args: object,
        random_state: np.random.Generator,
        **kw: object,
    ) -> np.ndarray:  # noqa: E501
        _, matings, _ = X.shape
        num_jobs, num_nodes = problem.shape
        a = X[0].reshape(matings, num_jobs, num_nodes)
        b = X[1].reshape(matings, num_jobs, num_nodes)
        point = random_state.integers(0, num_jobs, size=(matings, 1, 1))
        first = np.arange(num_jobs)[None, :, None] < point
        c1 = np.where(first, a, b)
        c2 = np.where(first, b, a)
        return np.stack([c1.reshape(matings, -1), c2.reshape(matings, -1)])


class JobMutation(Mutation):  # type: ignore[misc]
    """Reset rows to the current allocation, zero cells, and grow cells into free room."""

    def _do(
        self,
        problem: PolluxNsgaProblem,
        X: np.ndarray,
        *args: object,
        random_state: np.random.Generator,
        **kw: object,
    ) -> np.ndarray:  # noqa: E501
        rng = random_state
        s = problem.states(X).copy()
        p = problem.p
        pop, num_jobs, num_nodes = s.shape
        reset = rng.random((pop, num_jobs)) < 0.1
        s = np.where(reset[:, :, None], p.base[None], s)
        zero_rows = rng.random((pop, num_jobs)) < 0.1
        s[(rng.random(s.shape) < 0.1) & zero_rows[:, :, None]] = 0
        free = p.capacity[None, :] - s.sum(axis=1)  # (P, V)
        room = np.broadcast_to((free > 0)[:, None, :], s.shape)
        prob1 = room / np.maximum(room.sum(axis=2, keepdims=True), 1)
        own = room & (s > 0)
        prob2 = own / np.maximum(own.sum(axis=2, keepdims=True), 1)
        grow = rng.random(s.shape) < prob1 + prob2 - prob1 * prob2
        upper = np.broadcast_to(p.capacity[None, None, :], s.shape)
        draw = rng.integers(s, upper + 1)
        s[grow] = draw[grow]
        return s.reshape(pop, -1)


class JobRepair(Repair):  # type: ignore[misc]
    """Enforce every constraint, dropping GPUs in job order where they conflict."""

    def _do(
        self, problem: PolluxNsgaProblem, X: np.ndarray, *args: object, **kw: object
    ) -> np.ndarray:  # noqa: E501
        p = problem.p
        cfg = p.config
        rng = problem.rng
        s = np.maximum(problem.states(X), 0)
        pop, num_jobs, num_nodes = s.shape
        # At most one distributed job per node: the first in job order keeps it.
        dist = (np.count_nonzero(s, axis=2) > 1)[:, :, None] & (s > 0)
        s[(np.cumsum(dist, axis=1) > 1) & dist] = 0
        # Max replicas and max nodes per job, cutting at random nodes.
        shuffle = np.argsort(rng.random(s.shape), axis=2)
        t = np.take_along_axis(s, shuffle, axis=2)
        t = np.diff(
            np.minimum(np.cumsum(t, axis=2), p.max_replicas[None, :, None]), axis=2, prepend=0
        )
        nodes_used = np.cumsum(t > 0, axis=2)
        t[nodes_used > cfg.max_nodes_per_job] = 0
        s = np.take_along_axis(t, np.argsort(shuffle, axis=2), axis=2)
        # Node capacity, earlier jobs first.
        s = np.diff(np.minimum(np.cumsum(s, axis=1), p.capacity[None, None, :]), axis=1, prepend=0)
        # Rows below min replicas hold nothing.
        s[s.sum(axis=2) < p.min_replicas[None, :]] = 0
        out: np.ndarray = s.reshape(pop, -1)
        return out


def run_nsga(
    state: ClusterState, config: PolluxConfig, pop_size: int, generations: int, seed: int
) -> dict[str, Placement]:
    problem = PolluxProblem(state, config)
    nsga_problem = PolluxNsgaProblem(problem, np.random.default_rng(seed))
    repair = JobRepair()
    start = np.repeat(problem.base.reshape(1, -1), pop_size, axis=0)
    start = repair._do(nsga_problem, start)
    algorithm = NSGA2(
        pop_size=pop_size,
        sampling=start,
        crossover=JobCrossover(),
        mutation=JobMutation(),
        repair=repair,
        eliminate_duplicates=True,
    )
    result = minimize(nsga_problem, algorithm, ("n_gen", generations), seed=seed, verbose=False)
    xs = result.pop.get("X")
    fit, _ = nsga_problem.fitness(nsga_problem.states(xs))
    best = nsga_problem.states(xs)[int(np.argmax(fit))]
    return {name: Placement(nodes) for name, nodes in problem.allocation_of(best).items()}


# --------------------------------------------------------------------------- main


@dataclass(frozen=True)
class Row:
    index: int
    nodes: int
    jobs: int
    ours: float
    nsga: float
    t_ours: float
    t_nsga: float


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--states", type=int, default=6, help="random snapshots to compare")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--population", type=int, default=100)
    ap.add_argument("--generations", type=int, default=100)
    args = ap.parse_args()

    # Wide enough for the table when the output is piped to a file.
    console = Console(width=None if sys.stdout.isatty() else 150)
    config = PolluxConfig()
    rng = np.random.default_rng(args.seed)
    rows: list[Row] = []
    for i in range(args.states):
        state = make_random_state(rng)
        t0 = time.perf_counter()
        ours = pollux_allocate(state, config)
        t_ours = time.perf_counter() - t0
        t0 = time.perf_counter()
        nsga = run_nsga(state, config, args.population, args.generations, args.seed + i)
        t_nsga = time.perf_counter() - t0
        row = Row(
            i,
            state.cluster.num_nodes,
            len(state.jobs),
            pollux_fitness(state, ours, config),
            pollux_fitness(state, nsga, config),
            t_ours,
            t_nsga,
        )
        rows.append(row)
        console.log(f"state {i}: {row.nodes}x{GPUS_PER_NODE} GPUs, {row.jobs} jobs done")

    table = Table(title="Pollux search: ours vs NSGA-II (same states, same fitness)")
    for col in ("state", "cluster", "jobs", "fitness ours", "fitness NSGA-II", "ours/NSGA"):
        table.add_column(col, justify="right")
    for col in ("time ours (ms)", "time NSGA-II (s)", "speed ratio"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r.index),
            f"{r.nodes}x{GPUS_PER_NODE}",
            str(r.jobs),
            f"{r.ours:.6f}",
            f"{r.nsga:.6f}",
            f"{r.ours / r.nsga:.4f}" if r.nsga > 0 else "inf",
            f"{r.t_ours * 1e3:.1f}",
            f"{r.t_nsga:.2f}",
            f"{r.t_nsga / r.t_ours:.0f}x",
        )
    console.print(table)
    ratios = [r.ours / r.nsga for r in rows if r.nsga > 0]
    speed = [r.t_nsga / r.t_ours for r in rows]
    if ratios:
        console.print(
            f"fitness ratio ours/NSGA-II: min {min(ratios):.4f}, "
            f"median {statistics.median(ratios):.4f}, max {max(ratios):.4f}; "
            f"ours >= NSGA-II on {sum(x >= 1 - 1e-9 for x in ratios)}/{len(ratios)} states"
        )
    if speed:
        geo = math.exp(statistics.fmean(math.log(x) for x in speed))
        console.print(f"speed ratio NSGA-II/ours: geometric mean {geo:.0f}x")


if __name__ == "__main__":
    main()
