"""ATS-T (``deepboot``): the exact group knapsack, the restart penalty, best-fit placement."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepboot.core import ClusterState, ConfigError, JobMode, Placement
from deepboot.policies import DeepBootPolicy, registry
from deepboot.policies.allocation import (
    capacity_profile,
    fair_replicas,
    group_knapsack,
    nodes_for,
    reference_order,
)
from deepboot.policies.deepboot import (
    SPEEDUP_FLOOR,
    DeepBootConfig,
    Objective,
    Solver,
    ats_t_counts,
    ats_t_matrix,
    best_fit_place,
    job_values,
    power_mean_values,
    restart_penalty,
)
from deepboot.policies.packing import Packing, free_map, keep_or_pack

from .builders import GRAD, PERF, POOR_PERF, make_job, make_state

RNG = np.random.default_rng(0)
OLD = 1e6
"""An age at which the restart penalty of a job without restarts is ~1."""


def reference_dp(values: list[list[float]], low: list[int], capacity: int) -> list[int]:
    """The artifact's group knapsack, loop for loop: full rows, first maximum kept,
    backtrack to the smallest count that reaches the optimum."""
    n = len(values)
    dp = [[0.0] * (capacity + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        for c in range(capacity, -1, -1):
            dp[i][c] = dp[i - 1][c]
            for t, v in enumerate(values[i - 1]):
                w = low[i - 1] + t
                if c >= w:
                    dp[i][c] = max(dp[i][c], dp[i - 1][c - w] + v)
    out, c = [0] * n, capacity
    for i in range(n, 0, -1):
        for t, v in enumerate(values[i - 1]):
            w = low[i - 1] + t
            if c >= w and dp[i][c] == dp[i - 1][c - w] + v:
                out[i - 1] = w
                c -= w
                break
    return out


def total_value(values: list[list[float]], low: list[int], counts: list[int]) -> float:
    return sum(v[k - lo] if k else 0.0 for v, lo, k in zip(values, low, counts, strict=True))


groups = st.lists(
    st.tuples(
        st.lists(st.integers(0, 4).map(float), max_size=5)  # small integers: many ties
        | st.lists(st.floats(0, 10, allow_nan=False), max_size=5),
        st.integers(1, 3),
    ),
    max_size=5,
)


@settings(max_examples=300, deadline=None)
@given(groups=groups, capacity=st.integers(0, 14))
def test_knapsack_matches_the_reference_dp_exactly(
    groups: list[tuple[list[float], int]], capacity: int
) -> None:
    values, low = [v for v, _ in groups], [lo for _, lo in groups]
    counts = group_knapsack([np.array(v) for v in values], low, capacity)
    assert counts == reference_dp(values, low, capacity)


@settings(max_examples=200, deadline=None)
@given(groups=groups, capacity=st.integers(0, 12))
def test_knapsack_is_optimal_and_feasible(
    groups: list[tuple[list[float], int]], capacity: int
) -> None:
    values, low = [v for v, _ in groups], [lo for _, lo in groups]
    counts = group_knapsack([np.array(v) for v in values], low, capacity)
    assert sum(counts) <= capacity
    for k, v, lo in zip(counts, values, low, strict=True):
        assert k == 0 or lo <= k < lo + len(v)
    options = [[0, *range(lo, lo + len(v))] for v, lo in groups]
    best = max(
        total_value(values, low, list(c)) for c in itertools.product(*options) if sum(c) <= capacity
    )
    assert total_value(values, low, counts) == pytest.approx(best)


@pytest.mark.parametrize(
    ("values", "low", "capacity", "message"),
    [
        ([np.ones(2)], [1, 2], 4, "lows"),
        ([np.array([1.0, np.nan])], [1], 4, "finite"),
        ([np.ones(2)], [0], 4, "start at 1"),
        ([np.ones(2)], [1], -1, "capacity"),
    ],
    ids=["length-mismatch", "nan-value", "zero-low", "negative-capacity"],
)
def test_knapsack_rejects_bad_input(
    values: list[np.ndarray], low: list[int], capacity: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        group_knapsack(values, low, capacity)


def test_knapsack_scales_to_thousands_of_groups() -> None:
    rng = np.random.default_rng(1)
    values = [np.cumsum(rng.random(int(rng.integers(1, 33)))) for _ in range(300)]
    counts = group_knapsack(values, [1] * 300, 1024)
    assert sum(counts) == 1024  # increasing values: every GPU is worth giving
    assert all(0 <= k <= v.size for k, v in zip(counts, values, strict=True))


@pytest.mark.parametrize(
    ("age", "restarts", "expected"),
    [(0.0, 0, 0.0), (30.0, 0, 0.75), (90.0, 3, 60 / 100), (50.0, 9, 0.0)],
    ids=["brand-new", "young", "some-restarts", "too-many-restarts"],
)
def test_restart_penalty(age: float, restarts: int, expected: float) -> None:
    job = make_job(submit_time=1000.0 - age, num_restarts=restarts)
    assert restart_penalty(job, 1000.0, 10.0) == pytest.approx(expected)


def test_nodes_for_uses_the_fewest_available_nodes() -> None:
    profile = capacity_profile([4, 0, 2, 4, 1])
    ks = np.array([1, 4, 5, 8, 9, 11, 12])
    assert nodes_for(ks, profile).tolist() == [1, 1, 2, 2, 3, 4, 4]
    assert nodes_for(ks, capacity_profile([])).tolist() == [0] * 7


def test_unfitted_jobs_share_every_gpu() -> None:
    jobs = [make_job(f"j{i}", submit_time=OLD * -1 + i, max_replicas=8) for i in range(3)]
    counts = DeepBootPolicy().gpu_counts(make_state(jobs, nodes=2, gpus=4))
    assert sum(counts.values()) == 8


def test_a_job_that_restarted_too_often_keeps_its_count() -> None:
    # Any other count of "old" is worth 0 (penalty 0), so it keeps 1 GPU; "new" gets
    # the rest.
    old = make_job("old", submit_time=3500.0, num_restarts=50, placement=(0,), max_replicas=4)
    new = make_job("new", submit_time=3000.0, max_replicas=4)
    assert DeepBootPolicy().gpu_counts(make_state([old, new], nodes=1)) == {"old": 1, "new": 3}


def test_a_settled_job_outweighs_a_young_one() -> None:
    # Linear speedups: "old" (penalty ~1) is worth ~1 a GPU, "young" 0.5 (age 10 s).
    old = make_job("old", submit_time=3600.0 - OLD, max_replicas=4)
    young = make_job("young", submit_time=3590.0, max_replicas=4)
    counts = DeepBootPolicy().gpu_counts(make_state([old, young], nodes=1))
    assert counts == {"old": 4, "young": 0}


def test_a_brand_new_job_still_gets_spare_gpus() -> None:
    # Age 0: every count is worth 0, yet the artifact's backtrack prefers an item over
    # 0 GPUs on a tie, so it gets the GPU nobody else can use.
    busy = make_job("busy", submit_time=0.0, placement=(0, 0, 0), max_replicas=3)
    new = make_job("new", submit_time=3600.0, max_replicas=4)
    assert DeepBootPolicy().gpu_counts(make_state([busy, new], nodes=1)) == {"busy": 3, "new": 1}


def test_gpus_go_where_they_speed_jobs_up() -> None:
    scales = make_job("scales", submit_time=0.0, perf=PERF, grad=GRAD, placement=(0,))
    stalls = make_job("stalls", submit_time=1.0, perf=POOR_PERF, grad=GRAD, placement=(1,))
    counts = DeepBootPolicy().gpu_counts(make_state([scales, stalls], nodes=2, gpus=4))
    assert counts["scales"] > counts["stalls"] >= 1


@pytest.mark.parametrize(
    ("min_replicas", "max_replicas", "expected"),
    [(0, 2, 2), (3, 8, 8), (0, 0, 0), (3, 2, 0)],
    ids=["capped", "min-met", "no-gpu", "max-below-min"],
)
def test_replica_bounds(min_replicas: int, max_replicas: int, expected: int) -> None:
    job = make_job("j", submit_time=-OLD, min_replicas=min_replicas, max_replicas=max_replicas)
    assert DeepBootPolicy().gpu_counts(make_state([job], nodes=2)) == {"j": expected}


def test_hysteresis_keeps_a_count_a_small_gain_would_change() -> None:
    # A 2-GPU job without restarts whose speedup would grow a little on 3 GPUs.
    job = make_job("j", submit_time=-OLD, fitted=True, placement=(0, 0), max_replicas=3)
    state = make_state([job], nodes=1)
    assert ats_t_counts(state) == {"j": 3}
    assert ats_t_counts(state, DeepBootConfig(hysteresis=0.5)) == {"j": 2}


def test_unchanged_counts_keep_their_placement_and_moves_are_best_fitted() -> None:
    stay = make_job("stay", submit_time=0.0, num_restarts=99, placement=(1, 2), max_replicas=2)
    move = make_job("move", submit_time=1.0, max_replicas=2)
    # Node 0 has 4 free GPUs, node 2 only its last one after "stay": the 2-GPU job
    # best-fits on node 1 (2 free left), not on the emptier node 0.
    state = make_state([stay, move], nodes=3, gpus=[4, 3, 2])
    alloc = DeepBootPolicy().allocate(state, RNG)
    assert alloc["stay"] == Placement((1, 2))
    assert alloc["move"] == Placement((1, 1))


@st.composite
def placement_cases(draw: st.DrawFn) -> tuple[list[tuple[object, int]], dict[int, int]]:
    num_nodes = draw(st.integers(1, 6))
    capacity = {n: draw(st.integers(0, 8)) for n in range(num_nodes)}
    order = []
    for i in range(draw(st.integers(0, 8))):
        current = draw(st.lists(st.integers(0, num_nodes - 1), max_size=5))
        gpus = draw(st.integers(1, 6))
        if draw(st.booleans()):
            gpus = max(len(current), 1)
        order.append((make_job(f"j{i}", placement=current), gpus))
    return order, capacity


@settings(max_examples=200, deadline=None)
@given(case=placement_cases())
def test_fast_best_fit_equals_the_shared_packing(
    case: tuple[list[tuple[object, int]], dict[int, int]],
) -> None:
    order, capacity = case
    total = sum(capacity.values())
    # The policy never asks for more than the total; trim the order as it would.
    kept, used = [], 0
    for job, gpus in order:
        if used + gpus <= total:
            kept.append((job, gpus))
            used += gpus
    fast = best_fit_place(kept, capacity)  # type: ignore[arg-type]
    shared = keep_or_pack(kept, dict(capacity), Packing.BEST_FIT)  # type: ignore[arg-type]
    assert fast == shared
    usage = Counter(n for p in fast.values() for n in p.node_ids)
    assert all(usage[n] <= capacity[n] for n in usage)


def test_registered_with_its_config_and_mode() -> None:
    policy = registry.create("deepboot", restart_delay="20", hysteresis="0.1")
    assert policy.name == "deepboot"
    assert policy.job_mode is JobMode.ADAPTIVE
    assert policy.config == DeepBootConfig(restart_delay=20.0, hysteresis=0.1)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"restart_delay": 0}, "restart_delay"),
        ({"restart_delay": "inf"}, "restart_delay"),
        ({"hysteresis": 1.0}, "hysteresis"),
        ({"hysteresis": -0.1}, "hysteresis"),
        ({"packing": "anywhere"}, "packing"),
        ({"objective": "max"}, "objective"),
        ({"p": 0.5}, "p"),
        ({"p": "nan"}, "p"),
    ],
    ids=[
        "zero-delay",
        "infinite-delay",
        "full-hysteresis",
        "negative-hysteresis",
        "bad-packing",
        "bad-objective",
        "positive-p",
        "nan-p",
    ],  # fmt: skip
)
def test_bad_parameters_raise_config_error_naming_them(
    params: dict[str, object], field: str
) -> None:
    with pytest.raises(ConfigError, match=field):
        registry.create("deepboot", **params)


# -- the power-mean objective (issue 49: why DeepBoot's allocator trails Pollux's) --------


def _power_mean(x: list[float], p: float) -> float:
    """Pollux's power mean of scaled speedups ``x`` with its floor, computed directly."""
    if p == 0:
        return float(np.exp(np.mean(np.log(np.maximum(x, SPEEDUP_FLOOR)))))
    return float(np.mean((np.asarray(x) + SPEEDUP_FLOOR) ** p) ** (1 / p))


