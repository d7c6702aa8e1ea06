"""The compiled knapsack against its NumPy formulation (the specification), bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from deepboot.policies.pollux_knapsack import knapsack


def _reference(option_costs: list[np.ndarray], lows: list[int], total: int):
    """dp_counts' knapsack as it was written in NumPy."""
    budget = np.arange(total + 1)
    dp = np.zeros(total + 1)
    args = []
    for cs, low in zip(option_costs, lows, strict=True):
        ks = np.concatenate(([0], np.arange(low, low + len(cs) - 1))).astype(np.int64)
        src = np.arange(total + 1)[None, :] - ks[:, None]
        vals = np.where(src >= 0, dp[np.maximum(src, 0)], np.inf)
        with np.errstate(invalid="ignore"):  # inf + -inf is NaN, as in the kernel
            vals += cs[:, None]
        arg = vals.argmin(axis=0)
        dp = vals[arg, budget]
        args.append(arg)
    return np.array(args).reshape(len(lows), total + 1), dp


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("seed", range(40))
def test_matches_numpy_formulation(seed: int) -> None:
    rng = np.random.default_rng(seed)
    total = int(rng.integers(1, 70))
    steps = int(rng.integers(1, 9))
    costs, lows = [], []
    for _ in range(steps):
        low = int(rng.integers(1, 5))
        size = int(rng.integers(1, total + 3))
        cs = rng.normal(size=size) * 10.0
        if seed % 3 == 0:  # ties, infinities, NaNs, signed zeros
            cs = np.round(cs / 5.0) * 5.0
            cs[rng.random(size) < 0.15] = np.inf
            cs[rng.random(size) < 0.05] = -0.0
        if seed % 7 == 0:
            cs[rng.random(size) < 0.1] = np.nan
        if seed % 11 == 0:
            cs[rng.random(size) < 0.1] = -np.inf
        costs.append(cs)
        lows.append(low)
    args, dp = knapsack(costs, lows, total)
    ref_args, ref_dp = _reference(costs, lows, total)
    assert _same(args, ref_args.astype(np.int64))
    assert _same(dp, ref_dp)
