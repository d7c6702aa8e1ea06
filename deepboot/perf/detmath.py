"""Transcendental functions that give the same bits on every machine.

NumPy picks its ``exp``, ``log``, ``power``, ``log2``, ``log10``, ``log1p`` (and so
``geomspace``) kernels by CPU at run time: with AVX-512 they are NumPy's own SIMD
code or Intel's SVML, elsewhere the C library's. The kernels differ in the last bits,
and a scheduler that compares goodputs turns last bits into different decisions.
BLAS (``np.dot``, ``@``, ``np.linalg``) picks its kernels by CPU too.

These functions are built only from operations that IEEE 754 rounds exactly and that
NumPy applies element by element (``+ - * /``, ``frexp``, ``ldexp``, ``rint``,
comparisons), in a fixed order, so their results are the same on every CPU and SIMD
level. The algorithms are fdlibm's ``exp`` and ``log`` (Sun Microsystems, 1993):
argument reduction by ln 2, then a minimax polynomial (``exp``) or the ``atanh``
series in ``s = f / (2 + f)`` (``log``). Both are within 1 ulp of the exact result
(tested against ``math``), which is all the models need: what matters is that two
machines agree, not the last bit of accuracy.

Each function has a NumPy form (arrays, any shape; the result has the input's shape)
and a scalar form on Python floats (``*_scalar``) that gives the same bits as the
array form on the same value (tested). Python's float operations are IEEE double
operations, one rounding each, so the scalar forms are machine-independent too.

:func:`solve_spd` solves the small symmetric positive definite systems of the fits
without LAPACK.

``pow(x, y)`` is ``exp(y * log(x))``: deterministic, within a few ulp for the
exponents the models use (|y log x| < 50), not correctly rounded.
"""

from __future__ import annotations

import math
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

FloatArray: TypeAlias = npt.NDArray[np.float64]

# ln 2 split so that k * LN2_HI is exact for |k| < 2**20 (fdlibm).
LN2_HI = 6.93147180369123816490e-01
LN2_LO = 1.90821492927058770002e-10
INV_LN2 = 1.44269504088896338700e00
SQRT_HALF = 0.70710678118654752440
EXP_OVERFLOW = 7.09782712893383973096e02
EXP_UNDERFLOW = -7.45133219101941108420e02
LN10 = 2.30258509299404568402e00

# exp: minimax polynomial for R(r^2) on |r| <= ln2 / 2 (fdlibm P1..P5).
_P1 = 1.66666666666666019037e-01
_P2 = -2.77777777770155933842e-03
_P3 = 6.61375632143793436117e-05
_P4 = -1.65339022054652515390e-06
_P5 = 4.13813679705723846039e-08

# log: the atanh series (fdlibm Lg1..Lg7).
_LG1 = 6.666666666666735130e-01
_LG2 = 3.999999999940941908e-01
_LG3 = 2.857142874366239149e-01
_LG4 = 2.222219843214978396e-01
_LG5 = 1.818357216161805012e-01
_LG6 = 1.531383769920937332e-01
_LG7 = 1.479819860511658591e-01


# The kernels' constants as 0-d arrays: an operation with one runs the same float64
# loop as with a Python float (the same bits), without converting the float on every
# call, which is a third of the cost of an operation on the small arrays the fit and
# the goodput tables pass.
_K_INV_LN2 = np.array(INV_LN2)
_K_LN2_HI = np.array(LN2_HI)
_K_LN2_LO = np.array(LN2_LO)
_K_P = [np.array(v) for v in (_P1, _P2, _P3, _P4, _P5)]
_K_LG = [np.array(v) for v in (_LG1, _LG2, _LG3, _LG4, _LG5, _LG6, _LG7)]
_K_ONE = np.array(1.0)
_K_TWO = np.array(2.0)
_K_HALF = np.array(0.5)
_K_SQRT_HALF = np.array(SQRT_HALF)
_K_EXP_SAFE = 1021
"""|k| at most this in exp: 2**k * y (y in [0.707, 1.415]) is a normal float, so the
kernel raises no overflow or underflow and needs no ``np.errstate``."""