speedup_groups = st.lists(
    st.tuples(
        # Increasing scaled speedups of 1.. GPUs (as a job's are), and its smallest count.
        st.lists(st.floats(0.0, 4.0), min_size=1, max_size=4).map(lambda v: sorted(v)),
        st.integers(1, 2),
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=150, deadline=None)
@given(speedup_groups, st.integers(0, 7), st.sampled_from([-1.0, -2.0, -0.5, 0.0]))
def test_the_power_mean_knapsack_maximizes_the_power_mean_exactly(
    groups_: list[tuple[list[float], int]], capacity: int, p: float
) -> None:
    """Against brute force over every count vector: the knapsack over
    :func:`power_mean_values` reaches the largest power mean of all feasible choices."""
    speedups = [np.asarray(v) for v, _ in groups_]
    low = [lo for _, lo in groups_]
    values = [power_mean_values(v, p) for v in speedups]
    counts = group_knapsack(values, low, capacity)
    assert sum(counts) <= capacity

    def mean_of(choice: tuple[int, ...]) -> float:
        return _power_mean([v[k - lo] if k else 0.0 for v, lo, k in
                            zip(speedups, low, choice, strict=True)], p)  # fmt: skip

    options = [[0, *range(lo, lo + len(v))] for v, lo in zip(speedups, low, strict=True)]
    best = max(mean_of(c) for c in itertools.product(*options) if sum(c) <= capacity)
    assert mean_of(tuple(counts)) == pytest.approx(best, rel=1e-9, abs=1e-12)


def test_power_mean_values_keep_zero_for_no_speedup_and_give_diminishing_returns() -> None:
    x = np.array([0.0, 0.5, 1.0, 2.0, 4.0])
    for p in (-1.0, -2.0, -0.5, 0.0):
        v = power_mean_values(x, p)
        assert v[0] == 0.0
        assert np.all(np.diff(v) > 0)  # more speedup is worth more
        gain = np.diff(v) / np.diff(x)
        assert np.all(np.diff(gain) < 0)  # ... less and less


def test_the_power_mean_gives_a_gpu_to_a_queued_job_the_sum_leaves_waiting() -> None:
    # Two settled jobs hold the 4 GPUs; a third arrived 5 s ago. Under the sum its
    # restart penalty (age 5 s: 5 / 15) makes a GPU worth a third of what it is to
    # the others, so it waits (the admission barrier); under the power mean a job at
    # 0 GPUs costs 1 / floor, so it runs.
    a = make_job("a", submit_time=-OLD, max_replicas=4, placement=(0, 0))
    b = make_job("b", submit_time=-OLD + 1, max_replicas=4, placement=(0, 0))
    c = make_job("c", submit_time=3595.0, max_replicas=4)
    state = make_state([a, b, c], nodes=1)
    paper = DeepBootPolicy().gpu_counts(state)
    fair = DeepBootPolicy(DeepBootConfig(objective=Objective.POWER_MEAN)).gpu_counts(state)
    assert paper == {"a": 2, "b": 2, "c": 0}, paper
    assert fair["c"] >= 1 and sum(fair.values()) == 4, fair


def test_the_objective_is_a_parameter() -> None:
    policy = registry.create("deepboot", objective="power-mean", p="-2")
    assert policy.config == DeepBootConfig(objective=Objective.POWER_MEAN, p=-2.0)  # type: ignore[attr-defined]
    assert DeepBootConfig().objective is Objective.SUM  # the paper's, by default


# -- ATS-T at scale (issue 49): one matrix of items, and the core solver ------------------


def _random_state(seed: int, nodes: int = 12, jobs: int = 40) -> ClusterState:
    """Jobs of their own fitted parameters, half of them running, some unfitted, some
    with a smallest count, on nodes of 4 GPUs (a few GPUs taken by inference)."""
    rng = np.random.default_rng(seed)
    free = [4] * nodes
    views = []
    for i in range(jobs):
        placement: list[int] = []
        if rng.random() < 0.5:
            want = int(rng.integers(1, 6))
            for node in rng.permutation(nodes):
                take = min(free[int(node)], want - len(placement))
                free[int(node)] -= take
                placement += [int(node)] * take
        # The cifar10-like parameters, each scaled: every job its own model.
        f = rng.uniform(0.3, 3.0, size=6)
        perf = replace(
            PERF,
            alpha_c=PERF.alpha_c * f[0],
            beta_c=PERF.beta_c * f[1],
            alpha_n=PERF.alpha_n * f[2],
            beta_n=PERF.beta_n * f[3],
            alpha_r=PERF.alpha_r * f[4],
            gamma=1.0 + f[5] / 1.5,
        )
        views.append(
            make_job(
                f"j{i}",
                submit_time=float(rng.uniform(0, 3500)),
                attained_service=float(rng.uniform(0, 1e4)),
                num_restarts=int(rng.integers(0, 5)),
                placement=placement,
                min_replicas=int(rng.choice([0, 0, 0, 2])),
                max_replicas=int(rng.choice([1, 2, 4, 8, 16, 64])),
                perf=perf if rng.random() < 0.8 else None,
            )
        )
    state = make_state(views, nodes=nodes, gpus=4)
    inference = {n: c - (1 if n % 5 == 0 else 0) for n, c in state.capacity.items()}
    return replace(state, capacity=inference)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("objective", list(Objective))
def test_the_item_matrix_is_job_values_row_for_row_bit_for_bit(
    seed: int, objective: Objective
) -> None:
    """:func:`ats_t_matrix` against the per-job specification, :func:`job_values` (and
    :func:`power_mean_values` under the power mean): the same bytes in every row, memos
    cold (first decision) and warm (the same decision again)."""
    state = _random_state(seed)
    config = DeepBootConfig(objective=objective, hysteresis=0.1 * (seed % 2))
    capacity = free_map(state)
    all_gpus = sum(capacity.values())
    fair = fair_replicas(all_gpus, len(state.jobs))
    profile = capacity_profile(capacity.values())
    for _ in range(2):
        items = ats_t_matrix(state, config)
        assert [j.name for j in items.jobs] == [j.name for j in reference_order(state.jobs)]
        for job, lo, row in zip(items.jobs, items.low, items.rows(), strict=True):
            low, want = job_values(job, state.now, all_gpus, fair, profile, capacity, config)
            if objective is Objective.POWER_MEAN:
                want = power_mean_values(want * (len(capacity) / all_gpus), config.p)
            assert int(lo) == low
            assert row.tobytes() == np.asarray(want, dtype=np.float64).tobytes(), job.name


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("objective", list(Objective))
def test_the_core_solver_gives_the_dps_optimum_on_policy_snapshots(
    seed: int, objective: Objective
) -> None:
    state = _random_state(seed, nodes=6, jobs=30)
    dp = DeepBootConfig(objective=objective)
    core = replace(dp, solver=Solver.CORE)
    items = ats_t_matrix(state, dp)

    def worth(counts: dict[str, int]) -> float:
        row = {j.name: i for i, j in enumerate(items.jobs)}
        return sum(
            float(items.values[row[n], k - items.low[row[n]]]) for n, k in counts.items() if k
        )

    ours, ref = ats_t_counts(state, core), ats_t_counts(state, dp)
    assert sum(ours.values()) <= items.total
    assert worth(ours) == pytest.approx(worth(ref), rel=1e-12)
    placed = DeepBootPolicy(core).allocate(state, RNG)
    assert {n: p.num_replicas for n, p in placed.items()} == {n: k for n, k in ours.items() if k}


def test_the_core_solver_is_a_policy_parameter() -> None:
    policy = registry.create("deepboot", objective="power-mean", solver="core")
    assert isinstance(policy, DeepBootPolicy)
    assert policy.config.solver is Solver.CORE
    with pytest.raises(ConfigError, match="solver"):
        registry.create("deepboot", solver="greedy")
