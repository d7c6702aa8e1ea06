"""The goodput tables' throughput rows, compiled with numba (issue 10).

:func:`throughput_rows` computes what :meth:`deepboot.perf.goodput._CandidateTable.throughput`
computed in NumPy for the rows it had not memoized yet, element by element with the
same IEEE operations in the same order (``tests/perf/test_goodputkernel.py`` compares
the two bit for bit):

* ``t_grad = alpha_c + beta_c * m``; ``t_sync`` the inter-node time when N > 1, else
  the intra-node time when K > 1, else 0;
* :func:`deepboot.perf.goodput.combine_times`: ``max * (1 + (min / max)^gamma)^(1/gamma)``
  where ``t_sync > 0``, else ``t_grad``, with detmath's fdlibm ``exp``/``log`` in the
  scalar form the fit kernel compiles (:mod:`deepboot.perf._fitkernel`: ``_exp`` and
  ``_log``, the bits of ``detmath.exp``/``detmath.log``); ``np.maximum`` and
  ``np.minimum`` with their NaN rule;
* ``total / (step + accum * t_grad)``.

Compiled as the fit kernel is (generic CPU target, no fast-math, NumPy's error model,
cached); importing that module configures numba first.
"""

from __future__ import annotations

import numpy as np

from deepboot.perf._fitkernel import _exp, _jit, _log

__all__ = ["throughput_rows"]

FloatArray = np.ndarray


@_jit
def _maximum(a: float, b: float) -> float:
    """``np.maximum`` of two floats (NaN if either is; ``a`` on ties)."""
    if a != a:
        return a
    if b != b:
        return b
    return a if a >= b else b


@_jit
def _minimum(a: float, b: float) -> float:
    """``np.minimum`` of two floats (NaN if either is; ``a`` on ties)."""
    if a != a:
        return a
    if b != b:
        return b
    return a if a <= b else b


@_jit
def throughput_rows(
    params: FloatArray,
    atomic: FloatArray,
    accum: FloatArray,
    total: FloatArray,
    retro: FloatArray,
    multi: np.ndarray,
    rows: np.ndarray,
    inter: np.ndarray,
    out: FloatArray,
) -> None:
    """``out[q]``: the throughput of every candidate of table row ``rows[q]`` with
    ``inter[q]`` (N > 1), for the parameters ``params`` (alpha_c, beta_c, alpha_n,
    beta_n, alpha_r, beta_r, gamma)."""
    ac, bc, an, bn, ar, br, gamma = (
        params[0],
        params[1],
        params[2],
        params[3],
        params[4],
        params[5],
        params[6],
    )
    for q in range(rows.shape[0]):
        r = rows[q]
        rt = retro[r]
        intra = ar + br * rt if multi[r] else 0.0
        t_sync = an + bn * rt if inter[q] > 0 else intra
        for c in range(atomic.shape[1]):
            t_grad = ac + bc * atomic[r, c]
            if t_sync > 0:
                top = _maximum(t_grad, t_sync)
                ratio = _minimum(t_grad, t_sync) / top
                tail = _exp(gamma * _log(ratio))
                step = top * _exp(_log(1.0 + tail) / gamma)
            else:
                step = t_grad
            out[q, c] = total[r, c] / (step + accum[r, c] * t_grad)
