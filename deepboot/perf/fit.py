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
  early only by a test on exactly computed quantities. Every operation is an IEEE
  operation NumPy applies elementwise, or :mod:`deepboot.perf.detmath`: no BLAS, no
  LAPACK, no SIMD-dispatched transcendental, no scipy; the 7 x 7 normal equations are
  solved by a Cholesky factorisation written out in Python.
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

FloatArray: TypeAlias = npt.NDArray[np.float64]

LOWER = 1e-8
"""Lower bound of the six positive parameters (the reference's)."""
GAMMA_MAX = 10.0
_LOG_LOWER = detmath.log_scalar(LOWER)
# Parameter order: alpha_c, beta_c, alpha_n, beta_n, alpha_r, beta_r, gamma.
_AC, _BC, _AN, _BN, _AR, _BR, _G = range(7)
_MAX_STEP = 2.0


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


@dataclass(frozen=True, slots=True)
class _Eval:
    """The objective's pieces at one point.

    ``r1``/``r2`` are the (P,) log errors of compute and step time, ``regs`` the
    regularizer residuals; ``j1``, ``j2``, ``jr`` their Jacobians over the free
    variables. The objective (``loss``) is e1 + e2 + sum(regs * regs), with
    e = mean(r * r) the mean squared log error of each set.
    """

    r1: FloatArray
    r2: FloatArray
    regs: FloatArray
    j1: FloatArray
    j2: FloatArray
    jr: FloatArray
    e1: float
    e2: float
    loss: float


def _evaluate(
    p: list[float], data: _Data, settings: FitSettings, free: list[int], center: list[float]
) -> _Eval:
    """The objective, its residuals and their Jacobians at parameters ``p``.

    Variables are log(p_i) for the six positive parameters and gamma itself;
    ``center`` holds the ridge's centre in the same variables.
    """
    ac, bc, an, bn, ar, br, g = p
    m = data.m
    t_grad = ac + bc * m
    log_grad = detmath.log(t_grad)
    log_pred = log_grad.copy()
    n_pts = m.size
    # d log T / d variable, per point, for all 7 variables.
    d_pred = np.zeros((7, n_pts))
    d_pred[_AC] = ac / t_grad
    d_pred[_BC] = bc * m / t_grad
    d_comp = d_pred[:2].copy()
    s = data.sync
    if s.size:
        inter, retro = data.inter, data.retro
        intra = 1.0 - inter
        t_sync = inter * (an + bn * retro) + intra * (ar + br * retro)
        lg = log_grad[s]
        ls = detmath.log(t_sync)
        u = g * lg
        v = g * ls
        # log(T_grad^g + T_sync^g) = max + log(1 + exp(-|u - v|)).
        e = detmath.exp(-np.abs(u - v))
        one_e = 1.0 + e
        lse = np.maximum(u, v) + detmath.log(one_e)
        pred = lse / g
        log_pred[s] = pred
        big, small = 1.0 / one_e, e / one_e
        w_grad = np.where(u >= v, big, small)
        w_sync = np.where(u >= v, small, big)
        d_pred[_AC, s] = w_grad * d_pred[_AC, s]
        d_pred[_BC, s] = w_grad * d_pred[_BC, s]
        ws = w_sync / t_sync
        d_pred[_AN, s] = ws * inter * an
        d_pred[_BN, s] = ws * inter * bn * retro
        d_pred[_AR, s] = ws * intra * ar
        d_pred[_BR, s] = ws * intra * br * retro
        d_pred[_G, s] = (w_grad * lg + w_sync * ls - pred) / g
    ratio_n = bn / an
    ratio_r = br / ar
    sg = math.sqrt(settings.reg_gamma)
    sr = math.sqrt(settings.reg_retro)
    sk = math.sqrt(settings.ridge)
    positive = [i for i in free if i != _G]
    regs = np.array(
        [sg * (g - 1.0), sr * ratio_n, sr * ratio_r]
        + [sk * (detmath.log_scalar(p[i]) - center[i]) for i in positive]
    )
    q = len(free)
    j1 = np.zeros((n_pts, q))
    j2 = np.zeros((n_pts, q))
    jr = np.zeros((regs.size, q))
    for col, i in enumerate(free):
        if i < 2:
            j1[:, col] = d_comp[i]
        j2[:, col] = d_pred[i]
        if i == _G:
            jr[0, col] = sg
        elif i == _BN:
            jr[1, col] = sr * ratio_n
        elif i == _AN:
            jr[1, col] = -sr * ratio_n
        elif i == _BR:
            jr[2, col] = sr * ratio_r
        elif i == _AR:
            jr[2, col] = -sr * ratio_r
    for row, i in enumerate(positive):
        jr[3 + row, free.index(i)] = sk
    r1 = log_grad - data.log_comp
    r2 = log_pred - data.log_step
    e1 = float(np.sum(r1 * r1)) / n_pts
    e2 = float(np.sum(r2 * r2)) / n_pts
    loss = e1 + e2 + float(np.sum(regs * regs))
    return _Eval(r1, r2, regs, j1, j2, jr, e1, e2, loss)


