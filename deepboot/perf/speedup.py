"""Speedup functions policies score allocations with.

``speedup(N, K) = goodput(N, K) / goodput(1, 1)`` as in the reference speedup.py. The
policies' hot path queries thousands of (N, K) pairs per round, so the optimized
goodput is memoized per (N, K) inside each :class:`SpeedupModel` and computed for all
missing pairs in one vectorized call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from deepboot.core.modes import JobMode
from deepboot.core.params import BatchLimits, GradParams, PerfParams
from deepboot.core.state import JobView
from deepboot.perf.goodput import GoodputModel

FloatArray: TypeAlias = npt.NDArray[np.float64]

SpeedupFn: TypeAlias = Callable[[npt.NDArray[np.int64], npt.NDArray[np.int64]], FloatArray]
"""(num_nodes, num_replicas) int arrays of equal shape -> speedup array of that shape.

Entries with 0 replicas (and 0 nodes) have speedup 0. Scalars are accepted too (0-d
result).
"""


def _as_pairs(
    num_nodes: npt.ArrayLike, num_replicas: npt.ArrayLike
) -> tuple[tuple[int, ...], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Broadcast and flatten; validate 0 <= N <= K and (N == 0) == (K == 0)."""
    n_in = np.asarray(num_nodes, dtype=np.int64)
    k_in = np.asarray(num_replicas, dtype=np.int64)
    if n_in.shape == k_in.shape:
        shape = n_in.shape
        n, k = n_in.ravel(), k_in.ravel()
    else:
        shape = np.broadcast(n_in, k_in).shape
        n = np.broadcast_to(n_in, shape).ravel()
        k = np.broadcast_to(k_in, shape).ravel()
    # Given N <= K, "N >= 0 and (N == 0) == (K == 0)" is N >= (1 if K > 0 else 0).
    if n.size and ((n > k) | (n < (k > 0))).any():
        raise ValueError("speedup needs 0 <= num_nodes <= num_replicas, both 0 or both > 0")
    return shape, n, k


def linear_speedup(num_nodes: npt.ArrayLike, num_replicas: npt.ArrayLike) -> FloatArray:
    """Speedup of a job without a model yet: linear in replicas (speedup = K)."""
    shape, _, k = _as_pairs(num_nodes, num_replicas)
    return k.astype(np.float64).reshape(shape)


class SpeedupModel:
    """Optimized-goodput speedup over (1 node, 1 replica), memoized per (N, K).

    Not thread-safe (the memo grows in place); otherwise behaves as a pure function.
    Values equal ``optimize(N, K)[0] / optimize(1, 1)[0]`` bit for bit (K when that
    denominator is not positive); the first call computes it along with its queries.

    Args:
        model: The job's goodput model.
        accumulation: Let the optimizer use gradient accumulation (the reference does).
    """

    __slots__ = ("_model", "_accumulation", "_base", "_memo")

    def __init__(self, model: GoodputModel, accumulation: bool = True) -> None:
        self._model = model
        self._accumulation = accumulation
        # optimize(1, 1), computed with the first query (one vectorized pass for both).
        self._base: float | None = None
        # _memo[n, k] = speedup, or -1 when not computed yet; grown on demand.
        self._memo: FloatArray = np.full((1, 1), 0.0)

    @property
    def model(self) -> GoodputModel:
        return self._model

    def _grow(self, max_n: int, max_k: int) -> None:
        rows, cols = self._memo.shape
        if max_n < rows and max_k < cols:
            return
        new = np.full((max(rows, 2 * max_n + 1), max(cols, 2 * max_k + 1)), -1.0)
        new[:rows, :cols] = self._memo
        self._memo = new

    def __call__(self, num_nodes: npt.ArrayLike, num_replicas: npt.ArrayLike) -> FloatArray:
        """Speedup array of the broadcast shape of the arguments (see :data:`SpeedupFn`).

        Raises:
            ValueError: some N > K, N < 0, or exactly one of N, K is 0.
        """
        shape, n, k = _as_pairs(num_nodes, num_replicas)
        if n.size == 0:
            return np.zeros(shape)
        self._grow(int(n.max()), int(k.max()))
        out = self._memo[n, k]
        missing = out < 0
        if missing.any():
            # Repeated pairs are scored twice (same value): cheaper than deduplicating.
            fresh = missing.all()
            n_new, k_new = (n, k) if fresh else (n[missing], k[missing])
            if self._base is None:
                base, good = self._model.optimize_with_base(n_new, k_new, self._accumulation)
                self._base = base
            else:
                good = self._model.optimize_goodput(n_new, k_new, self._accumulation)
            # A degenerate model with zero base goodput falls back to linear scaling.
            values = good / self._base if self._base > 0 else k_new.astype(np.float64)
            self._memo[n_new, k_new] = values
            if fresh:
                out = values
            else:
                out[missing] = values
        return out.reshape(shape)


