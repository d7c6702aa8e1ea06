"""The throughput fit's solver, compiled with numba (issue 10: the fit was ~half a run).

:func:`levenberg_marquardt` is the Levenberg-Marquardt loop of
:func:`deepboot.perf.fit.fit_perf_params` with its evaluations, normal equations and
Cholesky solves, in one compiled function. It performs the IEEE operations of the
NumPy formulation it replaced (``tests/perf/fit_reference.py`` keeps that
formulation as the specification; ``tests/perf/test_fit_equivalence.py`` compares the
two bit for bit), in the same order, so the result has the same bits on every machine:

* ``exp`` and ``log`` are :mod:`deepboot.perf.detmath`'s fdlibm kernels on scalars
  (``+ - * /``, ``frexp``, ``ldexp``, ``rint``: exact in IEEE 754): ``log_scalar``
  compiled as it is, ``exp_scalar`` written out again (:func:`_exp`); never
  ``math.exp`` / ``np.exp``, which call a CPU-dependent libm or SIMD kernel;
* sums run in NumPy's order: a 1-D ``np.sum`` is NumPy's pairwise summation
  (:func:`_np_sum`), a sum over the rows of the Jacobian goes row by row from 0.0;
* no fast-math (no reassociation, no reciprocal tricks, no FMA contraction), and
  ``error_model="numpy"`` (a division by zero gives inf/nan as NumPy does, instead of
  raising; the fit never divides by zero, so this only removes a check);
* the code is generated for a **generic x86-64 CPU** (``NUMBA_CPU_NAME=generic``, no
  extra CPU features), set below before numba is imported: with the host's name LLVM
  may use FMA and AVX instructions, and a fused multiply-add rounds once where the
  NumPy code rounds twice. The generic target has no FMA, so no contraction is
  possible whatever LLVM decides. Setting ``NUMBA_CPU_NAME`` in the environment
  overrides this, for testing only: ``tests/perf/test_fit_equivalence.py`` checks that
  code compiled for this machine's CPU (with FMA and AVX-512 here) gives the same bits,
  and that the kernel runs on the generic target otherwise.

``cache=True`` keeps the machine code between processes (compiling takes 8-15 s on
a loaded 2-core machine, once). numba writes it to ``__pycache__`` beside this file,
or, where that is not writable (a read-only site-packages), to the user's cache
directory (``~/.cache/numba``, or ``NUMBA_CACHE_DIR`` if set); where neither is
writable the kernel is compiled in every process instead.

Parameter order everywhere: alpha_c, beta_c, alpha_n, beta_n, alpha_r, beta_r, gamma.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar, cast

# Must precede the first import of numba (it reads its configuration then).
os.environ.setdefault("NUMBA_CPU_NAME", "generic")
if os.environ["NUMBA_CPU_NAME"] == "generic":
    os.environ.setdefault("NUMBA_CPU_FEATURES", "")

import numba  # noqa: E402
import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402

from deepboot.perf import detmath  # noqa: E402
from deepboot.perf.detmath import (  # noqa: E402
    _P1,
    _P2,
    _P3,
    _P4,
    _P5,
    EXP_OVERFLOW,
    EXP_UNDERFLOW,
    INV_LN2,
    LN2_HI,
    LN2_LO,
)

_config: Any = numba.config
if _config.CPU_NAME is None:  # numba was imported before this module, without the variable
    _config.CPU_NAME = "generic"
    _config.CPU_FEATURES = ""

FloatArray: TypeAlias = npt.NDArray[np.float64]
IntArray: TypeAlias = npt.NDArray[np.int64]

_AC, _BC, _AN, _BN, _AR, _BR, _G = range(7)
_MAX_STEP = 2.0
_INF = math.inf
_F = TypeVar("_F", bound=Callable[..., Any])


def _jit(fn: _F) -> _F:
    """numba.njit without fast-math, with NumPy's error model, cached where possible."""
    try:
        out = numba.njit(cache=True, fastmath=False, error_model="numpy", nogil=True)(fn)
    except RuntimeError:  # no writable cache directory: compile in each process
        out = numba.njit(cache=False, fastmath=False, error_model="numpy", nogil=True)(fn)
    return cast(_F, out)