def _normal_equations(ev: _Eval) -> tuple[list[list[float]], list[float]]:
    """Gauss-Newton Hessian and gradient of the objective at ``ev``, halved.

    The objective is a sum of squares (the data residuals weighted 1 / sqrt(P)), so
    these are J^T J and J^T r over all residuals; products are elementwise sums and
    every sum runs in a fixed order (no BLAS).

    Returns:
        ``(J^T J, J^T r)`` over the free variables, as Python floats.
    """
    w = math.sqrt(1.0 / ev.r1.size)
    r = np.concatenate((w * ev.r1, w * ev.r2, ev.regs))
    jac = np.concatenate((w * ev.j1, w * ev.j2, ev.jr))
    q = jac.shape[1]
    jtj = np.sum(jac[:, :, None] * jac[:, None, :], axis=0)
    jtr = np.sum(jac * r[:, None], axis=0)
    return [[float(jtj[i, j]) for j in range(q)] for i in range(q)], [float(v) for v in jtr]


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
    n = np.asarray(num_nodes, dtype=np.int64).ravel()
    k = np.asarray(num_replicas, dtype=np.int64).ravel()
    m = np.asarray(local_bsz, dtype=np.float64).ravel()
    t_comp = np.asarray(compute_time, dtype=np.float64).ravel()
    t_step = np.asarray(step_time, dtype=np.float64).ravel()
    if n.size == 0 or not (n.size == k.size == m.size == t_comp.size == t_step.size):
        raise ValueError("fit_perf_params needs equally long, non-empty arrays")
    if not (np.all(t_comp > 0) and np.all(t_step > 0) and np.all(m > 0)):
        raise ValueError("fit_perf_params needs positive compute and step times and batches")
    if not (np.all(np.isfinite(t_comp)) and np.all(np.isfinite(t_step))):
        raise ValueError("fit_perf_params needs finite compute and step times")

    p = _start(n, k, m, t_comp, t_step)
    pinned: set[int] = set()
    if np.unique(m).size == 1:
        # One batch size cannot separate alpha_c from beta_c: split the time evenly,
        # which keeps the model optimistic about larger batches.
        p[_AC] = float(np.mean(t_comp)) / 2
        p[_BC] = p[_AC] / float(m[0])
        pinned.add(_AC)
    multi_node = bool(np.any(n > 1))
    if not multi_node:
        pinned |= {_AN, _BN}
    if not np.any((n == 1) & (k > 1)):
        pinned |= {_AR, _BR}
    if not np.any(k > 2):
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
    data = _Data(
        m=m,
        log_comp=detmath.log(t_comp),
        log_step=detmath.log(t_step),
        sync=sync,
        inter=(n[sync] > 1).astype(np.float64),
        retro=np.maximum(k[sync] - 2, 0).astype(np.float64),
    )
    p = _levenberg_marquardt(p, data, settings, free, center)
    if not multi_node:
        p[_AN] = max(p[_AN], p[_AR] * settings.prior_inter)
        p[_BN] = max(p[_BN], p[_BR] * settings.prior_inter)
    return PerfParams(*p)