def _exp_finish(a: FloatArray, k: FloatArray) -> FloatArray:
    """exp's kernel after the reduction k = rint(a / ln 2) (fdlibm)."""
    p1, p2, p3, p4, p5 = _K_P
    hi = a - k * _K_LN2_HI
    lo = k * _K_LN2_LO
    r = hi - lo
    t = r * r
    c = r - t * (p1 + t * (p2 + t * (p3 + t * (p4 + t * p5))))
    y = _K_ONE - ((lo - (r * c) / (_K_TWO - c)) - hi)
    return np.asarray(np.ldexp(y, k.astype(np.int64)))


def _exp_kernel(a: FloatArray) -> FloatArray:
    """exp for finite ``a`` within [EXP_UNDERFLOW - 1, EXP_OVERFLOW + 1] (unchecked)."""
    with np.errstate(over="ignore", under="ignore"):
        return _exp_finish(a, np.rint(a * _K_INV_LN2))


def exp(x: npt.ArrayLike) -> FloatArray:
    """e**x, elementwise; overflows to inf above ~709.78, underflows to 0 below ~-745.13.

    Returns:
        Array of ``x``'s shape; NaN stays NaN.
    """
    a = np.asarray(x, dtype=np.float64)
    k = np.rint(a * _K_INV_LN2)
    # Fast path: every |a| < ~707 (NaN fails the test), the common case.
    if a.size and float(np.abs(k).max()) <= _K_EXP_SAFE:
        return _exp_finish(a, k)
    finite = np.isfinite(a)
    clipped = np.where(finite, np.clip(a, EXP_UNDERFLOW - 1.0, EXP_OVERFLOW + 1.0), 0.0)
    out = _exp_kernel(clipped)
    out = np.where(clipped > EXP_OVERFLOW, np.inf, out)
    out = np.where(clipped < EXP_UNDERFLOW, 0.0, out)
    # inf -> inf, -inf -> 0, nan -> nan.
    return np.where(finite, out, np.where(a > 0, np.inf, np.where(a < 0, 0.0, a)))


def _log_finish(m: FloatArray, e: npt.NDArray[np.int32]) -> FloatArray:
    """log's kernel from ``frexp`` of finite positive numbers (fdlibm)."""
    lg1, lg2, lg3, lg4, lg5, lg6, lg7 = _K_LG
    # Mantissa into [sqrt(1/2), sqrt(2)), so that |f| <= 0.4142 (doubling is exact).
    low = m < _K_SQRT_HALF
    m = np.ldexp(m, low)
    k = (e - low).astype(np.float64)
    f = m - _K_ONE
    s = f / (_K_TWO + f)
    z = s * s
    w = z * z
    t1 = w * (lg2 + w * (lg4 + w * lg6))
    t2 = z * (lg1 + w * (lg3 + w * (lg5 + w * lg7)))
    r = t2 + t1
    hfsq = _K_HALF * f * f
    return np.asarray(k * _K_LN2_HI - ((hfsq - (s * (hfsq + r) + k * _K_LN2_LO)) - f))


def _log_kernel(a: FloatArray) -> FloatArray:
    """log for finite ``a`` > 0 (unchecked)."""
    m, e = np.frexp(a)
    return _log_finish(m, e)


def log(x: npt.ArrayLike) -> FloatArray:
    """Natural logarithm, elementwise: -inf at 0, NaN below 0, inf at inf.

    Returns:
        Array of ``x``'s shape.
    """
    a = np.asarray(x, dtype=np.float64)
    m, e = np.frexp(a)
    # Fast path: frexp's mantissa is in [0.5, 1) exactly for the finite positive
    # numbers (0, negatives, inf and NaN all fall outside), the common case.
    if a.size and float(np.abs(m - 0.75).max()) <= 0.25:
        return _log_finish(m, e)
    ok = (a > 0) & (a < np.inf)
    out = _log_kernel(np.where(ok, a, 1.0))
    special = np.where(a == 0, -np.inf, np.where(a > 0, a, np.nan))
    return np.where(ok, out, special)


def pow(x: npt.ArrayLike, y: npt.ArrayLike) -> FloatArray:  # noqa: A001 - mirrors math.pow
    """x**y for x >= 0 as exp(y * log(x)), elementwise (0**y is 0 for y > 0, 1 for y == 0).

    Returns:
        Array of the broadcast shape of ``x`` and ``y``.
    """
    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        out = exp(b * log(a))
    return np.where(b == 0.0, 1.0, out)


