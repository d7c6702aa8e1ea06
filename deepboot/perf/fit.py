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
    """The objective at one point, and what its Jacobian is built from.

    The objective (``loss``) is e1 + e2 + sum(regs * regs): e1 and e2 are the mean
    squared log errors of compute and step time, ``regs`` the regularizer residuals.
    The other fields are intermediate values :meth:`_Problem.normal_equations` reuses
    (an accepted step needs its Jacobian; computing it only then saves the work for
    the rare rejected evaluation).
    """

    p: list[float]
    loss: float
    regs: list[float]
    r12: FloatArray
    """(2P,) log errors of compute time, then of step time."""
    t_grad: FloatArray
    bm: FloatArray
    """(P,) beta_c * m."""
    sync: tuple[FloatArray, ...]
    """(t_sync, log_grad at the sync points, log t_sync, pred, w_grad, w_sync), or ()."""


class _Problem:
    """One fit's data, weights and free variables: everything constant across the
    solver's evaluations, precomputed once so that each evaluation is a short, fixed
    sequence of elementwise NumPy operations.

    Variables are log(p_i) for the six positive parameters and gamma itself; ``center``
    holds the ridge's centre in the same variables. Every result is the same bits as
    the straightforward formulation (``docs/perf.md``): each quantity is computed with
    the same IEEE operations in the same order, only fewer NumPy calls carry them.
    """

    __slots__ = (
        "data", "settings", "free", "center", "positive", "n_pts", "n_sync", "w",
        "sg", "sr", "sk", "log_obs", "intra", "coef_rows", "retro_rows", "log_buf",
        "jac_template", "cols", "free_rows", "step_rows",
    )  # fmt: skip

    def __init__(
        self, data: _Data, settings: FitSettings, free: list[int], center: list[float]
    ) -> None:
        self.data = data
        self.settings = settings
        self.free = free
        self.center = center
        self.positive = [i for i in free if i != _G]
        n_pts = self.n_pts = data.m.size
        n_sync = self.n_sync = data.sync.size
        self.w = math.sqrt(1.0 / n_pts)
        self.sg = math.sqrt(settings.reg_gamma)
        self.sr = math.sqrt(settings.reg_retro)
        self.sk = math.sqrt(settings.ridge)
        self.log_obs = np.concatenate((data.log_comp, data.log_step))
        self.step_rows = n_pts + data.sync  # the sync points' rows among the 2P residuals
        self.intra = 1.0 - data.inter
        # Rows alpha_n, beta_n, alpha_r, beta_r of the sync Jacobian are
        # ((w_sync / t_sync) * kind) * param [* retro]: kind and retro as (4, S) rows,
        # with 1.0 where the reference formula has no factor (x * 1.0 == x exactly).
        self.coef_rows = np.stack((data.inter, data.inter, self.intra, self.intra))
        ones = np.ones(n_sync)
        self.retro_rows = np.stack((ones, data.retro, ones, data.retro))
        # One buffer for every logarithm an evaluation takes at once: T_grad (P),
        # T_sync (S) and the free positive parameters (the ridge).
        self.log_buf = np.empty(n_pts + n_sync + len(self.positive))
        q = len(free)
        self.cols = {i: c for c, i in enumerate(free)}
        self.free_rows = np.array(free, dtype=np.intp)
        # The Jacobian (2P + regs, q): compute-time rows, step-time rows, regularizer
        # rows; the regularizers' constant entries are set once here.
        jac = np.zeros((2 * n_pts + 3 + len(self.positive), q))
        if _G in self.cols:
            jac[2 * n_pts, self.cols[_G]] = self.sg
        for row, i in enumerate(self.positive):
            jac[2 * n_pts + 3 + row, self.cols[i]] = self.sk
        self.jac_template = jac

    def evaluate(self, p: list[float]) -> _Eval:
        """The objective at parameters ``p`` (all seven, in parameter order)."""
        ac, bc, an, bn, ar, br, g = p
        data = self.data
        n_pts, n_sync = self.n_pts, self.n_sync
        buf = self.log_buf
        bm = bc * data.m
        t_grad = ac + bm
        buf[:n_pts] = t_grad
        end = n_pts + n_sync
        retro = data.retro
        if n_sync:
            t_sync = data.inter * (an + bn * retro) + self.intra * (ar + br * retro)
            buf[n_pts:end] = t_sync
        buf[end:] = [p[i] for i in self.positive]
        logs = detmath.log(buf)
        log_grad = logs[:n_pts]
        pred_all = np.concatenate((log_grad, log_grad))
        sync: tuple[FloatArray, ...] = ()
        if n_sync:
            s = data.sync
            lg = log_grad[s]
            ls = logs[n_pts:end]
            u = g * lg
            v = g * ls
            # log(T_grad^g + T_sync^g) = max + log(1 + exp(-|u - v|)).
            e = detmath.exp(-np.abs(u - v))
            one_e = 1.0 + e
            pred = (np.maximum(u, v) + detmath.log(one_e)) / g
            pred_all[self.step_rows] = pred
            big, small = 1.0 / one_e, e / one_e
            first = u >= v
            w_grad = np.where(first, big, small)
            w_sync = np.where(first, small, big)
            sync = (t_sync, lg, ls, pred, w_grad, w_sync)
        r12 = pred_all - self.log_obs
        sq = r12 * r12
        e1 = float(sq[:n_pts].sum()) / n_pts
        e2 = float(sq[n_pts:].sum()) / n_pts
        sr, sk, center = self.sr, self.sk, self.center
        regs = [self.sg * (g - 1.0), sr * (bn / an), sr * (br / ar)]
        for i, lp in zip(self.positive, logs[end:].tolist(), strict=True):
            regs.append(sk * (lp - center[i]))
        loss = e1 + e2 + _numpy_sum([r * r for r in regs])
        return _Eval(p, loss, regs, r12, t_grad, bm, sync)

    def jacobian(self, ev: _Eval) -> FloatArray:
        """(2P + regs, q) Jacobian of the residuals (log errors weighted sqrt(1 / P),
        then the regularizers) over the free variables, C-contiguous."""
        ac, bc, an, bn, ar, br, g = ev.p
        n_pts, w, cols = self.n_pts, self.w, self.cols
        t_grad = ev.t_grad
        # d log T / d variable, per point, for all 7 variables.
        d_pred = np.zeros((7, n_pts))
        np.divide(ac, t_grad, out=d_pred[_AC])
        np.divide(ev.bm, t_grad, out=d_pred[_BC])
        jac = self.jac_template.copy()
        for i in (_AC, _BC):
            if i in cols:
                jac[:n_pts, cols[i]] = w * d_pred[i]
        if ev.sync:
            t_sync, lg, ls, pred, w_grad, w_sync = ev.sync
            s = self.data.sync
            d_pred[:2, s] = w_grad * d_pred[:2, s]
            params = np.array([[an], [bn], [ar], [br]])
            block = ((w_sync / t_sync) * self.coef_rows) * params * self.retro_rows
            d_pred[_AN : _BR + 1, s] = block
            d_pred[_G, s] = (w_grad * lg + w_sync * ls - pred) / g
        rows = d_pred if len(cols) == 7 else d_pred[self.free_rows]
        np.multiply(w, rows.T, out=jac[n_pts : 2 * n_pts])
        sr = self.sr
        ratio_n, ratio_r = bn / an, br / ar
        base = 2 * n_pts
        for i, row, value in (
            (_BN, 1, sr * ratio_n),
            (_AN, 1, -sr * ratio_n),
            (_BR, 2, sr * ratio_r),
            (_AR, 2, -sr * ratio_r),
        ):
            if i in cols:
                jac[base + row, cols[i]] = value
        return jac

    def residuals(self, ev: _Eval) -> FloatArray:
        """(2P + regs,) residuals, in the Jacobian's row order and weighting."""
        return np.concatenate((self.w * ev.r12, ev.regs))

    def normal_equations(self, ev: _Eval) -> tuple[list[list[float]], list[float]]:
        """Gauss-Newton Hessian and gradient of the objective at ``ev``, halved.

        The objective is a sum of squares, so these are J^T J and J^T r over all
        residuals. The sums reduce over the leading (row) axis of a C-contiguous
        array, which NumPy does one row after another from 0.0, in row order, on every
        machine (no BLAS, no pairwise split).

        Returns:
            ``(J^T J, J^T r)`` over the free variables, as Python floats.
        """
        jac = self.jacobian(ev)
        r = self.residuals(ev)
        jtj = (jac[:, :, None] * jac[:, None, :]).sum(axis=0)
        jtr = (jac * r[:, None]).sum(axis=0)
        return jtj.tolist(), jtr.tolist()


