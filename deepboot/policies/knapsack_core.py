"""An exact group knapsack that solves a small core instead of the whole DP.

:func:`~deepboot.policies.allocation.group_knapsack` is the reference: a DP over every
group and every capacity, O(J * C * K), about 0.1-0.2 s at 2,000 jobs and 4,096 GPUs.
:func:`core_knapsack` reaches the same optimal value much faster on such instances,
by the classic Lagrangian reduction for the multiple-choice knapsack (Dyer, Kayal &
Walker 1984; Pisinger's "core" for the MCKP, 1995), written here from the method:

1. For a price ``lam >= 0`` per GPU, each group's best item at that price is
   ``g_j(lam) = max(0, max_t v_jt - lam * w_jt)`` (0: the group gets nothing), and
   ``L(lam) = lam * C + sum_j g_j(lam)`` bounds the optimum from above (weak
   duality). Bisection finds the price where the groups' chosen weight crosses C.
2. The choice at the higher end of the bracket fits, so its value ``LB`` bounds the
   optimum from below; a few greedy upgrades into the GPUs it leaves narrow the gap.
3. An item whose *reduced cost* ``g_j - (v_jt - lam * w_jt)`` exceeds ``L - LB``
   cannot be in any optimal choice (forcing it gives a bound below ``LB``), so it is
   dropped. A group left with one item is fixed to it; the others (the core, usually
   a few dozen groups near the price) are solved by the reference DP over the GPUs
   the fixed groups leave.

Exact: the value equals the DP's up to floating-point rounding (a tolerance of
``1e-9`` of the bounds keeps rounding from dropping an optimal item), which
``tests/policies/test_knapsack_core.py`` checks against :func:`group_knapsack` and
brute force on random instances. Among several optimal choices it may return another
one than the reference's backtrack, so the paper's ATS-T keeps the DP
(``deepboot:solver=dp``, the default) and this is ``deepboot:solver=core``. When
every item is within the gap (values that are linear in the GPUs, say) the core is
every group, and this costs what the DP costs plus the bounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from deepboot.policies.allocation import group_knapsack

FloatArray: TypeAlias = npt.NDArray[np.float64]
IntArray: TypeAlias = npt.NDArray[np.int64]

BISECTION_STEPS = 48
"""Halvings of the price bracket; the bracket only needs to be tight enough that the
core is small, and any price gives valid bounds."""

FILL_STEPS = 16
"""Greedy upgrades tried into the GPUs the priced choice leaves (each a pass over the
items): enough to close most of the gap; the core DP does the rest exactly."""

TOLERANCE = 1e-9
"""Relative slack on the gap ``L - LB``, against rounding in the sums."""


def _pad(values: Sequence[FloatArray], low: Sequence[int]) -> FloatArray:
    """One array per group -> the (J, M) matrix, ``-inf`` past each group's items."""
    if len(values) != len(low):
        raise ValueError(f"{len(values)} value arrays but {len(low)} lows")
    rows = [np.asarray(v, dtype=np.float64).ravel() for v in values]
    width = max((v.size for v in rows), default=0)
    val = np.full((len(rows), max(width, 1)), -np.inf)
    for j, v in enumerate(rows):
        if not np.all(np.isfinite(v)):
            raise ValueError("knapsack values must be finite")
        val[j, : v.size] = v
    return val


def _trim(val: FloatArray, low: IntArray, capacity: int) -> tuple[FloatArray, IntArray]:
    """The reference's trimming, as ``-inf``: items past a group's first maximum (never
    the smallest optimal choice) and items heavier than the capacity. Returns the
    trimmed values and the weights."""
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0; got {capacity}")
    if np.any(low < 1):
        raise ValueError(f"item counts start at 1 or more; got {int(low.min())}")
    if np.isnan(val).any() or np.isposinf(val).any():
        raise ValueError("knapsack values must be finite (-inf marks no item)")
    steps = np.arange(val.shape[1], dtype=np.int64)
    weight = low[:, None] + steps[None, :]
    past = steps[None, :] > np.argmax(val, axis=1)[:, None]
    return np.where(past | (weight > capacity), -np.inf, val), weight


def _choice(val: FloatArray, weight: IntArray, lam: float) -> tuple[IntArray, FloatArray]:
    """Each group's best item at price ``lam`` (-1: nothing) and its net value (>= 0).

    Ties go to the lighter choice (nothing before any item, then the smaller count),
    so the chosen weight is the least among a group's maxima.
    """
    net = val - lam * weight
    best = np.argmax(net, axis=1)
    top = net[np.arange(net.shape[0]), best]
    take = top > 0.0
    return np.where(take, best, -1), np.where(take, top, 0.0)


def _weights(weight: IntArray, pick: IntArray) -> IntArray:
    rows = np.arange(weight.shape[0])
    return np.where(pick >= 0, weight[rows, np.maximum(pick, 0)], 0)