@_jit
def _pmax(a: float, b: float) -> float:
    """Python's ``max(a, b)`` (the first argument unless the second is greater)."""
    return b if b > a else a


@_jit
def _pmin(a: float, b: float) -> float:
    """Python's ``min(a, b)``."""
    return b if b < a else a


@_jit
def _exp(x: float) -> float:
    """:func:`deepboot.perf.detmath.exp_scalar`, operation for operation."""
    if not math.isfinite(x):
        if x > 0:
            return _INF
        return 0.0 if x < 0 else x
    if x > EXP_OVERFLOW:
        return _INF
    if x < EXP_UNDERFLOW:
        return 0.0
    k = float(np.rint(x * INV_LN2))  # round half to even, as Python's round
    hi = x - k * LN2_HI
    lo = k * LN2_LO
    r = hi - lo
    t = r * r
    c = r - t * (_P1 + t * (_P2 + t * (_P3 + t * (_P4 + t * _P5))))
    y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi)
    return math.ldexp(y, int(k))


# detmath's scalar log is plain arithmetic on floats: numba compiles it as it is.
# (Its exp_scalar is not: Python's round and OverflowError, hence _exp above.)
_log = _jit(detmath.log_scalar)


@_jit
def _pairwise_block(a: FloatArray, start: int, n: int) -> float:
    """NumPy's ``pairwise_sum`` of ``a[start:start + n]`` for n <= 128
    (numpy/_core/src/umath/loops_utils.h): below 8 elements one sum from -0.0, else
    eight interleaved partial sums combined as ((r0 + r1) + (r2 + r3)) +
    ((r4 + r5) + (r6 + r7)), then the tail."""
    if n < 8:
        res = -0.0
        for i in range(start, start + n):
            res += a[i]
        return res
    r0 = a[start]
    r1 = a[start + 1]
    r2 = a[start + 2]
    r3 = a[start + 3]
    r4 = a[start + 4]
    r5 = a[start + 5]
    r6 = a[start + 6]
    r7 = a[start + 7]
    stop = n - n % 8
    for i in range(start + 8, start + stop, 8):
        r0 += a[i]
        r1 += a[i + 1]
        r2 += a[i + 2]
        r3 += a[i + 3]
        r4 += a[i + 4]
        r5 += a[i + 5]
        r6 += a[i + 6]
        r7 += a[i + 7]
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for i in range(start + stop, start + n):
        res += a[i]
    return float(res)


@_jit
def _pairwise(a: FloatArray, start: int, n: int) -> float:
    """NumPy's ``pairwise_sum`` of ``a[start:start + n]``: above 128 elements, the sum
    of the two halves' sums (the first half a multiple of 8 long), recursively.

    The recursion is unrolled onto explicit stacks (numba's cache does not reload
    recursive functions reliably): a task is a segment to sum (pushed as its value)
    or, with n == -1, the addition of the two values on top, left + right.
    """
    if n <= 128:
        return _pairwise_block(a, start, n)
    task_start = np.empty(128, dtype=np.int64)
    task_n = np.empty(128, dtype=np.int64)
    values = np.empty(128)
    tasks = 1
    task_start[0] = start
    task_n[0] = n
    top = 0
    while tasks:
        tasks -= 1
        s = task_start[tasks]
        k = task_n[tasks]
        if k == -1:
            top -= 1
            values[top - 1] = values[top - 1] + values[top]
        elif k <= 128:
            values[top] = _pairwise_block(a, s, k)
            top += 1
        else:
            k2 = k // 2
            k2 -= k2 % 8
            # Run last: the addition; before it the right half; first the left half.
            task_n[tasks] = -1
            task_start[tasks + 1] = s + k2
            task_n[tasks + 1] = k - k2
            task_start[tasks + 2] = s
            task_n[tasks + 2] = k2
            tasks += 3
    return float(values[0])