def _numpy_sum(values: list[float]) -> float:
    """``float(np.sum(np.array(values)))`` without building an array: the same bits.

    NumPy adds a contiguous float64 vector to its identity 0.0 by pairwise summation:
    below 8 elements one left-to-right sum; up to 128, eight interleaved partial sums
    combined as ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)), then the tail.
    Longer inputs are left to NumPy itself.
    """
    n = len(values)
    if n > 128:
        return float(np.sum(np.array(values)))
    if n < 8:
        acc = -0.0
        for v in values:
            acc += v
        return 0.0 + acc
    r = values[:8]
    stop = n - n % 8
    for i in range(8, stop, 8):
        for j in range(8):
            r[j] += values[i + j]
    acc = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    for i in range(stop, n):
        acc += values[i]
    return 0.0 + acc


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
    p = _levenberg_marquardt(setup.p, _Problem(setup.data, settings, setup.free, setup.center))
    return _with_prior(p, setup.multi_node, settings)


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


def _to_vars(p: list[float], free: list[int]) -> list[float]:
    return [p[i] if i == _G else detmath.log_scalar(p[i]) for i in free]


def _from_vars(p: list[float], x: list[float], free: list[int]) -> list[float]:
    out = list(p)
    for v, i in zip(x, free, strict=True):
        out[i] = v if i == _G else detmath.exp_scalar(v)
    return out


