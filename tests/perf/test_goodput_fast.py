"""The table-driven GoodputModel.optimize and SpeedupModel against the straightforward
computation (GoodputModel.optimize_reference), bit for bit, on random inputs."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from deepboot.core.params import BatchLimits, GradParams, PerfParams
from deepboot.perf.goodput import GoodputModel
from deepboot.perf.speedup import SpeedupModel

Result = tuple[npt.NDArray[np.float64], npt.NDArray[np.int64], npt.NDArray[np.int64]]


def random_limits(rng: np.random.Generator) -> BatchLimits:
    """Limits with every regime: all K feasible, some K past the last feasible one, a
    single feasible batch (M0 == max_batch), none (M0 > max_batch), min_local 0."""
    init = int(rng.integers(1, 300))
    max_batch = int(rng.choice([init, 2 * init, int(rng.integers(init, 20_000)), max(init - 1, 1)]))
    min_local = int(rng.integers(0, 64))
    max_local = int(rng.integers(max(min_local, 1), 2048))
    return BatchLimits(init, max_batch, min_local, max_local)


def random_model(rng: np.random.Generator, limits: BatchLimits | None = None) -> GoodputModel:
    a_c, b_c, a_n, b_n, a_r, b_r = (float(x) for x in rng.uniform(1e-4, 0.3, 6))
    perf = PerfParams(a_c, b_c, a_n, b_n, a_r, b_r, gamma=float(rng.uniform(0.5, 3.0)))
    # sqr <= 0 (efficiency 1) and negative variances included.
    grad = GradParams(sqr=float(rng.uniform(-0.1, 1.0)), var=float(rng.uniform(-1.0, 10.0)))
    return GoodputModel(perf, grad, limits or random_limits(rng))


def random_queries(
    rng: np.random.Generator, size: int, max_nodes: int = 1 << 20
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    replicas = rng.integers(1, int(rng.choice([2, 8, 65, 300, 5000])), size)
    nodes = rng.integers(1, np.minimum(replicas, max_nodes) + 1)
    return nodes.astype(np.int64), replicas.astype(np.int64)


def assert_identical(got: Result, want: Result) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w, strict=True)


@pytest.mark.parametrize("seed", range(4))
def test_optimize_equals_reference_on_random_models(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(60):
        model = random_model(rng)
        nodes, replicas = random_queries(rng, int(rng.integers(1, 80)))
        for accumulation in (True, False):
            assert_identical(
                model.optimize(nodes, replicas, accumulation),
                model.optimize_reference(nodes, replicas, accumulation),
            )


def test_scalar_and_broadcast_queries_equal_reference() -> None:
    rng = np.random.default_rng(10)
    for _ in range(40):
        model = random_model(rng)
        nodes, replicas = random_queries(rng, 6)
        assert_identical(
            model.optimize(int(nodes[0]), int(replicas[0])),
            model.optimize_reference(int(nodes[0]), int(replicas[0])),
        )
        grid_n, grid_k = np.minimum(nodes[:, None], replicas[None, :4]), replicas[None, :4]
        assert_identical(model.optimize(grid_n, grid_k), model.optimize_reference(grid_n, grid_k))
        empty = np.zeros(0, dtype=np.int64)
        assert_identical(model.optimize(empty, empty), model.optimize_reference(empty, empty))


def test_tables_grow_and_mix_feasible_with_infeasible_counts() -> None:
    # One limits object queried with ever larger K: the shared table is extended, and
    # calls mixing feasible K with K past the last feasible one (lo == hi in
    # np.geomspace, which changes its arithmetic for the whole call) stay exact.
    limits = BatchLimits(
        init_batch_size=96, max_batch_size=7000, min_local_bsz=7, max_local_bsz=500
    )
    rng = np.random.default_rng(11)
    for top in (3, 40, 200, 999, 1000, 1001, 3000, 10_000):
        model = random_model(rng, limits)
        replicas = np.unique(np.concatenate((rng.integers(1, top + 1, 30), [top])))
        nodes = np.minimum(rng.integers(1, 9, replicas.size), replicas)
        for accumulation in (True, False):
            assert_identical(
                model.optimize(nodes, replicas, accumulation),
                model.optimize_reference(nodes, replicas, accumulation),
            )


def test_outside_the_tables_the_reference_answers() -> None:
    # min_local_bsz = 0: every K is feasible, so K past the table bound uses the reference.
    model = random_model(np.random.default_rng(12), BatchLimits(64, 1 << 20, 0, 1 << 12))
    replicas = np.array([1, 7, 5000, 9000])
    nodes = np.array([1, 2, 3, 9])
    assert_identical(model.optimize(nodes, replicas), model.optimize_reference(nodes, replicas))


def test_optimize_with_base_equals_two_reference_calls() -> None:
    rng = np.random.default_rng(13)
    for _ in range(80):
        model = random_model(rng)
        nodes, replicas = random_queries(rng, int(rng.integers(0, 40)))
        for accumulation in (True, False):
            base, good = model.optimize_with_base(nodes, replicas, accumulation)
            want_base, _, _ = model.optimize_reference(1, 1, accumulation)
            want, _, _ = model.optimize_reference(nodes, replicas, accumulation)
            assert base == float(want_base)
            assert good.dtype == want.dtype and good.shape == want.shape
            np.testing.assert_array_equal(good, want, strict=True)


def test_speedup_model_equals_straightforward_ratio_in_any_query_order() -> None:
    rng = np.random.default_rng(14)
    for _ in range(40):
        model = random_model(rng)
        fn = SpeedupModel(model)
        base = float(model.optimize_reference(1, 1)[0][()])
        for _ in range(4):
            # Overlapping batches: memo hits, misses and repeated pairs in one call.
            nodes, replicas = random_queries(rng, int(rng.integers(1, 30)), max_nodes=16)
            nodes = np.concatenate((nodes, nodes[:3], [0]))
            replicas = np.concatenate((replicas, replicas[:3], [0]))
            good, _, _ = model.optimize_reference(np.maximum(nodes, 1), np.maximum(replicas, 1))
            want = good / base if base > 0 else replicas.astype(np.float64)
            want = np.where(replicas == 0, 0.0, want)
            np.testing.assert_array_equal(fn(nodes, replicas), want, strict=True)


@pytest.mark.parametrize("seed", range(2))
def test_throughput_memo_never_changes_a_result(seed: int) -> None:
    """The throughput rows are memoized per parameters: asking one model's parameters
    again with other gradient statistics, other queries (overlapping, in another order)
    and after other models must give the reference's bits each time."""
    rng = np.random.default_rng(100 + seed)
    models = [random_model(rng) for _ in range(6)]
    for _ in range(80):
        base = models[int(rng.integers(0, len(models)))]
        grad = GradParams(sqr=float(rng.uniform(-0.1, 1.0)), var=float(rng.uniform(-1.0, 10.0)))
        model = GoodputModel(base.perf, grad, base.limits)
        nodes, replicas = random_queries(rng, int(rng.integers(1, 20)), max_nodes=4)
        accumulation = bool(rng.integers(0, 2))
        assert_identical(
            model.optimize(nodes, replicas, accumulation),
            model.optimize_reference(nodes, replicas, accumulation),
        )
