"""The incremental Pollux search state: the reference's best move, bit for bit."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest

from deepboot.core import JobView
from deepboot.perf.speedup import SpeedupFn, adaptive_speedup
from deepboot.policies import PolluxConfig
from deepboot.policies.pollux_fitness import PolluxProblem
from deepboot.policies.pollux_moves import Move, best_move_reference
from deepboot.policies.pollux_search import (
    _tolerance,
    dp_counts,
    local_search,
    repair_base,
    solve,
    tabu_search,
)
from deepboot.policies.pollux_state import SearchState

from .builders import PERF, POOR_PERF, make_job, make_state

IntArray = npt.NDArray[np.int64]

# Speedups with integer or repeated values, so that many moves tie exactly.
SHAPES: list[Callable[[int, int], float]] = [
    lambda n, k: float(k),
    lambda n, k: float(k) if n == 1 else 0.5 * k,
    lambda n, k: math.sqrt(k) * (1.0 if n == 1 else 0.8),
    lambda n, k: float(min(k, 2)),
    lambda n, k: 1.0 + 0.0 * k,
]


def provider(shapes: dict[str, Callable[[int, int], float]]) -> Callable[[JobView], SpeedupFn]:
    def make(job: JobView) -> SpeedupFn:
        fn = shapes.get(job.name)
        if fn is None:  # a fitted model (the perf layer's speedup)
            return adaptive_speedup(job)

        def speedup(n: IntArray, k: IntArray) -> npt.NDArray[np.float64]:
            flat = [
                fn(int(a), int(b)) if b > 0 else 0.0
                for a, b in zip(n.ravel(), k.ravel(), strict=True)
            ]
            return np.asarray(flat, dtype=np.float64).reshape(np.shape(k))

        return speedup

    return make


def random_problem(rng: np.random.Generator) -> PolluxProblem:
    """2-5 nodes of 1-4 GPUs, 2-6 jobs with current placements; varied config."""
    num_nodes = int(rng.integers(2, 6))
    gpus = [int(g) for g in rng.integers(1, 5, size=num_nodes)]
    used = [0] * num_nodes
    jobs, shapes = [], {}
    for i in range(int(rng.integers(2, 7))):
        placement = []
        for node in rng.integers(0, num_nodes, size=int(rng.integers(0, 5))):
            if used[node] < gpus[node]:
                used[node] += 1
                placement.append(int(node))
        name = f"j{i}"
        choice = int(rng.integers(0, len(SHAPES) + 2))
        perf = None
        if choice < len(SHAPES):
            shapes[name] = SHAPES[choice]
        else:
            perf = PERF if choice == len(SHAPES) else POOR_PERF
        jobs.append(
            make_job(
                name,
                submit_time=float(rng.choice([0.0, 600.0, 3000.0, 3590.0])),
                placement=placement,
                min_replicas=int(rng.integers(0, 3)),
                max_replicas=int(rng.integers(1, 9)),
                num_restarts=int(rng.integers(0, 4)),
                perf=perf,
            )
        )
    config = PolluxConfig(
        p=float(rng.choice([-1.0, -1.0, 0.0, -2.0, 0.5])),
        interference_avoidance=bool(rng.integers(0, 4) > 0),
        max_nodes_per_job=int(rng.choice([1, 2, 3, 16])),
    )
    state = make_state(jobs, nodes=num_nodes, gpus=gpus)
    return PolluxProblem(state, config, provider(shapes))


def random_tabu(rng: np.random.Generator, shape: tuple[int, int]) -> npt.NDArray[np.bool_]:
    return rng.random(shape) < float(rng.choice([0.0, 0.2, 0.5]))


def masks_of(tabu: npt.NDArray[np.bool_]) -> list[int]:
    return [sum(1 << int(v) for v in np.flatnonzero(row)) for row in tabu]


def same_move(a: Move | None, b: Move | None) -> bool:
    if a is None or b is None:
        return a is b
    return (a.gain.hex(), a.kind, a.cells) == (b.gain.hex(), b.kind, b.cells)


def check_aggregates(state: SearchState, problem: PolluxProblem) -> None:
    """The incremental aggregates equal those recomputed from the matrix."""
    m = state.matrix()

    def mask(cells: npt.NDArray[np.bool_]) -> list[int]:
        return [sum(1 << int(v) for v in np.flatnonzero(row)) for row in cells]

    rows = state.rows
    assert [r.k for r in rows] == m.sum(axis=1).tolist()
    assert [r.n for r in rows] == np.count_nonzero(m, axis=1).tolist()
    assert [r.diff for r in rows] == np.abs(m - problem.base).sum(axis=1).tolist()
    assert [r.on for r in rows] == mask(m > 0)
    assert [r.one for r in rows] == mask(m == 1)
    assert [r.lt for r in rows] == mask(m < problem.base)
    assert [r.gt for r in rows] == mask(m > problem.base)
    assert state.cost == problem.matrix_cost(m).tolist()
    assert state.total().hex() == float(problem.matrix_cost(m).sum()).hex()
    assert SearchState.costs_of(problem, m).hex() == state.total().hex()
    assert state.free == (problem.capacity - m.sum(axis=0)).tolist()
    assert state.free_mask == mask((problem.capacity - m.sum(axis=0) > 0)[None, :])[0]
    dist = (m > 0) & (np.count_nonzero(m, axis=1) > 1)[:, None]
    assert state.dist == dist.sum(axis=0).tolist()
    fresh = SearchState(problem, m)
    assert state.interference() == fresh.interference()


@pytest.mark.parametrize("seed", range(40))
def test_best_move_is_the_reference_move_along_random_walks(seed: int) -> None:
    rng = np.random.default_rng(seed)
    problem = random_problem(rng)
    matrix = repair_base(problem)
    state = SearchState(problem, matrix)
    for _ in range(25):
        tabu = random_tabu(rng, matrix.shape)
        want = best_move_reference(problem, matrix, None)
        assert same_move(state.best_move(), want)
        # Aspiration thresholds around the move gains, so tabu cells are let through
        # on some moves and not on others.
        gain = want.gain if want is not None else 0.0
        for aspiration in (-math.inf, gain, gain + 1e-3, float(rng.normal())):
            want = best_move_reference(problem, matrix, tabu, aspiration)
            got = state.best_move(masks_of(tabu), aspiration)
            assert same_move(got, want), (matrix, tabu, aspiration)
        move = want or best_move_reference(problem, matrix, None)
        if move is None:
            break
        state.apply(move.cells)
        for job, node, change in move.cells:
            matrix[job, node] += change
        assert np.array_equal(state.matrix(), matrix)
        check_aggregates(state, problem)


def reference_local_search(problem: PolluxProblem, start: IntArray) -> IntArray:
    """The local search as it was written before SearchState, on the reference moves."""
    matrix = start.copy()
    for _ in range(problem.config.max_search_moves):
        total = float(problem.matrix_cost(matrix).sum())
        move = best_move_reference(problem, matrix)
        if move is None or not move.gain < -_tolerance(total):
            break
        for job, node, change in move.cells:
            matrix[job, node] += change
    return matrix


def reference_tabu_search(problem: PolluxProblem, start: IntArray, lower: float) -> IntArray:
    """The tabu search as it was written before SearchState, on the reference moves."""
    cfg = problem.config
    matrix = start.copy()
    best, best_cost = matrix.copy(), float(problem.matrix_cost(matrix).sum())
    touched = np.full(matrix.shape, -(cfg.tabu_tenure + 1), dtype=np.int64)
    current = best_cost
    for step in range(cfg.tabu_moves):
        if best_cost <= lower + _tolerance(lower):
            break
        tabu = step - touched <= cfg.tabu_tenure
        move = best_move_reference(
            problem, matrix, tabu, best_cost - current - _tolerance(best_cost)
        )
        if move is None:
            break
        for job, node, change in move.cells:
            matrix[job, node] += change
            touched[job, node] = step
        current = float(problem.matrix_cost(matrix).sum())
        if current < best_cost - _tolerance(best_cost):
            best, best_cost = matrix.copy(), current
    return best


@pytest.mark.parametrize("seed", range(20))
def test_searches_match_the_searches_on_reference_moves(seed: int) -> None:
    problem = random_problem(np.random.default_rng(1000 + seed))
    start = repair_base(problem)
    assert np.array_equal(local_search(problem, start), reference_local_search(problem, start))
    assert np.array_equal(local_search(problem, start), reference_local_search(problem, start))
    _, _, lower = dp_counts(problem)
    for tenure in (0, 1, 4):
        problem.config = dataclasses.replace(problem.config, tabu_tenure=tenure)
        got = tabu_search(problem, start, lower - 1.0)  # never stops at the bound
        assert np.array_equal(got, reference_tabu_search(problem, start, lower - 1.0))


def test_a_transfer_tie_skips_the_tabu_receiver() -> None:
    """Two identical idle jobs tie as receivers of the only GPU; the first is tabu."""
    jobs = [make_job("a", placement=(0,), max_replicas=1)]
    jobs += [make_job(name, submit_time=10.0, max_replicas=1) for name in ("b1", "b2")]
    state = make_state(jobs, nodes=1, gpus=1)
    problem = PolluxProblem(
        state, PolluxConfig(), provider(dict.fromkeys(["a", "b1", "b2"], SHAPES[0]))
    )
    matrix = problem.base.copy()
    names = [job.name for job in problem.jobs]
    tabu = np.zeros(matrix.shape, dtype=bool)
    tabu[names.index("b1"), 0] = True
    want = best_move_reference(problem, matrix, tabu)
    assert want is not None and want.cells[1] == (names.index("b2"), 0, 1)
    assert same_move(SearchState(problem, matrix).best_move(masks_of(tabu)), want)


def test_a_non_finite_cost_falls_back_to_the_reference() -> None:
    jobs = [
        make_job("a", placement=(0, 1), max_replicas=4),
        make_job("b", placement=(1,), max_replicas=4),
    ]
    shapes = {"a": lambda n, k: math.nan if k == 3 else float(k), "b": lambda n, k: float(k)}
    state = make_state(jobs, nodes=2, gpus=2)
    problem = PolluxProblem(state, PolluxConfig(), provider(shapes))
    matrix = problem.base.copy()
    search = SearchState(problem, matrix)
    assert problem.costs_finite is False  # a at 3 GPUs is a neighbour of its 2
    assert same_move(search.best_move(), best_move_reference(problem, matrix))
    solve(problem)  # and the whole search runs


def test_the_memo_batches_do_not_change_costs() -> None:
    rng = np.random.default_rng(7)
    problem = random_problem(rng)
    jobs = np.arange(problem.num_jobs)
    for j in jobs:
        for k in range(int(problem.max_replicas[j]) + 1):
            for n in range(0 if k == 0 else 1, min(k, problem.num_nodes) + 1):
                unchanged, changed = problem.cost_memo(int(j))[n, k]
                one = np.array([j])
                assert unchanged == problem.costs(one, one * 0 + n, one * 0 + k, one < 0)[0]
                assert changed == problem.costs(one, one * 0 + n, one * 0 + k, one >= 0)[0]


def test_config_variants_are_exercised() -> None:
    seen = {dataclasses.astuple(random_problem(np.random.default_rng(s)).config) for s in range(40)}
    assert len(seen) > 10
