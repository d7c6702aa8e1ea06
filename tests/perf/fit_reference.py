"""The throughput fit as it was before the speed-ups (commit 76bf8f8), kept as the
specification its faster forms must match bit for bit (tests/perf/test_fit_equivalence.py):
the batched NumPy solver of commits f1b3208-55d9045, then the compiled kernel
(deepboot/perf/_fitkernel.py) that replaced it.

The straightforward formulation: one NumPy call per quantity, a scalar
Levenberg-Marquardt loop that makes every try one at a time. Test code only.
"""

# ruff: noqa
# mypy: ignore-errors
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from deepboot.core.params import PerfParams
from deepboot.perf import detmath
from deepboot.perf.fit import (
    DEFAULT_SETTINGS,
    GAMMA_MAX,
    LOWER,
    FitSettings,
    _Data,
    _prepare,
    _with_prior,
)

FloatArray: TypeAlias = npt.NDArray[np.float64]
_LOG_LOWER = detmath.log_scalar(LOWER)
_AC, _BC, _AN, _BN, _AR, _BR, _G = range(7)
_MAX_STEP = 2.0


def _to_vars(p: list[float], free: list[int]) -> list[float]:
    return [p[i] if i == _G else detmath.log_scalar(p[i]) for i in free]


def _from_vars(p: list[float], x: list[float], free: list[int]) -> list[float]:
    out = list(p)
    for v, i in zip(x, free, strict=True):
        out[i] = v if i == _G else detmath.exp_scalar(v)
    return out


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


def reference_fit_perf_params(
    *points: npt.ArrayLike,
    settings: FitSettings = DEFAULT_SETTINGS,
    start: PerfParams | None = None,
) -> PerfParams:
    """fit_perf_params(*points, ...) with the reference solver (the setup and the prior
    are shared: the speed-up did not change them)."""
    setup = _prepare(*points, start)
    p = _levenberg_marquardt(list(setup.p), setup.data, settings, setup.free, setup.center)
    return _with_prior(p, setup.multi_node, settings)


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