@_jit
def _np_sum(a: FloatArray, start: int, n: int) -> float:
    """``float(np.sum(a[start:start + n]))`` for a contiguous float64 ``a``: NumPy
    adds the pairwise sum to the reduction's initial value 0.0."""
    return 0.0 + _pairwise(a, start, n)


@_jit
def _evaluate(
    p: FloatArray,
    m: FloatArray,
    log_obs: FloatArray,
    sync: IntArray,
    inter: FloatArray,
    intra: FloatArray,
    retro: FloatArray,
    positive: IntArray,
    center: FloatArray,
    sg: float,
    sr: float,
    sk: float,
    ev: FloatArray,
    sq: FloatArray,
) -> float:
    """The objective at ``p``; fills ``ev`` with what the Jacobian is built from.

    ``ev`` rows: 0 beta_c * m, 1 T_grad, 2 log T_grad (P each); 3 T_sync, 4 log T_sync,
    5 the predicted log step time, 6 w_grad, 7 w_sync (S each, first S entries);
    8 the 2P log errors; 9 the regularizer residuals (first 3 + len(positive)).
    """
    ac, bc, an, bn, ar, br, g = p[0], p[1], p[2], p[3], p[4], p[5], p[6]
    n_pts = m.size
    n_sync = sync.size
    bm, tg, lgr = ev[0], ev[1], ev[2]
    ts, lsy, pred, wg, ws = ev[3], ev[4], ev[5], ev[6], ev[7]
    r12, regs = ev[8], ev[9]
    for i in range(n_pts):
        bm[i] = bc * m[i]
        tg[i] = ac + bm[i]
        lgr[i] = _log(tg[i])
    for i in range(n_pts):
        r12[i] = lgr[i] - log_obs[i]
        r12[n_pts + i] = lgr[i] - log_obs[n_pts + i]
    for j in range(n_sync):
        ts[j] = inter[j] * (an + bn * retro[j]) + intra[j] * (ar + br * retro[j])
        lsy[j] = _log(ts[j])
        s = sync[j]
        u = g * lgr[s]
        v = g * lsy[j]
        # log(T_grad^g + T_sync^g) = max + log(1 + exp(-|u - v|)).
        e = _exp(-abs(u - v))
        one_e = 1.0 + e
        top = u if (u >= v or math.isnan(u)) else v  # np.maximum
        pred[j] = (top + _log(one_e)) / g
        r12[n_pts + s] = pred[j] - log_obs[n_pts + s]
        big = 1.0 / one_e
        small = e / one_e
        if u >= v:
            wg[j] = big
            ws[j] = small
        else:
            wg[j] = small
            ws[j] = big
    for i in range(2 * n_pts):
        sq[i] = r12[i] * r12[i]
    e1 = _np_sum(sq, 0, n_pts) / n_pts
    e2 = _np_sum(sq, n_pts, n_pts) / n_pts
    regs[0] = sg * (g - 1.0)
    regs[1] = sr * (bn / an)
    regs[2] = sr * (br / ar)
    for row in range(positive.size):
        i = positive[row]
        regs[3 + row] = sk * (_log(p[i]) - center[i])
    n_regs = 3 + positive.size
    for row in range(n_regs):
        sq[row] = regs[row] * regs[row]
    return e1 + e2 + _np_sum(sq, 0, n_regs)


