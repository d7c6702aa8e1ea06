"""The Pollux search's node-slot knapsack, compiled with numba (issue 10).

:func:`slot_knapsack` is a group knapsack over two budgets, GPUs and node slots:
each group (a job) takes exactly one of its options, each option uses some GPUs and
some slots at some cost, and the result is the least summed cost within both
budgets. :func:`deepboot.policies.pollux_search.slot_bound` builds the options; the
search only compares the result with costs (with a tolerance), so the order of its
additions does not matter for a result, but it is fixed anyway: job by job in the
given order, each cost added to the best total of the jobs before it.

Compiled as the fit kernel is (generic CPU target, no fast-math, NumPy's error
model, cached); importing that module configures numba first.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from deepboot.perf._fitkernel import _jit

__all__ = ["slot_knapsack"]


@_jit
def slot_knapsack(
    gpus: npt.NDArray[np.int64],
    slots: npt.NDArray[np.int64],
    costs: npt.NDArray[np.float64],
    starts: npt.NDArray[np.int64],
    total_gpus: int,
    total_slots: int,
) -> float:
    """Least summed cost taking one option per group within both budgets.

    Args:
        gpus, slots, costs: One entry per option; group ``i``'s options are the
            entries ``starts[i]`` to ``starts[i + 1] - 1``.
        starts: (groups + 1,) offsets, ascending.
        total_gpus, total_slots: The budgets (>= 0).

    Returns:
        The least cost (inf when no choice fits; NaN costs are never chosen).
    """
    rows, cols = total_gpus + 1, total_slots + 1
    best = np.zeros((rows, cols))  # best[g, s]: least cost within g GPUs and s slots
    new = np.empty((rows, cols))
    for group in range(starts.shape[0] - 1):
        new[:, :] = math.inf
        for o in range(starts[group], starts[group + 1]):
            k, s, c = gpus[o], slots[o], costs[o]
            for g in range(k, rows):
                for t in range(s, cols):
                    value = best[g - k, t - s] + c
                    if value < new[g, t]:
                        new[g, t] = value
        best, new = new, best
    return float(best[rows - 1, cols - 1])
