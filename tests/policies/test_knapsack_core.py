"""The core knapsack (``deepboot:solver=core``): the reference DP's optimal value, found
by the Lagrangian reduction (issue 49: ATS-T at 4,096 GPUs)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepboot.policies.allocation import group_knapsack
from deepboot.policies.knapsack_core import core_knapsack, core_knapsack_matrix


def total(values: list[np.ndarray], low: list[int], counts: list[int]) -> float:
    return sum(float(v[k - lo]) if k else 0.0 for v, lo, k in zip(values, low, counts, strict=True))


def assert_feasible(values: list[np.ndarray], low: list[int], counts: list[int], cap: int) -> None:
    assert len(counts) == len(values)
    assert sum(counts) <= cap
    for v, lo, k in zip(values, low, counts, strict=True):
        assert k == 0 or lo <= k <= lo + v.size - 1


groups = st.lists(
    st.tuples(
        st.lists(st.integers(-2, 4).map(float), max_size=6)  # small integers: many ties
        | st.lists(st.floats(-1, 10, allow_nan=False), max_size=6)
        | st.lists(st.floats(0, 3), min_size=1, max_size=6).map(lambda v: sorted(v)),
        st.integers(1, 4),
    ),
    max_size=7,
)


@settings(max_examples=400, deadline=None)
@given(groups=groups, capacity=st.integers(0, 20))
def test_the_core_reaches_the_reference_dps_optimum(
    groups: list[tuple[list[float], int]], capacity: int
) -> None:
    values = [np.asarray(v, dtype=np.float64) for v, _ in groups]
    low = [lo for _, lo in groups]
    ours = core_knapsack(values, low, capacity)
    ref = group_knapsack(values, low, capacity)
    assert_feasible(values, low, ours, capacity)
    assert total(values, low, ours) == pytest.approx(total(values, low, ref), rel=1e-12, abs=1e-12)


@settings(max_examples=150, deadline=None)
@given(groups=groups.filter(lambda g: len(g) <= 5), capacity=st.integers(0, 12))
def test_the_core_is_optimal_against_brute_force(
    groups: list[tuple[list[float], int]], capacity: int
) -> None:
    values = [np.asarray(v, dtype=np.float64) for v, _ in groups]
    low = [lo for _, lo in groups]
    options = [[0, *range(lo, lo + v.size)] for v, lo in zip(values, low, strict=True)]
    best = max(
        total(values, low, list(c)) for c in itertools.product(*options) if sum(c) <= capacity
    )
    ours = core_knapsack(values, low, capacity)
    assert total(values, low, ours) == pytest.approx(best, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("shape", ["concave", "bumpy", "linear"])
def test_large_random_instances_match_the_dp(seed: int, shape: str) -> None:
    """Hundreds of groups, as ATS-T gives it: concave speedup-like values, values with
    a bump at one count (a job's current count, unpenalised), and linear values (every
    item on the price line: the core is everything)."""
    rng = np.random.default_rng(seed)
    values, low = [], []
    for _ in range(300):
        size = int(rng.choice([1, 2, 4, 8, 16, 32]))
        k = np.arange(1, size + 1, dtype=np.float64)
        if shape == "linear":
            v = k * 0.5
        else:
            v = np.log1p(k * rng.uniform(0.2, 2.0)) * rng.uniform(0.5, 3.0)
            if shape == "bumpy":
                v = v * 0.7
                v[int(rng.integers(size))] /= 0.7
        values.append(v)
        low.append(1)
    for cap in (0, 50, 700, 1500, 5000):
        ours = core_knapsack(values, low, cap)
        ref = group_knapsack(values, low, cap)
        assert_feasible(values, low, ours, cap)
        assert total(values, low, ours) == pytest.approx(total(values, low, ref), rel=1e-12)


def test_the_matrix_form_marks_missing_items_with_minus_infinity() -> None:
    values = np.array([[1.0, 5.0, -np.inf], [2.0, 2.5, 2.9], [-np.inf, -np.inf, -np.inf]])
    counts = core_knapsack_matrix(values, np.array([1, 1, 2]), 4)
    assert counts == [2, 2, 0]
    assert core_knapsack_matrix(np.zeros((0, 1)), np.zeros(0, dtype=np.int64), 3) == []


@pytest.mark.parametrize(
    ("values", "low", "capacity", "match"),
    [
        ([np.array([np.nan])], [1], 3, "finite"),
        ([np.array([np.inf])], [1], 3, "finite"),
        ([np.array([1.0])], [0], 3, "start at 1"),
        ([np.array([1.0])], [1], -1, "capacity"),
        ([np.array([1.0])], [1, 2], 3, "lows"),
    ],
)
def test_bad_input_is_refused_as_the_dp_refuses_it(
    values: list[np.ndarray], low: list[int], capacity: int, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        core_knapsack(values, low, capacity)