@_jit
def _jacobian(
    p: FloatArray,
    m: FloatArray,
    sync: IntArray,
    inter: FloatArray,
    intra: FloatArray,
    retro: FloatArray,
    free: IntArray,
    positive: IntArray,
    sg: float,
    sr: float,
    sk: float,
    ev: FloatArray,
    jac: FloatArray,
    res: FloatArray,
) -> None:
    """The (2P + 3 + len(positive), q) Jacobian of the residuals over the free
    variables into ``jac`` and the residuals into ``res`` (the data residuals weighted
    sqrt(1 / P), then the regularizers)."""
    ac, an, bn, ar, br, g = p[0], p[2], p[3], p[4], p[5], p[6]
    n_pts = m.size
    n_sync = sync.size
    w = math.sqrt(1.0 / n_pts)
    bm, tg, lgr = ev[0], ev[1], ev[2]
    ts, lsy, pred, wg, ws = ev[3], ev[4], ev[5], ev[6], ev[7]
    r12, regs = ev[8], ev[9]
    jac[:] = 0.0
    # d log T / d parameter, per point, for all 7 parameters.
    d = np.zeros((7, n_pts))
    for i in range(n_pts):
        d[_AC, i] = ac / tg[i]
        d[_BC, i] = bm[i] / tg[i]
    for c in range(free.size):
        if free[c] < 2:
            for i in range(n_pts):
                jac[i, c] = w * d[free[c], i]
    for j in range(n_sync):
        s = sync[j]
        d[_AC, s] = wg[j] * d[_AC, s]
        d[_BC, s] = wg[j] * d[_BC, s]
        q = ws[j] / ts[j]
        d[_AN, s] = ((q * inter[j]) * an) * 1.0
        d[_BN, s] = ((q * inter[j]) * bn) * retro[j]
        d[_AR, s] = ((q * intra[j]) * ar) * 1.0
        d[_BR, s] = ((q * intra[j]) * br) * retro[j]
        d[_G, s] = (wg[j] * lgr[s] + ws[j] * lsy[j] - pred[j]) / g
    for c in range(free.size):
        for i in range(n_pts):
            jac[n_pts + i, c] = w * d[free[c], i]
    base = 2 * n_pts
    ratio_n = bn / an
    ratio_r = br / ar
    for c in range(free.size):
        i = free[c]
        if i == _G:
            jac[base, c] = sg
        elif i == _BN:
            jac[base + 1, c] = sr * ratio_n
        elif i == _AN:
            jac[base + 1, c] = -sr * ratio_n
        elif i == _BR:
            jac[base + 2, c] = sr * ratio_r
        elif i == _AR:
            jac[base + 2, c] = -sr * ratio_r
    for row in range(positive.size):
        for c in range(free.size):
            if free[c] == positive[row]:
                jac[base + 3 + row, c] = sk
    for i in range(base):
        res[i] = w * r12[i]
    for row in range(3 + positive.size):
        res[base + row] = regs[row]


@_jit
def _solve_spd(a: FloatArray, b: FloatArray, n: int, low: FloatArray, x: FloatArray) -> bool:
    """:func:`deepboot.perf.detmath.solve_spd` on ``a[:n, :n]``, ``b[:n]`` into
    ``x[:n]``, operation for operation; False where ``a`` is not positive definite."""
    for i in range(n):
        for j in range(i + 1):
            acc = a[i, j]
            for k in range(j):
                acc -= low[i, k] * low[j, k]
            if i == j:
                if not acc > 0.0:
                    return False
                low[i, i] = math.sqrt(acc)
            else:
                low[i, j] = acc / low[j, j]
    y = np.empty(n)
    for i in range(n):
        acc = b[i]
        for k in range(i):
            acc -= low[i, k] * y[k]
        y[i] = acc / low[i, i]
    for i in range(n - 1, -1, -1):
        acc = y[i]
        for k in range(i + 1, n):
            acc -= low[k, i] * x[k]
        x[i] = acc / low[i, i]
    return True


@_jit
def _normal_equations(jac: FloatArray, res: FloatArray, jtj: FloatArray, jtr: FloatArray) -> None:
    """J^T J and J^T r, each entry summed over the rows in order from 0.0 (what NumPy's
    ``sum(axis=0)`` over a C-contiguous (rows, ...) array does)."""
    q = jac.shape[1]
    jtj[:] = 0.0
    jtr[:] = 0.0
    for row in range(jac.shape[0]):
        for a in range(q):
            ja = jac[row, a]
            for b in range(q):
                jtj[a, b] += ja * jac[row, b]
            jtr[a] += ja * res[row]


@_jit
def _from_vars(p: FloatArray, x: FloatArray, free: IntArray, out: FloatArray) -> None:
    out[:] = p
    for c in range(free.size):
        out[free[c]] = x[c] if free[c] == _G else _exp(x[c])