def _values(val: FloatArray, pick: IntArray) -> FloatArray:
    rows = np.arange(val.shape[0])
    return np.where(pick >= 0, val[rows, np.maximum(pick, 0)], 0.0)


def _fill(val: FloatArray, weight: IntArray, pick: IntArray, room: int) -> IntArray:
    """Greedy upgrades of ``pick`` into ``room`` spare GPUs: each time, the single
    change with the largest gain that fits; a lower bound, nothing more."""
    pick = pick.copy()
    rows = np.arange(val.shape[0])
    for _ in range(min(room, val.shape[0], FILL_STEPS)):
        now_w = _weights(weight, pick)
        now_v = _values(val, pick)
        extra = weight - now_w[:, None]
        gain = np.where((extra > 0) & (extra <= room), val - now_v[:, None], -np.inf)
        flat = int(np.argmax(gain))
        j, t = divmod(flat, val.shape[1])
        if not gain[j, t] > 0.0:
            break
        room -= int(extra[j, t])
        pick[rows[j]] = t
    return pick


def core_knapsack(values: Sequence[FloatArray], low: Sequence[int], capacity: int) -> list[int]:
    """Exact group knapsack (the contract of
    :func:`~deepboot.policies.allocation.group_knapsack`, whose optimal value it
    returns), solving only the core left by the Lagrangian reduction (module docstring).

    Args:
        values: ``values[i][t]`` is the value of giving group i ``low[i] + t`` GPUs;
            finite; may be empty (the group can only get 0).
        low: Smallest GPU count of each group's items (>= 1).
        capacity: GPUs available (>= 0).

    Returns:
        GPU count per group: 0 or in ``[low[i], low[i] + len(values[i]) - 1]``,
        summing to at most ``capacity``, with the largest total value (a group at 0
        adds 0). Which optimal choice, when there are several, is unspecified.

    Raises:
        ValueError: as :func:`group_knapsack`.
    """
    return core_knapsack_matrix(_pad(values, low), np.asarray(low, dtype=np.int64), capacity)


def core_knapsack_matrix(values: FloatArray, low: IntArray, capacity: int) -> list[int]:
    """:func:`core_knapsack` on a (J, M) matrix: ``values[i, t]`` for ``low[i] + t``
    GPUs, ``-inf`` where group i has no such item (ATS-T's
    :class:`~deepboot.policies.deepboot.Items` are built so)."""
    val, weight = _trim(np.asarray(values, dtype=np.float64), np.asarray(low), capacity)
    groups = val.shape[0]
    if groups == 0:
        return []
    # Every group at its best item (the last one, after trimming) fits: done.
    top_item = np.argmax(val, axis=1)
    top_vals = val[np.arange(groups), top_item]
    everything = np.where(top_vals > 0.0, weight[np.arange(groups), top_item], 0)
    if int(everything.sum()) <= capacity:
        return [int(c) for c in everything]

    # Bisection on the price: at lo the groups want more than the capacity, at hi not.
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(np.isfinite(val), val / weight, 0.0)
    lo, hi = 0.0, float(max(ratio.max(), 0.0)) + 1.0
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        pick, _ = _choice(val, weight, mid)
        want = int(_weights(weight, pick).sum())
        if want > capacity:
            lo = mid
        else:
            hi = mid
            if want == capacity:
                break  # the choice at this price fits exactly: no tighter bracket needed
    lam = hi
    pick, net = _choice(val, weight, lam)
    used = int(_weights(weight, pick).sum())
    pick = _fill(val, weight, pick, capacity - used)
    lower = float(_values(val, pick).sum())
    upper = lam * capacity + float(net.sum())
    gap = max(upper - lower, 0.0) + TOLERANCE * (abs(upper) + abs(lower) + 1.0)

    # Reduced costs; the "nothing" option has net value 0.
    reduced = net[:, None] - (val - lam * weight)
    alive = np.isfinite(val) & (reduced <= gap)
    nothing_alive = net <= gap
    options = alive.sum(axis=1) + nothing_alive
    counts = np.zeros(groups, dtype=np.int64)
    fixed = options == 1
    fixed_item = fixed & ~nothing_alive
    first = np.argmax(alive, axis=1)
    counts[fixed_item] = weight[fixed_item, first[fixed_item]]
    core = np.flatnonzero(~fixed)
    if core.size:
        room = capacity - int(counts.sum())
        # Each core group keeps the span of its surviving items (the ones between are
        # items of the problem too, so adding them cannot lose the optimum).
        spans: list[FloatArray] = []
        lows: list[int] = []
        for j in core:
            live = np.flatnonzero(alive[j])
            if live.size == 0:
                spans.append(np.zeros(0))
                lows.append(1)
                continue
            a, b = int(live[0]), int(live[-1])
            spans.append(val[j, a : b + 1])
            lows.append(int(weight[j, a]))
        chosen = group_knapsack(spans, lows, max(room, 0))
        counts[core] = chosen
    return [int(c) for c in counts]