class FixedBatchSpeedup:
    """Speedup at a fixed total batch: fixed-batch goodput(N, K) / fixed goodput(1, 1).

    Args:
        model: The job's goodput model.
        batch_size: The fixed total batch.
    """

    __slots__ = ("_model", "_batch", "_base")

    def __init__(self, model: GoodputModel, batch_size: int) -> None:
        self._model = model
        self._batch = batch_size
        base, _, _ = model.fixed_batch(1, 1, batch_size)
        self._base = float(base)

    def __call__(self, num_nodes: npt.ArrayLike, num_replicas: npt.ArrayLike) -> FloatArray:
        """Speedup array of the broadcast shape of the arguments (see :data:`SpeedupFn`).

        Raises:
            ValueError: some N > K, N < 0, or exactly one of N, K is 0.
        """
        shape, n, k = _as_pairs(num_nodes, num_replicas)
        good, _, _ = self._model.fixed_batch(n, k, self._batch)
        if self._base <= 0:
            return k.astype(np.float64).reshape(shape)
        return np.asarray(good / self._base, dtype=np.float64).reshape(shape)


@functools.lru_cache(maxsize=4096)
def _cached_model(
    perf: PerfParams,
    grad: GradParams,
    limits: BatchLimits,
    batch_size: int | None,
) -> SpeedupFn:
    # Pure memo of an immutable input -> speedup function; lets every policy round reuse
    # the per-(N, K) memo of a job whose parameters did not change since the last round.
    model = GoodputModel(perf, grad, limits)
    if batch_size is None:
        return SpeedupModel(model)
    return FixedBatchSpeedup(model, batch_size)


def speedup_fn(job: JobView, mode: JobMode) -> SpeedupFn:
    """The speedup function a policy should use for ``job`` under ``mode``.

    * No model yet (``perf_params`` or ``grad_params`` is None): linear, speedup = K.
    * ADAPTIVE: optimized goodput (:class:`SpeedupModel`).
    * FIXED_BATCH / FIXED: goodput at ``job.target_batch_size`` (the initial batch size
      when the job has none) over the same at (1, 1) (:class:`FixedBatchSpeedup`).

    Functions for equal parameters are shared (an LRU cache keyed on the frozen
    parameters), so their memo survives across scheduling rounds.
    """
    if job.perf_params is None or job.grad_params is None:
        return linear_speedup
    batch: int | None = None
    if mode is not JobMode.ADAPTIVE:
        batch = job.target_batch_size or job.limits.init_batch_size
    return _cached_model(job.perf_params, job.grad_params, job.limits, batch)


SpeedupProvider: TypeAlias = Callable[[JobView], SpeedupFn]
"""Job -> its raw speedup function (any constant normalization; policies re-base it)."""


def adaptive_speedup(job: JobView) -> SpeedupFn:
    """The default provider of the adaptive policies: ``speedup_fn(job, ADAPTIVE)``."""
    return speedup_fn(job, JobMode.ADAPTIVE)


def speedup_rows(
    fns: list[SpeedupFn], num_nodes: npt.NDArray[np.int64], num_replicas: npt.NDArray[np.int64]
) -> FloatArray:
    """Row j of the result is ``fns[j](num_nodes[j], num_replicas[j])``, bit for bit.

    A policy scoring thousands of jobs a decision calls this once instead of each
    job's function: a :class:`SpeedupModel` whose memo already holds a row's pairs is
    read directly (the memo is what its call returns), the rest are called.

    Args:
        fns: One speedup function per row.
        num_nodes: Shape (J, W), every pair valid (see :data:`SpeedupFn`).
        num_replicas: Shape (J, W).

    Returns:
        Shape (J, W).
    """
    out = np.empty(num_replicas.shape, dtype=np.float64)
    if not fns:
        return out
    top_n = num_nodes.max(axis=1)
    top_k = num_replicas.max(axis=1)
    called = np.zeros(len(fns), dtype=bool)
    for j, fn in enumerate(fns):
        if type(fn) is SpeedupModel:
            memo = fn._memo
            if top_n[j] < memo.shape[0] and top_k[j] < memo.shape[1]:
                out[j] = memo[num_nodes[j], num_replicas[j]]
                continue
        out[j] = fn(num_nodes[j], num_replicas[j])
        called[j] = True
    # Pairs a memo did not hold yet read -1 there: compute those rows by the call.
    for row in np.flatnonzero(~called & (out < 0).any(axis=1)):
        out[row] = fns[row](num_nodes[row], num_replicas[row])
    return out