@_jit
def _lm(
    p0: FloatArray,
    m: FloatArray,
    log_obs: FloatArray,
    sync: IntArray,
    inter: FloatArray,
    retro: FloatArray,
    free: IntArray,
    center: FloatArray,
    sg: float,
    sr: float,
    sk: float,
    max_iterations: int,
    log_lower: float,
    gamma_max: float,
) -> FloatArray:
    """The Levenberg-Marquardt loop (:func:`levenberg_marquardt` has the contract)."""
    n_pts = m.size
    q = free.size
    intra = 1.0 - inter
    n_pos = 0
    for c in range(q):
        if free[c] != _G:
            n_pos += 1
    positive = np.empty(n_pos, dtype=np.int64)
    n_pos = 0
    for c in range(q):
        if free[c] != _G:
            positive[n_pos] = free[c]
            n_pos += 1
    lo = np.empty(q)
    hi = np.empty(q)
    x = np.empty(q)
    for c in range(q):
        i = free[c]
        lo[c] = 1.0 if i == _G else log_lower
        hi[c] = gamma_max if i == _G else _INF
        v = p0[i] if i == _G else _log(p0[i])
        x[c] = _pmin(_pmax(v, lo[c]), hi[c])
    p = np.empty(7)
    _from_vars(p0, x, free, p)
    width = max(2 * n_pts, 3 + n_pos)
    ev = np.zeros((10, width))
    ev_trial = np.zeros((10, width))
    sq = np.empty(max(2 * n_pts, 3 + n_pos))
    loss = _evaluate(p, m, log_obs, sync, inter, intra, retro, positive, center, sg, sr, sk, ev, sq)
    jac = np.zeros((2 * n_pts + 3 + n_pos, q))
    res = np.zeros(2 * n_pts + 3 + n_pos)
    jtj = np.zeros((q, q))
    jtr = np.zeros(q)
    a = np.zeros((q, q))
    b = np.zeros(q)
    low = np.zeros((q, q))
    step = np.zeros(q)
    active = np.zeros(q, dtype=np.int64)
    trial = np.empty(q)
    delta = np.zeros(q)
    p_trial = np.empty(7)
    mu, nu = 1e-3, 2.0
    stale = True
    for _ in range(max_iterations):
        # A rejected step leaves the evaluation as it was: its normal equations too.
        if stale:
            _jacobian(p, m, sync, inter, intra, retro, free, positive, sg, sr, sk, ev, jac, res)
            _normal_equations(jac, res, jtj, jtr)
            stale = False
        # Variables at a bound that the gradient pushes outwards stay there this step.
        n_act = 0
        for c in range(q):
            if not ((x[c] <= lo[c] and jtr[c] > 0) or (x[c] >= hi[c] and jtr[c] < 0)):
                active[n_act] = c
                n_act += 1
        if n_act == 0:
            break
        for r in range(n_act):
            i = active[r]
            for s in range(n_act):
                j = active[s]
                a[r, s] = jtj[i, j] + (mu * jtj[i, i] if i == j else 0.0)
            b[r] = -jtr[i]
        if not _solve_spd(a, b, n_act, low, step):
            mu, nu = mu * nu, nu * 2.0
            continue
        trial[:] = x
        delta[:] = 0.0
        clipped = False
        # A trust region of e^2 per variable and step.
        for r in range(n_act):
            c = active[r]
            dv = step[r]
            trial[c] = _pmin(_pmax(x[c] + _pmin(_pmax(dv, -_MAX_STEP), _MAX_STEP), lo[c]), hi[c])
            delta[c] = trial[c] - x[c]
            clipped = clipped or delta[c] != dv
        # Decrease the Gauss-Newton model predicts for the step taken: -(2 d.g + d.A.d).
        predicted = 0.0
        for r in range(n_act):
            i = active[r]
            quad = 0.0
            for s in range(n_act):
                j = active[s]
                quad += jtj[i, j] * delta[j]
            predicted -= delta[i] * (2.0 * jtr[i] + quad)
        if not predicted > 1e-14 * loss:
            if not clipped:
                break  # converged: no step the model trusts lowers the loss
            mu, nu = mu * nu, nu * 2.0
            continue
        _from_vars(p, trial, free, p_trial)
        loss_trial = _evaluate(
            p_trial, m, log_obs, sync, inter, intra, retro, positive, center, sg, sr, sk,
            ev_trial, sq,
        )  # fmt: skip
        rho = (loss - loss_trial) / predicted
        if rho > 0.0:
            x[:] = trial
            p, p_trial = p_trial, p
            ev, ev_trial = ev_trial, ev
            loss = loss_trial
            stale = True
            t = 2.0 * rho - 1.0
            mu *= _pmax(1.0 / 3.0, 1.0 - t * t * t)
            nu = 2.0
        else:
            mu, nu = mu * nu, nu * 2.0
    return p


