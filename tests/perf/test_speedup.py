"""Speedup functions: ratios of optimized (or fixed-batch) goodput, memoized."""

from __future__ import annotations

import numpy as np
import pytest

from deepboot.core.modes import JobMode
from deepboot.core.params import BatchLimits, GradParams, PerfParams
from deepboot.core.placement import EMPTY
from deepboot.core.state import JobView
from deepboot.perf.speedup import FixedBatchSpeedup, SpeedupModel, linear_speedup, speedup_fn

from .builders import make_limits, make_model, make_perf


def make_job(
    perf: PerfParams | None = None,
    grad: GradParams | None = None,
    limits: BatchLimits | None = None,
    target_batch_size: int | None = None,
) -> JobView:
    return JobView(
        name="j",
        application="toy",
        submit_time=0.0,
        attained_service=0.0,
        num_restarts=0,
        placement=EMPTY,
        min_replicas=0,
        max_replicas=16,
        limits=limits or make_limits(),
        perf_params=perf,
        grad_params=grad,
        target_batch_size=target_batch_size,
    )


def test_speedup_is_optimized_goodput_over_one_gpu() -> None:
    model = make_model(perf=make_perf(gamma=2.0))
    fn = SpeedupModel(model)
    nodes = np.array([1, 1, 2, 4])
    replicas = np.array([1, 4, 8, 16])
    base, _, _ = model.optimize(1, 1)
    good, _, _ = model.optimize(nodes, replicas)
    np.testing.assert_allclose(fn(nodes, replicas), good / base)
    assert float(fn(1, 1)) == pytest.approx(1.0)


def test_memoized_results_equal_fresh_results_in_any_order() -> None:
    model = make_model()
    warm = SpeedupModel(model)
    first = warm(np.array([2, 1]), np.array([8, 3]))
    mixed_n = np.array([[4, 1], [2, 1], [1, 3]])
    mixed_k = np.array([[16, 1], [8, 3], [2, 12]])
    again = warm(mixed_n, mixed_k)
    fresh = SpeedupModel(model)(mixed_n, mixed_k)
    assert again.shape == (3, 2)
    np.testing.assert_array_equal(again, fresh)
    assert again[1, 0] == first[0] and again[1, 1] == first[1]
    # Growing the memo past its initial size keeps earlier entries.
    big = warm(np.array([40]), np.array([100]))
    assert big.shape == (1,)
    np.testing.assert_array_equal(warm(mixed_n, mixed_k), fresh)


def test_zero_replicas_is_zero_and_bad_pairs_raise() -> None:
    fn = SpeedupModel(make_model())
    np.testing.assert_array_equal(fn(np.array([0, 1]), np.array([0, 1]))[0], 0.0)
    for nodes, replicas in [(2, 1), (0, 3), (1, 0), (-1, 2)]:
        with pytest.raises(ValueError):
            fn(np.array([nodes]), np.array([replicas]))


def test_speedup_grows_then_saturates_with_replicas() -> None:
    # A slow network: more replicas help less than linearly.
    fn = SpeedupModel(make_model(perf=make_perf(alpha_r=1.0, alpha_n=3.0)))
    s = fn(np.array([1, 1, 1]), np.array([1, 2, 4]))
    assert s[0] == pytest.approx(1.0)
    assert s[2] < 4.0


def test_fixed_batch_speedup_uses_the_fixed_split() -> None:
    model = make_model()
    fn = FixedBatchSpeedup(model, 100)
    nodes, replicas = np.array([1, 1, 2]), np.array([1, 4, 8])
    good, _, _ = model.fixed_batch(nodes, replicas, 100)
    base, _, _ = model.fixed_batch(1, 1, 100)
    np.testing.assert_allclose(fn(nodes, replicas), good / base)
    assert fn(np.array([0]), np.array([0]))[0] == 0.0


@pytest.mark.parametrize("mode", list(JobMode), ids=lambda m: m.value)
def test_speedup_fn_is_linear_without_a_model(mode: JobMode) -> None:
    for job in (make_job(), make_job(perf=make_perf()), make_job(grad=GradParams(1.0, 1.0))):
        fn = speedup_fn(job, mode)
        assert fn is linear_speedup
        np.testing.assert_array_equal(fn(np.array([1, 2, 0]), np.array([3, 8, 0])), [3, 8, 0])


@pytest.mark.parametrize(
    ("mode", "expected_type"),
    [
        (JobMode.ADAPTIVE, SpeedupModel),
        (JobMode.FIXED_BATCH, FixedBatchSpeedup),
        (JobMode.FIXED, FixedBatchSpeedup),
    ],
    ids=lambda x: getattr(x, "value", getattr(x, "__name__", "")),
)
def test_speedup_fn_by_mode(mode: JobMode, expected_type: type) -> None:
    grad = GradParams(1.0, 4.0)
    job = make_job(perf=make_perf(), grad=grad, target_batch_size=100)
    fn = speedup_fn(job, mode)
    assert isinstance(fn, expected_type)
    model = make_model(grad=grad)
    nodes, replicas = np.array([1, 2]), np.array([4, 8])
    if mode is JobMode.ADAPTIVE:
        expected = SpeedupModel(model)(nodes, replicas)
    else:
        expected = FixedBatchSpeedup(model, 100)(nodes, replicas)
    np.testing.assert_allclose(fn(nodes, replicas), expected)
    # Equal parameters share one function (and its memo) across rounds.
    assert speedup_fn(job, mode) is fn


def test_fixed_mode_without_target_uses_the_initial_batch() -> None:
    job = make_job(perf=make_perf(), grad=GradParams(1.0, 4.0))
    fn = speedup_fn(job, JobMode.FIXED_BATCH)
    expected = FixedBatchSpeedup(make_model(grad=GradParams(1.0, 4.0)), 10)
    np.testing.assert_allclose(
        fn(np.array([1]), np.array([4])), expected(np.array([1]), np.array([4]))
    )


def test_speedup_rows_are_each_functions_call_bit_for_bit() -> None:
    """One read of many jobs' speedups (ATS-T's items): a memo that holds the pairs,
    one that holds some, one that holds none, a fixed batch, and no model at all."""
    from deepboot.perf.speedup import speedup_rows

    full = SpeedupModel(make_model(perf=make_perf(gamma=1.5)))
    part = SpeedupModel(make_model(perf=make_perf(alpha_n=0.3)))
    cold = SpeedupModel(make_model(perf=make_perf(beta_c=0.02)))
    fixed = FixedBatchSpeedup(make_model(), 40)
    k = np.array([[1, 2, 3, 4, 8, 6], [2, 3, 4, 5, 6, 16], [1, 1, 2, 2, 3, 5]] * 2)
    n = np.minimum((k + 3) // 4, k)
    fns = [full, part, cold, fixed, linear_speedup, full]
    full(n[0], k[0])
    part(n[1, :2], k[1, :2])
    want = [np.asarray(SpeedupModel(f.model)(n[j], k[j])) if isinstance(f, SpeedupModel)
            else np.asarray(f(n[j], k[j])) for j, f in enumerate(fns)]  # fmt: skip
    got = speedup_rows(fns, n, k)
    assert got.shape == k.shape
    for j in range(len(fns)):
        assert got[j].tobytes() == want[j].tobytes()
    none = np.zeros((0, 3), dtype=np.int64)
    assert speedup_rows([], none, none).shape == (0, 3)
