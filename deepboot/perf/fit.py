"""Fitting the 7 throughput parameters from step-time measurements.

Follows the reference ``fit_perf_params`` (petuum/adaptdl, simulator/goodput.py):

* objective: RMS log error of the compute time plus RMS log error of the step time,
  plus two small regularizers (gamma towards 1; retrogression terms towards 0);
* L-BFGS-B from alpha = 0.1, beta = 0.01, gamma = 1.001, with bounds [1e-8, inf) and
  gamma in [1, 10]; unlike the reference, restarted from its own result (up to 3
  times) while that still lowers the loss, because it can stop early on this badly
  scaled problem;
* parameters the data cannot identify are pinned:
  - one per-GPU batch size only: alpha_c = mean(compute_time) / 2;
  - no multi-node point: alpha_n, beta_n at their lower bound (then raised to
    1.1 x the intra-node ones after the fit, a prior that crossing nodes is slower);
  - no single-node multi-replica point: alpha_r, beta_r at their lower bound;
  - no point with more than 2 replicas: beta_n, beta_r at their lower bound.

The simulator refits every job online, so the objective and its gradient are computed
analytically on NumPy arrays (one call is a few vector operations over the points).
"""

from __future__ import annotations

import math
from typing import TypeAlias

import numpy as np
import numpy.typing as npt
import scipy.optimize

from deepboot.core.params import PerfParams

FloatArray: TypeAlias = npt.NDArray[np.float64]

_LOWER = 1e-8
_GAMMA_MAX = 10.0
_INIT = (1e-1, 1e-2, 1e-1, 1e-2, 1e-1, 1e-2, 1.0 + 1e-3)
_REG_GAMMA = 1e-3
_REG_RETRO = 1e-2
_PRIOR_INTER = 1.1
_MAX_RESTARTS = 3
_RESTART_GAIN = 1e-6
# Keeps sqrt differentiable when a fit is exact.
_TINY = 1e-12


def _objective(
    x: FloatArray,
    m: FloatArray,
    sync: npt.NDArray[np.bool_],
    inter: FloatArray,
    intra: FloatArray,
    retro: FloatArray,
    log_compute: FloatArray,
    log_step: FloatArray,
) -> tuple[float, FloatArray]:
    """Loss and gradient for parameters ``x`` (7,) over P points.

    ``m``, ``sync``, ``log_compute`` and ``log_step`` are (P,); ``inter``, ``intra``
    and ``retro`` are (S,), for the S points with ``sync`` (more than one replica).
    """
    ac, bc, an, bn, ar, br, g = x.tolist()
    n_pts = float(m.size)
    t_grad = ac + bc * m
    log_grad = np.log(t_grad)
    log_pred = log_grad.copy()
    w_grad = np.ones_like(m)
    # Only multi-replica points synchronise; elsewhere T_iter = T_grad exactly.
    t_sync = inter * (an + bn * retro) + intra * (ar + br * retro)
    log_sync = np.log(t_sync)
    u = g * log_grad[sync]
    v = g * log_sync
    lse = np.logaddexp(u, v)
    log_pred[sync] = lse / g
    w_grad[sync] = np.exp(u - lse)
    w_sync = np.exp(v - lse)

    r1 = log_grad - log_compute
    r2 = log_pred - log_step
    err1 = float(np.sqrt(np.dot(r1, r1) / n_pts + _TINY))
    err2 = float(np.sqrt(np.dot(r2, r2) / n_pts + _TINY))
    ratio_n = bn / an
    ratio_r = br / ar
    loss = err1 + err2 + _REG_GAMMA * (g - 1.0) ** 2 + _REG_RETRO * (ratio_n**2 + ratio_r**2)

    # Chain rule: d loss / d log_grad via err1, d loss / d log_pred via err2.
    d1 = r1 / (n_pts * err1)
    d2 = r2 / (n_pts * err2)
    dt_grad = (d1 + d2 * w_grad) / t_grad
    d2s = d2[sync]
    dt_sync = d2s * w_sync / t_sync
    # d log_pred / d gamma = (w_grad * log_grad + w_sync * log_sync - log_pred) / gamma.
    dg = float(np.dot(d2s, w_grad[sync] * log_grad[sync] + w_sync * log_sync - lse / g)) / g
    ds_inter = dt_sync * inter
    ds_intra = dt_sync * intra
    grad = np.array(
        [
            dt_grad.sum(),
            np.dot(dt_grad, m),
            ds_inter.sum() - 2 * _REG_RETRO * ratio_n * bn / an**2,
            np.dot(ds_inter, retro) + 2 * _REG_RETRO * ratio_n / an,
            ds_intra.sum() - 2 * _REG_RETRO * ratio_r * br / ar**2,
            np.dot(ds_intra, retro) + 2 * _REG_RETRO * ratio_r / ar,
            dg + 2 * _REG_GAMMA * (g - 1.0),
        ]
    )
    return loss, grad


