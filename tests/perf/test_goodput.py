"""GoodputModel: hand-computed values, the batch optimizer and the fixed-batch split."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepboot.core.params import BatchLimits, GradParams, PerfParams
from deepboot.perf.goodput import (
    GoodputModel,
    fixed_batch_split,
    fixed_batch_split_array,
    initial_batch_size,
    select_batch,
)

from .builders import make_limits, make_model, make_perf

# make_perf(): alpha_c=0.1 beta_c=0.01 alpha_n=0.5 beta_n=0.1 alpha_r=0.2 beta_r=0.05 gamma=1


@pytest.mark.parametrize(
    ("gamma", "nodes", "replicas", "atomic", "accum", "expected"),
    [
        # T_grad = 0.1 + 0.01*10 = 0.2; K = 1: no sync; T_iter = 0.2; M = 10 -> 10 / 0.2.
        (1.0, 1, 1, 10, 0, 10 / 0.2),
        # Intra-node: T_sync = 0.2 + 0.05*(4-2) = 0.3; T_iter = 0.2 + 0.3; M = 40.
        (1.0, 1, 4, 10, 0, 40 / 0.5),
        # Two replicas: retrogression (K-2) = 0; T_sync = 0.2; T_iter = 0.4; M = 20.
        (1.0, 1, 2, 10, 0, 20 / 0.4),
        # Inter-node: T_sync = 0.5 + 0.1*0 = 0.5; T_iter = 0.7; M = 20.
        (1.0, 2, 2, 10, 0, 20 / 0.7),
        # gamma = 2, one accumulation step: T_sync = 0.5 + 0.1*2 = 0.7;
        # T_iter = sqrt(0.2^2 + 0.7^2) + 1 * 0.2; M = 4 * 10 * 2 = 80.
        (2.0, 2, 4, 10, 1, 80 / (math.sqrt(0.2**2 + 0.7**2) + 0.2)),
        # gamma = 10 on one replica: (0.2^10)^(1/10) = 0.2; s = 3: T_iter = 0.2 + 3*0.2.
        (10.0, 1, 1, 10, 3, 40 / 0.8),
    ],
    ids=["single", "intra4", "intra2", "inter2", "gamma2-accum", "gamma10-accum3"],
)
def test_throughput_matches_hand_computation(
    gamma: float, nodes: int, replicas: int, atomic: int, accum: int, expected: float
) -> None:
    model = make_model(perf=make_perf(gamma=gamma))
    got = model.throughput(nodes, replicas, atomic, accum)
    assert float(got) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("batch", "expected"),
    [
        # phi = M0 * var / sqr = 10 * 4 / 1 = 40; efficiency = (40 + 10) / (40 + M).
        (10, 1.0),
        (40, 50 / 80),
        (80, 50 / 120),
        (5, 50 / 45),
    ],
    ids=["M0", "M40", "M80", "below-M0"],
)
def test_efficiency_matches_hand_computation(batch: int, expected: float) -> None:
    assert float(make_model().efficiency(batch)) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("grad", "batch", "expected"),
    [
        (GradParams(sqr=0.0, var=4.0), 80, 1.0),
        (GradParams(sqr=-1.0, var=4.0), 80, 1.0),
        # No noise at all: phi = 0, efficiency = M0 / M.
        (GradParams(sqr=1.0, var=0.0), 80, 10 / 80),
        (GradParams(sqr=1.0, var=-3.0), 40, 10 / 40),
    ],
    ids=["sqr-zero", "sqr-negative", "var-zero", "var-negative"],
)
def test_efficiency_guards(grad: GradParams, batch: int, expected: float) -> None:
    assert float(make_model(grad=grad).efficiency(batch)) == pytest.approx(expected)


def test_goodput_is_throughput_times_efficiency_and_broadcasts() -> None:
    model = make_model(perf=make_perf(gamma=2.0))
    nodes = np.array([[1, 2], [2, 2]])
    replicas = np.array([[1, 4], [4, 8]])
    got = model.goodput(nodes, replicas, 10, 1)
    assert got.shape == (2, 2)
    # (2 nodes, 4 replicas, m = 10, s = 1): throughput as above, M = 80, efficiency 50/120.
    expected = 80 / (math.sqrt(0.2**2 + 0.7**2) + 0.2) * (50 / 120)
    assert got[0, 1] == pytest.approx(expected, rel=1e-12)
    np.testing.assert_allclose(
        got, model.throughput(nodes, replicas, 10, 1) * model.efficiency(replicas * 20)
    )


@pytest.mark.parametrize(
    ("replicas", "batch", "expected"),
    [
        # local = ceil(100/4) = 25; accum = ceil(25/16) - 1 = 1; atomic = ceil(25/2) = 13;
        # cap = floor(200 / (4*2)) = 25.
        (4, 100, (13, 1)),
        # K = 1 and B = 12 > M0 = 10: accum raised from 0 to 1; atomic = ceil(12/2) = 6.
        (1, 12, (6, 1)),
        # K = 1 and B = M0: no accumulation.
        (1, 10, (10, 0)),
        # local = 25, accum = 1, atomic = 13, capped to floor(200 / (8*2)) = 12.
        (8, 200, (12, 1)),
        # local = ceil(100/64) = 2; accum 0; cap floor(200/64) = 3 -> 2.
        (64, 100, (2, 0)),
        # cap floor(200 / 300) = 0 is floored at 1 micro-batch sample.
        (300, 300, (1, 0)),
    ],
    ids=["split-accum", "single-forced-accum", "single-M0", "capped", "many", "cap-floor-1"],
)
def test_fixed_batch_split(replicas: int, batch: int, expected: tuple[int, int]) -> None:
    assert fixed_batch_split(replicas, batch, make_limits()) == expected
    atomic, accum = fixed_batch_split_array(np.array([replicas]), np.array([batch]), make_limits())
    assert (int(atomic[0]), int(accum[0])) == expected


def test_fixed_batch_split_rejects_empty() -> None:
    with pytest.raises(ValueError):
        fixed_batch_split(0, 10, make_limits())


def test_fixed_batch_goodput_uses_the_split_and_zero_replicas_is_zero() -> None:
    model = make_model()
    good, atomic, accum = model.fixed_batch(np.array([1, 1, 0]), np.array([4, 1, 0]), 100)
    # K = 1: local = 100, accum = ceil(100/16) - 1 = 6, atomic = ceil(100/7) = 15.
    assert (atomic.tolist(), accum.tolist()) == ([13, 15, 0], [1, 6, 0])
    assert good[0] == pytest.approx(float(model.goodput(1, 4, 13, 1)))
    assert good[1] == pytest.approx(float(model.goodput(1, 1, 15, 6)))
    assert good[2] == 0.0


def _brute_force(model: GoodputModel, nodes: int, replicas: int) -> float:
    """Best goodput over every valid integer (atomic, accum) configuration."""
    lim = model.limits
    lo = max(lim.init_batch_size, replicas * lim.min_local_bsz)
    best = 0.0
    for atomic, accum in itertools.product(
        range(lim.min_local_bsz, lim.max_local_bsz + 1), range(0, 40)
    ):
        total = replicas * atomic * (accum + 1)
        if not lo <= total <= lim.max_batch_size:
            continue
        if replicas == 1 and total > lim.init_batch_size and accum == 0:
            continue
        best = max(best, float(model.goodput(nodes, replicas, atomic, accum)))
    return best


@pytest.mark.parametrize(("nodes", "replicas"), [(1, 1), (1, 2), (1, 4), (2, 8), (4, 16)], ids=str)
@pytest.mark.parametrize("noise", [0.5, 40.0], ids=["low-noise", "high-noise"])
def test_optimize_is_near_brute_force_and_beats_fixed_choices(
    nodes: int, replicas: int, noise: float
) -> None:
    model = make_model(grad=GradParams(sqr=1.0, var=noise))
    good, atomic, accum = model.optimize(nodes, replicas)
    brute = _brute_force(model, nodes, replicas)
    assert float(good) >= 0.97 * brute
    assert float(good) == pytest.approx(float(model.goodput(nodes, replicas, atomic, accum)))
    for batch in (initial_batch_size(model.limits, replicas), 100, 200):
        fixed, _, _ = model.fixed_batch(nodes, replicas, batch)
        assert float(good) >= 0.97 * float(fixed)


def test_optimize_prefers_large_batches_when_gradients_are_noisy() -> None:
    quiet = make_model(grad=GradParams(sqr=1.0, var=0.01))
    noisy = make_model(grad=GradParams(sqr=1.0, var=1000.0))
    _, a_quiet, s_quiet = quiet.optimize(1, 4)
    _, a_noisy, s_noisy = noisy.optimize(1, 4)
    assert 4 * a_quiet * (s_quiet + 1) < 4 * a_noisy * (s_noisy + 1)


def test_optimize_without_accumulation_never_accumulates() -> None:
    model = make_model(grad=GradParams(sqr=1.0, var=1000.0))
    _, _, accum = model.optimize(np.array([1, 1, 2]), np.array([1, 4, 8]), accumulation=False)
    assert accum.tolist() == [0, 0, 0]


def test_optimize_infeasible_replica_count_scores_zero() -> None:
    # 128 replicas x min_local 2 = 256 > max_batch_size 200.
    good, atomic, accum = make_model().optimize(32, 128)
    assert float(good) == 0.0
    assert (int(atomic), int(accum)) == (1, 0)


def test_optimize_broadcasts_shapes() -> None:
    good, atomic, accum = make_model().optimize(np.array([[1], [2]]), np.array([[2, 4, 8]]))
    assert good.shape == atomic.shape == accum.shape == (2, 3)
    scalar, _, _ = make_model().optimize(1, 1)
    assert scalar.shape == ()


perf_params = st.builds(
    PerfParams,
    alpha_c=st.floats(1e-3, 1.0),
    beta_c=st.floats(1e-5, 1e-1),
    alpha_n=st.floats(1e-3, 2.0),
    beta_n=st.floats(1e-5, 0.5),
    alpha_r=st.floats(1e-3, 1.0),
    beta_r=st.floats(1e-5, 0.2),
    gamma=st.floats(1.0, 10.0),
)


@st.composite
def batch_limits(draw: st.DrawFn) -> BatchLimits:
    min_local = draw(st.integers(1, 64))
    max_local = draw(st.integers(min_local, 1024))
    init = draw(st.integers(min_local, 512))
    max_batch = draw(st.integers(init, 65536))
    return BatchLimits(init, max_batch, min_local, max_local)


@settings(max_examples=150, deadline=None)
@given(
    perf=perf_params,
    grad=st.builds(GradParams, sqr=st.floats(1e-6, 1e3), var=st.floats(0.0, 1e4)),
    limits=batch_limits(),
    nodes=st.integers(1, 16),
    per_node=st.integers(1, 4),
)
def test_optimize_respects_limits(
    perf: PerfParams, grad: GradParams, limits: BatchLimits, nodes: int, per_node: int
) -> None:
    replicas = nodes * per_node
    model = GoodputModel(perf, grad, limits)
    good, atomic, accum = model.optimize(nodes, replicas)
    g, m, s = float(good), int(atomic), int(accum)
    assert g >= 0.0 and m >= 1 and s >= 0
    if replicas * limits.min_local_bsz > limits.max_batch_size:
        assert g == 0.0
        return
    roomy = limits.max_local_bsz >= 2 * limits.min_local_bsz and (
        replicas > 1 or limits.init_batch_size >= 2 * limits.min_local_bsz
    )
    if not roomy and g == 0.0:
        # Tight limits can leave no valid split on the grid (as in the reference).
        return
    # With room for the split, some candidate is always valid.
    assert g > 0.0
    assert limits.min_local_bsz <= m <= limits.max_local_bsz
    total = replicas * m * (s + 1)
    # ceil() of the per-GPU split may overshoot max_batch_size by less than one sample
    # per micro-batch; select_batch() caps it.
    assert total < limits.max_batch_size + replicas * (s + 1)
    if replicas == 1 and total > limits.init_batch_size:
        assert s >= 1
    assert g == pytest.approx(float(model.goodput(nodes, replicas, m, s)))
    sel_m, sel_s = select_batch(model, limits, nodes, replicas)
    assert replicas * sel_m * (sel_s + 1) <= max(limits.max_batch_size, replicas * (sel_s + 1))


@pytest.mark.parametrize(
    ("has_model", "target", "replicas", "expected"),
    [
        # Fixed target: the fixed split (local 25, accum 1, atomic 13).
        (True, 100, 4, (13, 1)),
        # Adaptive, no model: B = max(M0=10, K*min_local=2*8=16) = 16 over 8 -> (2, 0).
        (False, None, 8, (2, 0)),
        # Adaptive, no model, one replica: B = M0 = 10 -> (10, 0).
        (False, None, 1, (10, 0)),
    ],
    ids=["fixed", "adaptive-unfitted-8", "adaptive-unfitted-1"],
)
def test_select_batch(
    has_model: bool, target: int | None, replicas: int, expected: tuple[int, int]
) -> None:
    model = make_model() if has_model else None
    assert select_batch(model, make_limits(), 1, replicas, target) == expected


def test_select_batch_with_model_is_the_optimizer_choice() -> None:
    model = make_model()
    _, atomic, accum = model.optimize(2, 8)
    assert select_batch(model, model.limits, 2, 8) == (int(atomic), int(accum))
