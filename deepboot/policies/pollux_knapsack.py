"""The group knapsack of :func:`deepboot.policies.pollux_search.dp_counts`, compiled.

:func:`knapsack` runs every step of the knapsack in one numba call. Each step did, in
NumPy (``tests/policies/test_pollux_knapsack.py`` keeps that formulation as the
specification and compares the two bit for bit)::

    vals = np.where(valid, dp[src], np.inf)   # dp[b - k], inf where b < k
    vals += cs[:, None]
    arg = vals.argmin(axis=0)
    dp = vals[arg, budget]

The kernel does the same IEEE additions (one per option and budget) and picks the
same option: the first minimum, or the first NaN (``argmin``'s rule). Additions and
comparisons only, so no fused multiply-add could change a bit; it is compiled as the
fit kernel is (:mod:`deepboot.perf._fitkernel`: generic CPU target, no fast-math,
cached), whose import configures numba before numba is imported.
"""

from __future__ import annotations

import math

import numpy as np

from deepboot.perf._fitkernel import _jit
from deepboot.policies.pollux_fitness import FloatArray, IntArray

__all__ = ["knapsack"]

_INF = math.inf


@_jit
def _knapsack(
    costs: FloatArray, starts: IntArray, lows: IntArray, total: int, args: IntArray
) -> FloatArray:
    """Fill ``args[i, b]`` (the option step ``i`` picks at budget ``b``); return the
    last step's dp row (the optimal cost at each budget)."""
    dp = np.zeros(total + 1)
    new = np.empty(total + 1)
    for i in range(len(lows)):
        first, end, low = starts[i], starts[i + 1], lows[i]
        for b in range(total + 1):
            best = dp[b] + costs[first]  # option 0: no GPUs, reads dp[b]
            pick = 0
            if not math.isnan(best):
                for o in range(1, end - first):
                    s = b - (low + o - 1)
                    v = (dp[s] if s >= 0 else _INF) + costs[first + o]
                    if math.isnan(v):
                        best, pick = v, o
                        break
                    if v < best:
                        best, pick = v, o
            args[i, b] = pick
            new[b] = best
        dp, new = new, dp
    return dp


def knapsack(
    option_costs: list[FloatArray], lows: list[int], total: int
) -> tuple[IntArray, FloatArray]:
    """Run the knapsack over jobs whose options are ``[0, low, low + 1, ...]`` GPUs
    with costs ``option_costs[i]`` (at least one option each).

    Returns:
        ``(args, dp)``: (steps, total + 1) option indices picked at each budget, and
        the last step's dp row (``dp[total]`` is the optimal summed cost).
    """
    sizes = [len(c) for c in option_costs]
    starts = np.zeros(len(sizes) + 1, dtype=np.int64)
    starts[1:] = np.cumsum(np.asarray(sizes, dtype=np.int64))
    flat = np.concatenate(option_costs).astype(np.float64, copy=False)
    args = np.empty((len(sizes), total + 1), dtype=np.int64)
    dp = _knapsack(flat, starts, np.asarray(lows, dtype=np.int64), total, args)
    return args, dp