def fit_perf_params(
    num_nodes: npt.ArrayLike,
    num_replicas: npt.ArrayLike,
    local_bsz: npt.ArrayLike,
    compute_time: npt.ArrayLike,
    step_time: npt.ArrayLike,
) -> PerfParams:
    """Fit the throughput model to measured points (see the module docstring).

    Args:
        num_nodes: (P,) nodes of each point, >= 1.
        num_replicas: (P,) replicas of each point, >= num_nodes.
        local_bsz: (P,) per-GPU batch of each point.
        compute_time: (P,) seconds of forward+backward (step time minus sync time), > 0.
        step_time: (P,) seconds of one optimizer step without accumulation, > 0.

    Returns:
        The fitted parameters. The inputs are not modified.

    Raises:
        ValueError: no points, arrays of different lengths, or non-positive times.
    """
    n = np.asarray(num_nodes, dtype=np.int64).ravel()
    k = np.asarray(num_replicas, dtype=np.int64).ravel()
    m = np.asarray(local_bsz, dtype=np.float64).ravel()
    t_comp = np.asarray(compute_time, dtype=np.float64).ravel()
    t_step = np.asarray(step_time, dtype=np.float64).ravel()
    if n.size == 0 or not (n.size == k.size == m.size == t_comp.size == t_step.size):
        raise ValueError("fit_perf_params needs equally long, non-empty arrays")
    if np.any(t_comp <= 0) or np.any(t_step <= 0):
        raise ValueError("fit_perf_params needs positive compute and step times")

    x0 = np.array(_INIT)
    lower = np.array([_LOWER] * 6 + [1.0])
    upper = np.array([np.inf] * 6 + [_GAMMA_MAX])
    if np.unique(m).size == 1:
        # One batch size cannot separate alpha_c from beta_c: split the time evenly,
        # which keeps the model optimistic about larger batches.
        x0[0] = lower[0] = upper[0] = float(np.mean(t_comp)) / 2
    pinned: list[int] = []
    multi_node = bool(np.any(n > 1))
    if not multi_node:
        pinned += [2, 3]
    if not np.any((n == 1) & (k > 1)):
        pinned += [4, 5]
    if not np.any(k > 2):
        pinned += [3, 5]
    for i in pinned:
        x0[i] = upper[i] = lower[i]

    sync = k > 1
    inter = (n[sync] > 1).astype(np.float64)
    intra = 1.0 - inter
    retro = np.maximum(k[sync] - 2, 0).astype(np.float64)
    args = (m, sync, inter, intra, retro, np.log(t_comp), np.log(t_step))
    bounds = scipy.optimize.Bounds(lower, upper, keep_feasible=True)
    x = x0
    best = math.inf
    # L-BFGS-B sometimes stops early on this badly scaled problem ("relative reduction
    # of f"); restarting from its result with a fresh curvature memory recovers it.
    for _ in range(_MAX_RESTARTS + 1):
        result = scipy.optimize.minimize(
            _objective, x, args=args, jac=True, method="L-BFGS-B", bounds=bounds
        )
        fun = float(result.fun)
        gain = best - fun
        if fun < best:
            best = fun
            x = np.asarray(result.x, dtype=np.float64)
        if gain <= _RESTART_GAIN * max(abs(best), 1.0):
            break
    x = np.clip(x, lower, upper)
    if not multi_node:
        x[2] = max(x[2], x[4] * _PRIOR_INTER)
        x[3] = max(x[3], x[5] * _PRIOR_INTER)
    return PerfParams(*(float(v) for v in x))
