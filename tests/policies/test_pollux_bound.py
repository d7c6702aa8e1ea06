"""The Pollux search's node-slot bound and two-level speedup rows (issue 10's speed
work): the bound never exceeds the brute-force optimum, stopping at it never changes
the search's result, and the rows hold the speedup functions' own values."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from deepboot.core import JobView, PerfParams
from deepboot.perf.goodput import GoodputModel
from deepboot.perf.speedup import SpeedupModel, adaptive_speedup, linear_speedup
from deepboot.policies import PolluxConfig
from deepboot.policies import pollux_search as search
from deepboot.policies._slotkernel import slot_knapsack
from deepboot.policies.pollux_fitness import PolluxProblem, two_level_rows
from deepboot.policies.pollux_search import dp_counts, slot_bound, solve

from .builders import GRAD, LIMITS, PERF, POOR_PERF, make_job, make_state
from .test_pollux import _all_matrices, table_speedup

# Inter-node sync cheaper than intra-node: such a job runs faster split over two nodes
# (fitted models do this; the bound must stay below the optimum anyway).
SPLIT_FAST = PerfParams(
    alpha_c=0.0175, beta_c=0.0007, alpha_n=0.01, beta_n=0.0002, alpha_r=0.2, beta_r=0.01, gamma=1.0
)


def _brute_knapsack(
    groups: list[list[tuple[int, int, float]]], total_gpus: int, total_slots: int
) -> float:
    best = math.inf
    for choice in itertools.product(*groups):
        if sum(o[0] for o in choice) <= total_gpus and sum(o[1] for o in choice) <= total_slots:
            cost = sum(o[2] for o in choice)
            if cost < best:
                best = cost
    return best


@pytest.mark.parametrize("seed", range(40))
def test_slot_knapsack_is_the_brute_force_optimum(seed: int) -> None:
    rng = np.random.default_rng(seed)
    groups = []
    for _ in range(int(rng.integers(1, 5))):
        options = []
        for _ in range(int(rng.integers(1, 5))):
            cost = float(rng.choice([rng.random() * 10, math.inf, math.nan, 1.0]))
            options.append((int(rng.integers(0, 5)), int(rng.integers(0, 3)), cost))
        groups.append(options)
    total_gpus, total_slots = int(rng.integers(0, 9)), int(rng.integers(0, 4))
    flat = [o for g in groups for o in g]
    starts = np.cumsum([0, *(len(g) for g in groups)]).astype(np.int64)
    got = slot_knapsack(
        np.array([o[0] for o in flat], dtype=np.int64),
        np.array([o[1] for o in flat], dtype=np.int64),
        np.array([o[2] for o in flat], dtype=np.float64),
        starts,
        total_gpus,
        total_slots,
    )
    want = _brute_knapsack(groups, total_gpus, total_slots)
    assert got == pytest.approx(want, rel=1e-12) or (math.isinf(got) and math.isinf(want))


def _fitted_jobs(
    rng: np.random.Generator,
    gpus: list[int],
    num_jobs: int,
    held: int,
    most_replicas: int,
    most_min: int = 0,
) -> list[JobView]:
    """Fitted jobs (some faster split over nodes), each placed on up to ``held`` GPUs,
    with min_replicas up to ``most_min``."""
    used = [0] * len(gpus)
    jobs = []
    for i in range(num_jobs):
        placement = []
        for node in rng.integers(0, len(gpus), size=int(rng.integers(0, held + 1))):
            if used[node] < gpus[node]:
                used[node] += 1
                placement.append(int(node))
        most = int(rng.integers(1, most_replicas + 1))
        least = min(int(rng.integers(0, most_min + 1)), most) if most_min else 0
        jobs.append(
            make_job(
                f"j{i}",
                submit_time=float(rng.choice([0.0, 1200.0, 3000.0])),
                placement=placement,
                min_replicas=least,
                max_replicas=most,
                num_restarts=int(rng.integers(0, 3)),
                perf=[PERF, POOR_PERF, SPLIT_FAST][int(rng.integers(0, 3))],
                grad=GRAD,
            )
        )
    return jobs


def _random_problem(rng: np.random.Generator) -> PolluxProblem:
    """2-3 nodes of 1-3 GPUs, 2-3 fitted jobs: small enough for the brute force. Some
    nodes offer fewer GPUs than they have (current rows may then not fit)."""
    gpus = [int(g) for g in rng.integers(1, 4, size=int(rng.integers(2, 4)))]
    jobs = _fitted_jobs(rng, gpus, int(rng.integers(2, 4)), 3, 6, most_min=2)
    capacity = {
        v: int(rng.integers(0, g + 1)) if rng.random() < 0.3 else g for v, g in enumerate(gpus)
    }
    config = PolluxConfig(
        p=float(rng.choice([-1.0, 0.0, -2.0, 0.5])),
        max_nodes_per_job=int(rng.choice([2, 3, 16])),
    )
    state = make_state(jobs, nodes=len(gpus), gpus=gpus, capacity=capacity)
    return PolluxProblem(state, config)


@pytest.mark.parametrize("seed", range(100))
def test_slot_bound_never_exceeds_the_optimum(seed: int) -> None:
    problem = _random_problem(np.random.default_rng(seed))
    bound = slot_bound(problem)
    assert problem.two_level
    if problem.total_gpus == 0:
        return
    assert math.isfinite(bound)
    best = min(float(problem.matrix_cost(m).sum()) for m in _all_matrices(problem))
    assert bound <= best + 1e-9 * (1.0 + abs(best))


def test_slot_bound_counts_nodes_the_gpu_bound_does_not() -> None:
    # Three distributed jobs of 3 GPUs on three 2-GPU nodes: the GPUs would hold two
    # of them on their fewest (two) nodes, the nodes hold only one distributed job.
    jobs = [make_job(f"j{i}", min_replicas=3, max_replicas=3, perf=PERF) for i in range(3)]
    problem = PolluxProblem(make_state(jobs, nodes=3, gpus=2), PolluxConfig())
    _, _, gpu_bound = dp_counts(problem)
    bound = slot_bound(problem)
    best = min(float(problem.matrix_cost(m).sum()) for m in _all_matrices(problem))
    assert gpu_bound < bound <= best + 1e-12
    assert bound == pytest.approx(best, rel=1e-12)


def test_slot_bound_applies_only_where_it_holds() -> None:
    jobs = [make_job("a", max_replicas=4, perf=PERF), make_job("b", max_replicas=4)]
    state = make_state(jobs, nodes=2, gpus=2)
    assert math.isfinite(slot_bound(PolluxProblem(state, PolluxConfig())))
    no_rule = PolluxConfig(interference_avoidance=False)
    assert slot_bound(PolluxProblem(state, no_rule)) == -math.inf
    unknown = table_speedup({"a": lambda n, k: float(k), "b": lambda n, k: float(k)})
    problem = PolluxProblem(state, PolluxConfig(), unknown)
    assert not problem.two_level
    assert slot_bound(problem) == -math.inf


def _larger_problem(seed: int) -> PolluxProblem:
    """3-6 nodes of 2 or 4 GPUs, 3-6 fitted jobs with placements (no brute force)."""
    rng = np.random.default_rng(seed)
    gpus = [int(rng.choice([2, 4]))] * int(rng.integers(3, 7))
    jobs = _fitted_jobs(rng, gpus, int(rng.integers(3, 7)), 8, 16)
    config = PolluxConfig(p=float(rng.choice([-1.0, 0.0, 0.5])))
    return PolluxProblem(make_state(jobs, nodes=len(gpus), gpus=gpus), config)


LARGER = range(60)


@pytest.mark.parametrize("seed", LARGER)
def test_the_slot_bound_never_changes_the_result(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopping at the bound gives the matrix the whole search gives."""
    with_bound = solve(_larger_problem(seed))
    monkeypatch.setattr(search, "slot_bound", lambda problem: -math.inf)
    without = solve(_larger_problem(seed))
    np.testing.assert_array_equal(with_bound, without)