def levenberg_marquardt(
    p: FloatArray,
    m: FloatArray,
    log_obs: FloatArray,
    sync: IntArray,
    inter: FloatArray,
    retro: FloatArray,
    free: IntArray,
    center: FloatArray,
    weights: tuple[float, float, float],
    max_iterations: int,
    log_lower: float,
    gamma_max: float,
) -> FloatArray:
    """Minimize the fit's loss over the free parameters from ``p``.

    One iteration: solve (J^T J + mu diag(J^T J)) d = -J^T r over the variables not held
    at a bound, clip the step to the trust region (a factor e^2 per variable) and the
    bounds, and take it if the loss falls; the damping mu and its growth nu follow
    Nielsen's rule on the gain ratio. Stops after ``max_iterations`` tries, when no
    variable may move, or when the model predicts a decrease below 1e-14 of the loss
    for an unclipped step.

    Args:
        p: (7,) start, pinned parameters at their values.
        m: (P,) per-GPU batch.
        log_obs: (2P,) log compute times, then log step times.
        sync: (S,) indices of the points with more than one replica.
        inter: (S,) 1.0 where that point spans nodes, else 0.0.
        retro: (S,) max(K - 2, 0) of that point.
        free: (q,) the parameters the solver moves, in parameter order.
        center: (7,) the ridge's centre: log p for the positive parameters, gamma.
        weights: square roots of the gamma, retrogression and ridge weights.
        max_iterations: the iteration budget.
        log_lower: log of the positive parameters' lower bound.
        gamma_max: gamma's upper bound (its lower bound is 1).

    Returns:
        The (7,) fitted parameters.
    """
    sg, sr, sk = weights
    return _lm(
        p, m, log_obs, sync, inter, retro, free, center, sg, sr, sk, max_iterations,
        log_lower, gamma_max,
    )  # fmt: skip


def residuals_and_jacobian(
    p: FloatArray,
    m: FloatArray,
    log_obs: FloatArray,
    sync: IntArray,
    inter: FloatArray,
    retro: FloatArray,
    free: IntArray,
    center: FloatArray,
    weights: tuple[float, float, float],
) -> tuple[float, FloatArray, FloatArray]:
    """The loss, the residuals and their Jacobian at ``p`` (for tests; arguments as
    :func:`levenberg_marquardt`)."""
    sg, sr, sk = weights
    positive = np.array([i for i in free.tolist() if i != _G], dtype=np.int64)
    n_pts = m.size
    rows = 2 * n_pts + 3 + positive.size
    ev = np.zeros((10, rows))
    sq = np.empty(rows)
    intra = 1.0 - inter
    loss = _evaluate(p, m, log_obs, sync, inter, intra, retro, positive, center, sg, sr, sk, ev, sq)
    jac = np.zeros((rows, free.size))
    res = np.zeros(rows)
    _jacobian(p, m, sync, inter, intra, retro, free, positive, sg, sr, sk, ev, jac, res)
    return float(loss), res, jac


def np_sum(values: FloatArray) -> float:
    """``float(np.sum(values))`` of a contiguous float64 vector, as the kernel sums
    (for tests)."""
    return float(_np_sum(np.ascontiguousarray(values, dtype=np.float64), 0, values.size))
