"""fit_perf_params: recovers known parameters; pins what the data cannot identify."""

from __future__ import annotations

import math

import numpy as np
import pytest

from deepboot.core.params import PerfParams
from deepboot.perf._fitkernel import residuals_and_jacobian
from deepboot.perf.fit import DEFAULT_SETTINGS, fit_perf_params
from deepboot.perf.goodput import compute_time, step_time

TRUE = PerfParams(
    alpha_c=0.02, beta_c=0.003, alpha_n=0.3, beta_n=0.02, alpha_r=0.05, beta_r=0.004, gamma=2.5
)
# gamma = 1 sits where the gamma regularizer is 0; the retrogression regularizer and
# the ridge still pull a little, so a noise-free fit
# predicts the data within 1%, its parameters within 1% (the betas within 15%).
EXACT = PerfParams(
    alpha_c=0.02, beta_c=0.003, alpha_n=0.3, beta_n=0.03, alpha_r=0.1, beta_r=0.01, gamma=1.0
)
FIELDS = ("alpha_c", "beta_c", "alpha_n", "beta_n", "alpha_r", "beta_r", "gamma")


def design(rich: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(nodes, replicas, local_bsz) of a grid of measurement points."""
    shapes = [(1, 1), (1, 2), (1, 3), (1, 4), (2, 2), (2, 4), (2, 8), (4, 8), (4, 16)]
    if not rich:
        shapes = [(1, 1), (1, 2)]
    bsz = [16, 32, 64, 128]
    pts = [(n, k, m) for n, k in shapes for m in bsz]
    arr = np.array(pts, dtype=np.float64)
    return arr[:, 0].astype(np.int64), arr[:, 1].astype(np.int64), arr[:, 2]


def measure(
    perf: PerfParams, nodes: np.ndarray, replicas: np.ndarray, bsz: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    return compute_time(perf, bsz), step_time(perf, nodes, replicas, bsz)


def test_recovers_parameters_from_noise_free_measurements() -> None:
    n, k, m = design()
    comp, step = measure(EXACT, n, k, m)
    got = fit_perf_params(n, k, m, comp, step)
    for f in ("alpha_c", "beta_c", "alpha_n", "alpha_r", "gamma"):
        assert getattr(got, f) == pytest.approx(getattr(EXACT, f), rel=1e-2), f
    for f in ("beta_n", "beta_r"):  # what the retrogression regularizer pulls down
        assert getattr(got, f) == pytest.approx(getattr(EXACT, f), rel=0.15), f
    np.testing.assert_allclose(step_time(got, n, k, m), step, rtol=1e-2)


def test_overlapping_model_is_recovered_up_to_the_regularizers() -> None:
    # The regularizers (gamma towards 1, small retrogression) trade a little data error
    # for a simpler model; compute terms stay within 2% and predictions within 3%.
    n, k, m = design()
    comp, step = measure(TRUE, n, k, m)
    got = fit_perf_params(n, k, m, comp, step)
    assert got.alpha_c == pytest.approx(TRUE.alpha_c, rel=2e-2)
    assert got.beta_c == pytest.approx(TRUE.beta_c, rel=2e-2)
    assert got.alpha_n == pytest.approx(TRUE.alpha_n, rel=0.05)
    assert 1.0 < got.gamma <= TRUE.gamma
    np.testing.assert_allclose(step_time(got, n, k, m), step, rtol=0.03)


def test_small_noise_gives_accurate_predictions() -> None:
    rng = np.random.default_rng(7)
    n, k, m = design()
    comp, step = measure(TRUE, n, k, m)
    noisy_comp = comp * np.exp(rng.normal(0.0, 0.02, comp.size))
    noisy_step = step * np.exp(rng.normal(0.0, 0.02, step.size))
    got = fit_perf_params(n, k, m, noisy_comp, noisy_step)
    assert got.alpha_c == pytest.approx(TRUE.alpha_c, rel=0.15)
    assert got.beta_c == pytest.approx(TRUE.beta_c, rel=0.05)
    assert got.alpha_n == pytest.approx(TRUE.alpha_n, rel=0.15)
    # Predictions (what the scheduler uses) stay within a few percent of the truth.
    grid_n = np.array([1, 1, 2, 4, 3])
    grid_k = np.array([1, 4, 8, 16, 12])
    grid_m = np.array([24.0, 48.0, 96.0, 20.0, 64.0])
    np.testing.assert_allclose(
        step_time(got, grid_n, grid_k, grid_m), step_time(TRUE, grid_n, grid_k, grid_m), rtol=0.05
    )


def test_inputs_are_not_modified() -> None:
    n, k, m = design()
    comp, step = measure(TRUE, n, k, m)
    copies = [a.copy() for a in (n, k, m, comp, step)]
    fit_perf_params(n, k, m, comp, step)
    for a, b in zip((n, k, m, comp, step), copies, strict=True):
        np.testing.assert_array_equal(a, b)


def test_single_batch_size_pins_alpha_c_to_half_the_mean_compute_time() -> None:
    n = np.array([1, 1, 2])
    k = np.array([1, 2, 4])
    m = np.array([32.0, 32.0, 32.0])
    comp, step = measure(TRUE, n, k, m)
    got = fit_perf_params(n, k, m, comp, step)
    assert got.alpha_c == pytest.approx(float(np.mean(comp)) / 2)
    # beta_c absorbs the rest: T_grad(32) is still fitted.
    assert float(compute_time(got, 32.0)) == pytest.approx(float(comp[0]), rel=1e-3)


def test_single_node_data_pins_inter_node_terms_above_intra_node_ones() -> None:
    n, k, m = (np.array([1] * 6), np.array([1, 2, 4, 1, 2, 4]), np.array([16.0] * 3 + [64.0] * 3))
    comp, step = measure(TRUE, n, k, m)
    got = fit_perf_params(n, k, m, comp, step)
    # The prior: crossing nodes is at least 10% slower than staying on one node.
    assert got.alpha_n >= 1.1 * got.alpha_r * (1 - 1e-12)
    assert got.beta_n >= 1.1 * got.beta_r * (1 - 1e-12)


def test_no_multi_replica_data_pins_sync_terms_to_the_lower_bound() -> None:
    n, k, m = np.array([1, 1]), np.array([1, 1]), np.array([16.0, 64.0])
    comp, step = measure(TRUE, n, k, m)
    got = fit_perf_params(n, k, m, comp, step)
    assert got.alpha_r == pytest.approx(1e-8)
    assert got.beta_r == pytest.approx(1e-8)
    assert got.beta_c == pytest.approx(TRUE.beta_c, rel=1e-3)


def test_at_most_two_replicas_pins_retrogression_terms() -> None:
    n, k, m = design(rich=False)
    comp, step = measure(TRUE, n, k, m)
    got = fit_perf_params(n, k, m, comp, step)
    assert got.beta_r == pytest.approx(1e-8)
    assert got.beta_n == pytest.approx(max(1e-8, 1.1 * got.beta_r))


def test_gamma_stays_within_its_bounds() -> None:
    # Perfect overlap in the data (max of compute and sync) pushes gamma up to its cap.
    n, k, m = design()
    comp = compute_time(TRUE, m)
    step = np.maximum(comp, step_time(TRUE, n, k, m) * 0 + np.where(k > 1, 0.5, 0.0))
    got = fit_perf_params(n, k, m, comp, step)
    assert 1.0 <= got.gamma <= 10.0


@pytest.mark.parametrize(
    "bad",
    [
        dict(num_nodes=[], num_replicas=[], local_bsz=[], compute_time=[], step_time=[]),
        dict(num_nodes=[1], num_replicas=[1, 2], local_bsz=[1], compute_time=[1], step_time=[1]),
        dict(num_nodes=[1], num_replicas=[1], local_bsz=[1], compute_time=[0.0], step_time=[1]),
    ],
    ids=["empty", "ragged", "non-positive"],
)
def test_rejects_bad_input(bad: dict[str, list[float]]) -> None:
    with pytest.raises(ValueError):
        fit_perf_params(**bad)


def test_jacobian_matches_finite_differences() -> None:
    n, k, m = design()
    comp, step = measure(TRUE, n, k, m)
    sync = np.flatnonzero(k > 1)
    log_obs = np.concatenate((np.log(comp), np.log(step) + 0.01))
    inter = (n[sync] > 1).astype(np.float64)
    retro = np.maximum(k[sync] - 2, 0).astype(np.float64)
    free = np.arange(7, dtype=np.int64)
    p = [0.05, 0.002, 0.2, 0.01, 0.03, 0.002, 1.7]
    center = [float(np.log(v)) for v in p[:6]] + [p[6]]
    center = [c + 0.1 for c in center]
    s = DEFAULT_SETTINGS
    weights = (math.sqrt(s.reg_gamma), math.sqrt(s.reg_retro), math.sqrt(s.ridge))

    def at(x: list[float]) -> tuple[float, np.ndarray, np.ndarray]:
        q = np.array([float(np.exp(v)) for v in x[:6]] + [x[6]])
        return residuals_and_jacobian(
            q, m, log_obs, sync, inter, retro, free, np.array(center), weights
        )

    x0 = [float(np.log(v)) for v in p[:6]] + [p[6]]
    loss, res, jac = at(x0)
    assert loss == pytest.approx(float(np.sum(res * res)), rel=1e-12)
    h = 1e-6
    for col in range(7):
        up, down = list(x0), list(x0)
        up[col] += h
        down[col] -= h
        numeric = (at(up)[1] - at(down)[1]) / (2 * h)
        np.testing.assert_allclose(jac[:, col], numeric, rtol=1e-5, atol=1e-8, err_msg=str(col))