def test_the_slot_bound_ends_some_of_those_searches() -> None:
    """The comparison above exercises the early stop: on some instances the search
    ends at the slot bound, where the GPU bound alone would have searched on."""
    ended = 0
    for seed in LARGER:
        problem = _larger_problem(seed)
        _, _, gpu_bound = dp_counts(problem)
        bound = slot_bound(problem)
        cost = float(problem.matrix_cost(solve(problem)).sum())
        tol = 1e-10 * (1.0 + abs(bound))
        ended += gpu_bound + tol < cost <= bound + tol
    assert ended >= 5


@pytest.mark.parametrize("perf", [PERF, POOR_PERF, SPLIT_FAST])
def test_two_level_rows_are_the_functions_values(perf: PerfParams) -> None:
    fn = adaptive_speedup(make_job("a", perf=perf, grad=GRAD))
    assert isinstance(fn, SpeedupModel)
    size = 12
    one, many = two_level_rows(fn, size)
    for k in range(1, size + 1):
        # A fresh function per value: nothing memoized from the rows' batch.
        fresh = SpeedupModel(GoodputModel(perf, GRAD, LIMITS))
        ns = np.arange(1, k + 1, dtype=np.int64)
        values = fresh(ns, np.full(k, k, dtype=np.int64))
        assert values[0].hex() == one[k].hex()
        assert all(v.hex() == many[k].hex() for v in values[1:])
    assert one[0] == many[0] == 0.0
    bigger = two_level_rows(fn, 2 * size)[0]
    assert len(bigger) > 2 * size and bigger[: len(one)] == one
    assert two_level_rows(linear_speedup, 4)[1][3] == 3.0


def test_two_level_queries_are_checked_as_the_functions_check_them() -> None:
    problem = PolluxProblem(make_state([make_job("a", perf=PERF)], nodes=2, gpus=2), PolluxConfig())
    assert problem.two_level
    one = np.array([0], dtype=np.int64)
    assert problem.speedup(one, np.array([2]), np.array([2]))[0] > 0.0
    for nodes, reps in ((2, 1), (0, 1), (1, 0)):
        with pytest.raises(ValueError, match="num_nodes <= num_replicas"):
            problem.speedup(one, np.array([nodes]), np.array([reps]))