def _to_vars(p: list[float], free: list[int]) -> list[float]:
    return [p[i] if i == _G else detmath.log_scalar(p[i]) for i in free]


def _from_vars(p: list[float], x: list[float], free: list[int]) -> list[float]:
    out = list(p)
    for v, i in zip(x, free, strict=True):
        out[i] = v if i == _G else detmath.exp_scalar(v)
    return out


def _levenberg_marquardt(
    p: list[float], data: _Data, settings: FitSettings, free: list[int], center: list[float]
) -> list[float]:
    """Minimize the loss over the free variables from ``p``; returns the parameters."""
    lo = [1.0 if i == _G else _LOG_LOWER for i in free]
    hi = [GAMMA_MAX if i == _G else math.inf for i in free]
    x = [min(max(v, a), b) for v, a, b in zip(_to_vars(p, free), lo, hi, strict=True)]
    p = _from_vars(p, x, free)
    ev = _evaluate(p, data, settings, free, center)
    # Damping mu and its growth nu follow Nielsen's rule on the gain ratio (actual over
    # predicted decrease), which stops the zigzag of a fixed schedule in narrow valleys.
    mu, nu = 1e-3, 2.0
    system: tuple[list[list[float]], list[float]] | None = None
    for _ in range(settings.max_iterations):
        # A rejected step leaves ``ev`` as it was: its normal equations too.
        if system is None:
            system = _normal_equations(ev)
        jtj, jtr = system
        # Variables at a bound that the gradient pushes outwards stay there this step.
        active = [
            c
            for c in range(len(free))
            if not ((x[c] <= lo[c] and jtr[c] > 0) or (x[c] >= hi[c] and jtr[c] < 0))
        ]
        if not active:
            break
        a = [[jtj[i][j] + (mu * jtj[i][i] if i == j else 0.0) for j in active] for i in active]
        step = detmath.solve_spd(a, [-jtr[i] for i in active])
        if step is None:
            mu, nu = mu * nu, nu * 2.0
            continue
        trial = list(x)
        delta = [0.0] * len(free)
        clipped = False
        # A trust region of e^2 per variable and step keeps a step taken on a nearly
        # flat model from overflowing the times.
        for c, d in zip(active, step, strict=True):
            trial[c] = min(max(x[c] + min(max(d, -_MAX_STEP), _MAX_STEP), lo[c]), hi[c])
            delta[c] = trial[c] - x[c]
            clipped = clipped or delta[c] != d
        # Decrease the Gauss-Newton model predicts for the step taken: -(2 d.g + d.A.d).
        predicted = 0.0
        for i in active:
            quad = 0.0
            for j in active:
                quad += jtj[i][j] * delta[j]
            predicted -= delta[i] * (2.0 * jtr[i] + quad)
        if not predicted > 1e-14 * ev.loss:
            if not clipped:
                break  # converged: no step the model trusts lowers the loss
            mu, nu = mu * nu, nu * 2.0
            continue
        p_trial = _from_vars(p, trial, free)
        ev_trial = _evaluate(p_trial, data, settings, free, center)
        rho = (ev.loss - ev_trial.loss) / predicted
        if rho > 0.0:
            x, p, ev = trial, p_trial, ev_trial
            system = None
            t = 2.0 * rho - 1.0
            mu *= max(1.0 / 3.0, 1.0 - t * t * t)
            nu = 2.0
        else:
            mu, nu = mu * nu, nu * 2.0
    return p