def _levenberg_marquardt(p: list[float], prob: _Problem) -> list[float]:
    """Minimize the loss over the free variables from ``p``; returns the parameters.

    One iteration: solve (J^T J + mu diag(J^T J)) d = -J^T r over the variables not
    held at a bound, clip the step to the trust region and the bounds, and take it if
    the loss falls. The damping mu and its growth nu follow Nielsen's rule on the gain
    ratio (actual over predicted decrease), which stops the zigzag of a fixed schedule
    in narrow valleys.

    Between two accepted steps the normal equations do not change and every rejected
    try only multiplies mu by nu and doubles nu, so the damping of all the tries left
    is known in advance. The first try on new equations is made in Python floats (it is
    usually accepted); after a rejection, :func:`_tries` makes all the remaining tries
    at once, one NumPy operation per scalar operation of the loop it replaces (the
    same IEEE operations in the same order, so the same bits), and the loop picks the
    first try that ends the search or needs the objective. At convergence mu grows
    until the step underflows, some 45 tries: batching them is most of the speed-up.
    """
    free = prob.free
    nf = len(free)
    free_range = range(nf)
    lo = [1.0 if i == _G else _LOG_LOWER for i in free]
    hi = [GAMMA_MAX if i == _G else math.inf for i in free]
    x = [min(max(v, a), b) for v, a, b in zip(_to_vars(p, free), lo, hi, strict=True)]
    p = _from_vars(p, x, free)
    ev = prob.evaluate(p)
    mu, nu = 1e-3, 2.0
    left = prob.settings.max_iterations
    while left > 0:
        jtj, jtr = prob.normal_equations(ev)
        # Variables at a bound that the gradient pushes outwards stay there this step.
        active = [
            c
            for c in free_range
            if not ((x[c] <= lo[c] and jtr[c] > 0) or (x[c] >= hi[c] and jtr[c] < 0))
        ]
        if not active:
            break
        threshold = 1e-14 * ev.loss
        # The first try, in Python floats.
        left -= 1
        a = [[jtj[i][j] + (mu * jtj[i][i] if i == j else 0.0) for j in active] for i in active]
        step = detmath.solve_spd(a, [-jtr[i] for i in active])
        predicted = 0.0
        clipped = False
        trial = x
        if step is not None:
            trial = list(x)
            delta = [0.0] * nf
            # A trust region of e^2 per variable and step keeps a step taken on a nearly
            # flat model from overflowing the times.
            for c, d in zip(active, step, strict=True):
                trial[c] = min(max(x[c] + min(max(d, -_MAX_STEP), _MAX_STEP), lo[c]), hi[c])
                delta[c] = trial[c] - x[c]
                clipped = clipped or delta[c] != d
            # Decrease the Gauss-Newton model predicts for the step taken:
            # -(2 d.g + d.A.d).
            for i in active:
                quad = 0.0
                row = jtj[i]
                for j in active:
                    quad += row[j] * delta[j]
                predicted -= delta[i] * (2.0 * jtr[i] + quad)
            if not predicted > threshold and not clipped:
                break  # converged: no step the model trusts lowers the loss
        if step is not None and predicted > threshold:
            accepted = _take(prob, p, x, trial, ev, predicted, free)
            if accepted is not None:
                x, p, ev, rho = accepted
                t = 2.0 * rho - 1.0
                mu *= max(1.0 / 3.0, 1.0 - t * t * t)
                nu = 2.0
                continue
        mu, nu = mu * nu, nu * 2.0
        if left == 0:
            break
        # Every further try on these equations, at once.
        mus = [mu]
        for _ in range(left - 1):
            mu, nu = mu * nu, nu * 2.0
            mus.append(mu)
        mu, nu = mu * nu, nu * 2.0  # after the last try, should all be rejected
        ok, trials, preds, clips = _tries(jtj, jtr, active, x, lo, hi, mus)
        moved = False
        for k in np.flatnonzero(ok & ((preds > threshold) | ~clips)).tolist():
            pk = float(preds[k])
            if not pk > threshold:
                return p  # converged (not clipped): as the first try's break
            cand = list(x)
            for c, v in zip(active, trials[:, k].tolist(), strict=True):
                cand[c] = v
            accepted = _take(prob, p, x, cand, ev, pk, free)
            if accepted is not None:
                x, p, ev, rho = accepted
                left -= k + 1
                mu, nu = mus[k], 2.0
                t = 2.0 * rho - 1.0
                mu *= max(1.0 / 3.0, 1.0 - t * t * t)
                moved = True
                break
        if not moved:
            break  # every remaining try was rejected: the iteration budget is spent
    return p