def logaddexp(a: npt.ArrayLike, b: npt.ArrayLike) -> FloatArray:
    """log(exp(a) + exp(b)) without overflow, elementwise; -inf if both are -inf.

    Returns:
        Array of the broadcast shape of ``a`` and ``b``.
    """
    u = np.asarray(a, dtype=np.float64)
    v = np.asarray(b, dtype=np.float64)
    top = np.maximum(u, v)
    with np.errstate(invalid="ignore"):
        gap = np.where(np.isfinite(top), -np.abs(u - v), -np.inf)
    gap = np.where(np.isnan(gap), -np.inf, gap)
    return np.where(np.isneginf(top), top, top + log(1.0 + exp(gap)))


def geomspace(lo: npt.ArrayLike, hi: npt.ArrayLike, num: int) -> FloatArray:
    """``num`` points from lo to hi (both > 0) in a geometric progression, along axis 0.

    Point i is lo * exp(i / (num - 1) * log(hi / lo)); the first is lo and the last
    is hi exactly.

    Returns:
        Array of shape ``(num,) + broadcast shape of lo and hi``.
    """
    a = np.asarray(lo, dtype=np.float64)
    b = np.asarray(hi, dtype=np.float64)
    a, b = np.broadcast_arrays(a, b)
    if num < 2:
        return np.asarray(a[None, ...].copy(), dtype=np.float64)
    frac = (np.arange(num, dtype=np.float64) / float(num - 1)).reshape((num,) + (1,) * a.ndim)
    out = a * exp(frac * log(b / a))
    out[0] = a
    out[-1] = b
    return out


def exp_scalar(x: float) -> float:
    """:func:`exp` on one Python float: the same bits, without NumPy's call overhead."""
    if not math.isfinite(x):
        return math.inf if x > 0 else (0.0 if x < 0 else x)
    if x > EXP_OVERFLOW:
        return math.inf
    if x < EXP_UNDERFLOW:
        return 0.0
    k = float(round(x * INV_LN2))  # round-half-even, as np.rint
    hi = x - k * LN2_HI
    lo = k * LN2_LO
    r = hi - lo
    t = r * r
    c = r - t * (_P1 + t * (_P2 + t * (_P3 + t * (_P4 + t * _P5))))
    y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi)
    try:
        return math.ldexp(y, int(k))
    except OverflowError:
        return math.inf


def log_scalar(x: float) -> float:
    """:func:`log` on one Python float: the same bits as the array form."""
    if not (math.isfinite(x) and x > 0):
        if x == 0:
            return -math.inf
        return x if x > 0 else math.nan
    m, e = math.frexp(x)
    if m < SQRT_HALF:
        m = m + m
        e -= 1
    k = float(e)
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    t1 = w * (_LG2 + w * (_LG4 + w * _LG6))
    t2 = z * (_LG1 + w * (_LG3 + w * (_LG5 + w * _LG7)))
    r = t2 + t1
    hfsq = 0.5 * f * f
    return k * LN2_HI - ((hfsq - (s * (hfsq + r) + k * LN2_LO)) - f)


def exp10_scalar(x: float) -> float:
    """10**x as ``exp_scalar(x * LN10)``: deterministic, within a few ulp."""
    return exp_scalar(x * LN10)


def pow_scalar(x: float, y: float) -> float:
    """:func:`pow` on Python floats (x >= 0): the same bits as the array form."""
    if y == 0.0:
        return 1.0
    return exp_scalar(y * log_scalar(x))


def solve_spd(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Solve a x = b for a small symmetric positive definite ``a``, in Python floats.

    Cholesky factorisation in a fixed order of operations, instead of LAPACK, whose
    kernels (and so the last bits) depend on the CPU.

    Returns:
        x, or None when ``a`` is not (numerically) positive definite.
    """
    n = len(b)
    low = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1):
            acc = a[i][j]
            for k in range(j):
                acc -= low[i][k] * low[j][k]
            if i == j:
                if not acc > 0.0:
                    return None
                low[i][i] = math.sqrt(acc)
            else:
                low[i][j] = acc / low[j][j]
    y = [0.0] * n
    for i in range(n):
        acc = b[i]
        for k in range(i):
            acc -= low[i][k] * y[k]
        y[i] = acc / low[i][i]
    x = [0.0] * n
    for i in reversed(range(n)):
        acc = y[i]
        for k in range(i + 1, n):
            acc -= low[k][i] * x[k]
        x[i] = acc / low[i][i]
    return x
