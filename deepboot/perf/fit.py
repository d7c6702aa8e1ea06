"""Fitting the 7 throughput parameters from step-time measurements.

The model and pinning rules are the reference ``fit_perf_params`` (petuum/adaptdl,
simulator/goodput.py); the numerics are our own, chosen so that the fit is
well-conditioned and gives the same bits on every machine (``docs/perf.md``):

* **Objective**: least squares on log times. The residuals are the log errors of the
  compute time and of the step time (each set weighted 1 / P), the reference's two
  regularizers as residuals (gamma towards 1; the retrogression ratios beta / alpha
  towards 0), and a weak ridge that ties every free log-parameter to a start point
  derived from the data. The ridge gives the loss curvature in every direction, so
  parameters the data barely identify (for example alpha_c against beta_c over a
  narrow batch range) no longer drift along a flat valley: nearby data give nearby
  parameters.
* **Parameterization**: the six positive parameters as logarithms (their scales span
  four decades; in log space a step means the same for each), gamma as itself in
  [1, 10]; the lower bound 1e-8 of the reference becomes a bound on the logarithm.
* **Start**: computed from the data alone (a clamped linear fit of compute time against
  the per-GPU batch, the mean measured sync time per kind); the ridge is centred
  there. A caller may start the solver elsewhere (the simulator passes the fit of the
  job's points but the newest), which saves iterations, not changes the minimum.
* **Solver**: Levenberg-Marquardt with bounds (variables held at a bound when the
  gradient pushes outwards), at most ``FitSettings.max_iterations`` iterations, stopped
  early only by a test on exactly computed quantities. It runs compiled
  (:mod:`deepboot.perf._fitkernel`, numba, generic CPU target, no fast-math): IEEE
  operations in a fixed order and detmath's ``exp``/``log`` written out on scalars; no
  BLAS, no LAPACK, no SIMD-dispatched transcendental, no scipy; the normal equations
  are solved by a Cholesky factorisation written out. It gives the bits of the NumPy
  formulation it replaced (``tests/perf/fit_reference.py``).
* **Pinning** (as the reference): one per-GPU batch size pins alpha_c to half the mean
  compute time; no multi-node point pins alpha_n, beta_n to the lower bound (then
  raised to 1.1 x the intra-node ones after the fit, a prior that crossing nodes is
  slower); no single-node multi-replica point pins alpha_r, beta_r; no point with more
  than 2 replicas pins beta_n, beta_r.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from deepboot.core.params import PerfParams
from deepboot.perf import detmath
from deepboot.perf._fitkernel import levenberg_marquardt

FloatArray: TypeAlias = npt.NDArray[np.float64]

LOWER = 1e-8
"""Lower bound of the six positive parameters (the reference's)."""
GAMMA_MAX = 10.0
_LOG_LOWER = detmath.log_scalar(LOWER)
# Parameter order: alpha_c, beta_c, alpha_n, beta_n, alpha_r, beta_r, gamma.
_AC, _BC, _AN, _BN, _AR, _BR, _G = range(7)


@dataclass(frozen=True, slots=True)
class FitSettings:
    """Weights and budget of :func:`fit_perf_params` (defaults: ``docs/perf.md``).

    Attributes:
        reg_gamma: Weight of (gamma - 1)^2 (the reference's).
        reg_retro: Weight of (beta_n / alpha_n)^2 + (beta_r / alpha_r)^2 (the reference's).
        ridge: Weight of the squared distance of each free log-parameter from its
            data-derived start; small against the data term (a 1% log error on every
            point costs 2e-4), large enough to fix the directions the data leave flat.
        max_iterations: Levenberg-Marquardt iterations at most.
        prior_inter: Without multi-node data, alpha_n and beta_n are at least this
            times alpha_r and beta_r.
    """

    reg_gamma: float = 1e-4
    reg_retro: float = 1e-3
    ridge: float = 1e-4
    max_iterations: int = 100
    prior_inter: float = 1.1


DEFAULT_SETTINGS = FitSettings()


@dataclass(frozen=True, slots=True)
class _Data:
    """The measurements, split as the model needs them (all arrays float64)."""

    m: FloatArray
    """(P,) per-GPU batch."""
    log_comp: FloatArray
    log_step: FloatArray
    sync: npt.NDArray[np.intp]
    """(S,) indices of the points with more than one replica."""
    inter: FloatArray
    """(S,) 1.0 where the point spans nodes, else 0.0."""
    retro: FloatArray
    """(S,) max(K - 2, 0)."""


def _line(x: FloatArray, y: FloatArray) -> tuple[float, float]:
    """Least-squares line y = a + b x with both terms kept positive.

    The slope is clamped so that it explains between 1% and 99% of mean(y) at
    mean(x); with no spread in x it takes the 1% end. A continuous function of the data.
    """
    x_mean = float(np.mean(x))
    y_mean = float(np.mean(y))
    if x_mean <= 0.0:
        return y_mean, 0.01 * y_mean
    dx = x - x_mean
    var = float(np.sum(dx * dx))
    slope = float(np.sum(dx * (y - y_mean))) / var if var > 0 else 0.0
    unit = y_mean / x_mean
    slope = min(max(slope, 0.01 * unit), 0.99 * unit)
    return y_mean - slope * x_mean, slope


def _start(
    n: npt.NDArray[np.int64],
    k: npt.NDArray[np.int64],
    m: FloatArray,
    t_comp: FloatArray,
    t_step: FloatArray,
) -> list[float]:
    """A start point computed from the data alone (a continuous function of it):
    positive lines through compute time against the per-GPU batch and through the
    measured sync time against the replicas past two, for each kind of sync."""
    ac, bc = _line(m, t_comp)
    sync_obs = np.maximum(t_step - t_comp, 1e-3 * t_step)
    retro = np.maximum(k - 2, 0).astype(np.float64)
    out = [ac, bc, LOWER, LOWER, LOWER, LOWER, 1.0 + 1e-3]
    for kind, (ia, ib) in (((n > 1) & (k > 1), (_AN, _BN)), ((n == 1) & (k > 1), (_AR, _BR))):
        if kind.any():
            out[ia], out[ib] = _line(retro[kind], sync_obs[kind])
    return out


def fit_perf_params(
    num_nodes: npt.ArrayLike,
    num_replicas: npt.ArrayLike,
    local_bsz: npt.ArrayLike,
    compute_time: npt.ArrayLike,
    step_time: npt.ArrayLike,
    settings: FitSettings = DEFAULT_SETTINGS,
    start: PerfParams | None = None,
) -> PerfParams:
    """Fit the throughput model to measured points (see the module docstring).

    A pure function of its arguments, with the same bits on every machine.

    Args:
        num_nodes: (P,) nodes of each point, >= 1.
        num_replicas: (P,) replicas of each point, >= num_nodes.
        local_bsz: (P,) per-GPU batch of each point.
        compute_time: (P,) seconds of forward+backward (step time minus sync time), > 0.
        step_time: (P,) seconds of one optimizer step without accumulation, > 0.
        settings: Weights and iteration budget.
        start: Where the solver starts (for example the fit of the same points but
            the newest), instead of the data-derived start. The minimum it converges
            to is the same (the ridge stays centred on the data-derived start), so
            this only saves iterations; the result is still the same on every machine.

    Returns:
        The fitted parameters. The inputs are not modified.

    Raises:
        ValueError: no points, arrays of different lengths, or non-positive or
            non-finite times or batch sizes.
    """
    setup = _prepare(num_nodes, num_replicas, local_bsz, compute_time, step_time, start)
    data = setup.data
    p = levenberg_marquardt(
        np.array(setup.p),
        data.m,
        np.concatenate((data.log_comp, data.log_step)),
        data.sync,
        data.inter,
        data.retro,
        np.array(setup.free, dtype=np.int64),
        np.array(setup.center),
        (math.sqrt(settings.reg_gamma), math.sqrt(settings.reg_retro), math.sqrt(settings.ridge)),
        settings.max_iterations,
        _LOG_LOWER,
        GAMMA_MAX,
    )
    return _with_prior(p.tolist(), setup.multi_node, settings)


@dataclass(frozen=True, slots=True)
class _Setup:
    """A fit's validated inputs, pinned parameters and start (see :func:`_prepare`)."""

    p: list[float]
    """Where the solver starts, pinned parameters at their pinned values."""
    data: _Data
    free: list[int]
    """The parameters the solver moves, in parameter order."""
    center: list[float]
    """The ridge's centre, in the solver's variables."""
    multi_node: bool


def _prepare(
    num_nodes: npt.ArrayLike,
    num_replicas: npt.ArrayLike,
    local_bsz: npt.ArrayLike,
    compute_time: npt.ArrayLike,
    step_time: npt.ArrayLike,
    start: PerfParams | None,
) -> _Setup:
    """Validate the points, apply the pinning rules and choose the start
    (:func:`fit_perf_params` has the contract)."""
    n = np.asarray(num_nodes, dtype=np.int64).ravel()
    k = np.asarray(num_replicas, dtype=np.int64).ravel()
    m = np.asarray(local_bsz, dtype=np.float64).ravel()
    t_comp = np.asarray(compute_time, dtype=np.float64).ravel()
    t_step = np.asarray(step_time, dtype=np.float64).ravel()
    if n.size == 0 or not (n.size == k.size == m.size == t_comp.size == t_step.size):
        raise ValueError("fit_perf_params needs equally long, non-empty arrays")
    if not ((t_comp > 0).all() and (t_step > 0).all() and (m > 0).all()):
        raise ValueError("fit_perf_params needs positive compute and step times and batches")
    if not (np.isfinite(t_comp).all() and np.isfinite(t_step).all()):
        raise ValueError("fit_perf_params needs finite compute and step times")

    p = _start(n, k, m, t_comp, t_step)
    pinned: set[int] = set()
    if (m == m[0]).all():
        # One batch size cannot separate alpha_c from beta_c: split the time evenly,
        # which keeps the model optimistic about larger batches.
        p[_AC] = float(np.mean(t_comp)) / 2
        p[_BC] = p[_AC] / float(m[0])
        pinned.add(_AC)
    multi_node = bool((n > 1).any())
    if not multi_node:
        pinned |= {_AN, _BN}
    if not ((n == 1) & (k > 1)).any():
        pinned |= {_AR, _BR}
    if not (k > 2).any():
        pinned |= {_BN, _BR}
    for i in pinned - {_AC}:
        p[i] = LOWER
    free = [i for i in range(7) if i not in pinned]
    center = [detmath.log_scalar(v) if i != _G else v for i, v in enumerate(p)]
    if start is not None:
        given = dataclasses.astuple(start)
        for i in free:
            p[i] = min(max(float(given[i]), 1.0), GAMMA_MAX) if i == _G else max(given[i], LOWER)

    sync = np.flatnonzero(k > 1)
    # One elementwise call for both: the same values as two.
    log_times = detmath.log(np.concatenate((t_comp, t_step)))
    data = _Data(
        m=m,
        log_comp=log_times[: n.size],
        log_step=log_times[n.size :],
        sync=sync,
        inter=(n[sync] > 1).astype(np.float64),
        retro=np.maximum(k[sync] - 2, 0).astype(np.float64),
    )
    return _Setup(p, data, free, center, multi_node)


def _with_prior(p: list[float], multi_node: bool, settings: FitSettings) -> PerfParams:
    """The fitted parameters, with the inter-node prior applied when no point spans nodes."""
    if not multi_node:
        p[_AN] = max(p[_AN], p[_AR] * settings.prior_inter)
        p[_BN] = max(p[_BN], p[_BR] * settings.prior_inter)
    return PerfParams(*p)