def _take(
    prob: _Problem,
    p: list[float],
    x: list[float],
    trial: list[float],
    ev: _Eval,
    predicted: float,
    free: list[int],
) -> tuple[list[float], list[float], _Eval, float] | None:
    """Evaluate a step the model predicts to lower the loss; the new state and the
    gain ratio if it does, else None."""
    p_trial = _from_vars(p, trial, free)
    ev_trial = prob.evaluate(p_trial)
    rho = (ev.loss - ev_trial.loss) / predicted
    if rho > 0.0:
        return trial, p_trial, ev_trial, rho
    return None


def _tries(
    jtj: list[list[float]],
    jtr: list[float],
    active: list[int],
    x: list[float],
    lo: list[float],
    hi: list[float],
    mus: list[float],
) -> tuple[npt.NDArray[np.bool_], FloatArray, FloatArray, npt.NDArray[np.bool_]]:
    """The Levenberg-Marquardt tries at each damping in ``mus`` on fixed equations.

    Column k is what one iteration of the scalar loop computes at ``mus[k]``, with the
    same IEEE operations in the same order (so the same bits): the damped system, its
    Cholesky solve (:func:`detmath.solve_spd_batch`), the step clipped to the trust
    region and the bounds, and the decrease the model predicts.

    Returns:
        ``(ok, trials, predicted, clipped)``: ``ok[k]`` false where the damped system
        is not positive definite (the scalar solve returns None; the other values of
        that column are then meaningless), ``trials`` (len(active), K) the clipped
        variables, ``predicted`` (K,) and ``clipped`` (K,).
    """
    n = len(active)
    mu = np.array(mus)
    sub = np.array([[jtj[i][j] for j in active] for i in active])
    a = np.empty((n, n, mu.size))
    # Off the diagonal jtj + 0.0, as the scalar loop adds (it turns -0.0 into 0.0).
    a[:] = (sub + 0.0)[:, :, None]
    g = np.array([jtr[i] for i in active])
    with np.errstate(all="ignore"):  # mu overflows to inf in the last tries, as in floats
        for r in range(n):
            d = sub[r, r]
            a[r, r] = d + mu * d
        ok, step = detmath.solve_spd_batch(a, (-g).tolist())
        xa = np.array([x[c] for c in active])[:, None]
        lo_a = np.array([lo[c] for c in active])[:, None]
        hi_a = np.array([hi[c] for c in active])[:, None]
        clip = np.minimum(np.maximum(step, -_MAX_STEP), _MAX_STEP)
        trials = np.minimum(np.maximum(xa + clip, lo_a), hi_a)
        delta = trials - xa
        clipped = (delta != step).any(axis=0)
        quad = np.zeros_like(delta)
        for j in range(n):
            quad += sub[:, j : j + 1] * delta[j]
        terms = delta * (2.0 * g[:, None] + quad)
        predicted = np.zeros(mu.size)
        for i in range(n):
            predicted -= terms[i]
    return ok, trials, predicted, clipped
