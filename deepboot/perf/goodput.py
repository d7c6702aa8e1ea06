"""The Pollux goodput model: throughput x statistical efficiency, and the batch optimizer.

All functions are pure and vectorized: arguments broadcast like NumPy arithmetic, and
every result is an ``ndarray`` of the broadcast shape (0-d for scalar inputs; use
``float(x)`` / ``int(x)`` to unwrap).

:meth:`GoodputModel.optimize` scores candidate batches that depend only on the batch
limits and K; it reads them from tables cached per limits (an internal memo that never
changes a result: it equals :meth:`GoodputModel.optimize_reference` bit for bit).

The formulas are those of ALGORITHMS.md §1::

    T_grad(m)   = alpha_c + beta_c * m
    T_sync(N,K) = 0 (K == 1); alpha_r + beta_r*(K-2) (N == 1); alpha_n + beta_n*(K-2) (N > 1)
    T_iter      = (T_grad^gamma + T_sync^gamma)^(1/gamma) + s * T_grad
    throughput  = K * m * (s + 1) / T_iter
    efficiency  = (phi + M0) / (phi + M),  phi = M0 * grad_var / grad_sqr
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from deepboot.core.params import BatchLimits, GradParams, PerfParams
from deepboot.perf import detmath
from deepboot.perf._goodputkernel import throughput_rows

ArrayLike: TypeAlias = npt.ArrayLike
FloatArray: TypeAlias = npt.NDArray[np.float64]
IntArray: TypeAlias = npt.NDArray[np.int64]

NUM_CANDIDATES = 50
"""Total batch sizes the optimizer tries, geometrically spaced (as the reference)."""

_EPS = 1e-8
"""Tolerance of the floor/ceil operations of the batch split (as the reference)."""


def compute_time(perf: PerfParams, atomic_bsz: ArrayLike) -> FloatArray:
    """T_grad: seconds of one forward+backward pass at per-GPU batch ``atomic_bsz``.

    Returns:
        Array of ``atomic_bsz``'s shape.
    """
    m = np.asarray(atomic_bsz, dtype=np.float64)
    return np.asarray(perf.alpha_c + perf.beta_c * m, dtype=np.float64)


def sync_time(perf: PerfParams, num_nodes: ArrayLike, num_replicas: ArrayLike) -> FloatArray:
    """T_sync: seconds of gradient synchronisation (0 for a single replica).

    Returns:
        Array of the broadcast shape of ``num_nodes`` and ``num_replicas``.
    """
    n = np.asarray(num_nodes)
    k = np.asarray(num_replicas)
    retro = np.maximum(k - 2, 0).astype(np.float64)
    inter = perf.alpha_n + perf.beta_n * retro
    intra = perf.alpha_r + perf.beta_r * retro
    out = np.where(n > 1, inter, np.where(k > 1, intra, 0.0))
    return np.asarray(out, dtype=np.float64)


def step_time(
    perf: PerfParams,
    num_nodes: ArrayLike,
    num_replicas: ArrayLike,
    atomic_bsz: ArrayLike,
) -> FloatArray:
    """Seconds of one optimizer step without accumulation: (T_grad^g + T_sync^g)^(1/g).

    Returns:
        Array of the broadcast shape of the three arguments.
    """
    t_grad = compute_time(perf, atomic_bsz)
    t_sync = sync_time(perf, num_nodes, num_replicas)
    t_grad, t_sync = np.broadcast_arrays(t_grad, t_sync)
    return combine_times(t_grad, t_sync, perf.gamma)


def combine_times(t_grad: FloatArray, t_sync: FloatArray, gamma: float) -> FloatArray:
    """(t_grad^gamma + t_sync^gamma)^(1/gamma) elementwise, exactly t_grad where t_sync is 0.

    Computed as max * (1 + (min / max)^gamma)^(1/gamma), so that a large gamma never
    overflows, with :mod:`deepboot.perf.detmath` (the same bits on every machine).

    Args:
        t_grad: Positive compute times.
        t_sync: Non-negative sync times, the same shape.
        gamma: The overlap exponent, >= 1.
    """
    synced = t_sync > 0
    top = np.maximum(t_grad, t_sync)
    # Rows without sync get ratio 1 (any finite value): their result is replaced below.
    ratio = np.where(synced, np.minimum(t_grad, t_sync) / top, 1.0)
    tail = detmath.exp(gamma * detmath.log(ratio))
    scale = detmath.exp(detmath.log(1.0 + tail) / gamma)
    return np.asarray(np.where(synced, top * scale, t_grad), dtype=np.float64)


def efficiency_of(grad: GradParams, init_batch_size: int, batch_size: ArrayLike) -> FloatArray:
    """Statistical efficiency (phi + M0) / (phi + M) with phi = M0 * var / sqr.

    A non-positive ``grad.sqr`` means the gradient noise dominates (phi -> inf), so the
    efficiency is 1 at every batch size. A negative variance is treated as 0.

    Returns:
        Array of ``batch_size``'s shape.
    """
    m = np.asarray(batch_size, dtype=np.float64)
    m0 = float(init_batch_size)
    var = max(grad.var, 0.0)
    if grad.sqr <= 0.0 or not math.isfinite(grad.sqr):
        return np.ones_like(m)
    phi = m0 * var / grad.sqr
    return np.asarray((phi + m0) / (phi + m), dtype=np.float64)


def fixed_batch_split(num_replicas: int, batch_size: int, limits: BatchLimits) -> tuple[int, int]:
    """Split a fixed total batch over ``num_replicas`` GPUs (the reference update_local_bsz).

    local = ceil(B / K); accum = ceil(local / max_local) - 1, at least 1 when K == 1 and
    B > M0 (gradient statistics need two micro-batches); atomic = ceil(local / (accum + 1)),
    then capped so that K * atomic * (accum + 1) <= max_batch_size (never below 1).

    Args:
        num_replicas: K >= 1.
        batch_size: Requested total batch B >= 1.
        limits: The application's batch limits.

    Returns:
        ``(atomic_bsz, accum_steps)``.

    Raises:
        ValueError: ``num_replicas`` or ``batch_size`` is below 1.
    """
    if num_replicas < 1 or batch_size < 1:
        raise ValueError(
            f"need num_replicas >= 1 and batch_size >= 1; got {num_replicas}, {batch_size}"
        )
    # Scalar twin of fixed_batch_split_array (the simulator calls this per epoch).
    local = math.ceil(batch_size / num_replicas - _EPS)
    accum = max(math.ceil(local / limits.max_local_bsz - _EPS) - 1, 0)
    if num_replicas == 1 and batch_size > limits.init_batch_size:
        accum = max(accum, 1)
    atomic = math.ceil(local / (accum + 1) - _EPS)
    cap = math.floor(limits.max_batch_size / (num_replicas * (accum + 1)))
    return max(min(atomic, cap), 1), accum


def fixed_batch_split_array(
    num_replicas: ArrayLike, batch_size: ArrayLike, limits: BatchLimits
) -> tuple[IntArray, IntArray]:
    """Vectorized :func:`fixed_batch_split`; entries with 0 replicas give (0, 0).

    Returns:
        ``(atomic_bsz, accum_steps)``, int arrays of the broadcast shape.
    """
    k = np.asarray(num_replicas, dtype=np.int64)
    b = np.asarray(batch_size, dtype=np.float64)
    k, b = np.broadcast_arrays(k, b)
    safe_k = np.maximum(k, 1)
    local = np.ceil(b / safe_k - _EPS)
    accum = np.ceil(local / limits.max_local_bsz - _EPS) - 1
    accum = np.maximum(accum, 0)
    accum = np.where((k == 1) & (b > limits.init_batch_size), np.maximum(accum, 1), accum)
    atomic = np.ceil(local / (accum + 1) - _EPS)
    cap = np.floor(limits.max_batch_size / (safe_k * (accum + 1)))
    atomic = np.maximum(np.minimum(atomic, cap), 1)
    atomic = np.where(k > 0, atomic, 0)
    accum = np.where(k > 0, accum, 0)
    return atomic.astype(np.int64), accum.astype(np.int64)


def _candidates(
    lim: BatchLimits, k: IntArray, accumulation: bool
) -> tuple[FloatArray, FloatArray, npt.NDArray[np.bool_]]:
    """The candidate split of every total batch :meth:`GoodputModel.optimize` tries.

    Args:
        lim: The batch limits.
        k: Replica counts, shape (P,).
        accumulation: Allow gradient accumulation.

    Returns:
        ``(atomic, accum, feasible)``: float arrays of shape (NUM_CANDIDATES, P), one
        column per replica count, and the (P,) mask of counts with a feasible batch.
    """
    kf = k.astype(np.float64)
    lo = np.maximum(float(lim.init_batch_size), lim.min_local_bsz * kf)
    feasible = lo <= lim.max_batch_size
    hi = np.full_like(lo, float(lim.max_batch_size))
    lo = np.minimum(lo, hi)
    # (NUM_CANDIDATES, P): one column per query; detmath, not np.geomspace, whose
    # kernels (and so the candidates) depend on the CPU.
    batch = detmath.geomspace(lo, hi, NUM_CANDIDATES)
    local = batch / kf
    if accumulation:
        accum = np.ceil(local / lim.max_local_bsz - _EPS) - 1
        accum = np.maximum(accum, 0)
        # One replica estimates gradient noise from micro-batches, so it needs >= 2.
        needs_two = (k == 1) & (local > lim.init_batch_size + _EPS)
        accum = np.where(needs_two, np.maximum(accum, 1), accum)
    else:
        accum = np.zeros_like(local)
    atomic = np.ceil(local / (accum + 1) - _EPS)
    return atomic, accum, feasible


_TABLE_MAX_K = 4096
"""Largest replica count the shared candidate tables cover (beyond: the reference)."""


def _last_feasible(lim: BatchLimits) -> int | None:
    """The largest K with a feasible batch (0 if none), or None when every K has one."""
    if float(lim.init_batch_size) > lim.max_batch_size:
        return 0
    if lim.min_local_bsz <= 0:
        return None
    last = lim.max_batch_size // lim.min_local_bsz
    # Feasibility is lim.min_local_bsz * float(K) <= max_batch_size, as in _candidates.
    while last > 0 and lim.min_local_bsz * float(last) > lim.max_batch_size:
        last -= 1
    while lim.min_local_bsz * float(last + 1) <= lim.max_batch_size:
        last += 1
    return last


@dataclass(frozen=True, slots=True)
class _CandidateTable:
    """The candidates of :meth:`GoodputModel.optimize` for K = 1..kmax, per limits.

    Row K holds replica count K's candidates; row 0 stands for every K > kmax, which
    then has no feasible batch (kmax is the last feasible K, or the table is extended
    before such a K is queried). Columns are the NUM_CANDIDATES candidates, in the
    order optimize tries them.
    """

    kmax: int
    complete: bool
    """Every K > kmax has no feasible batch."""
    atomic: FloatArray
    """(kmax + 1, NUM_CANDIDATES) micro-batch of each candidate."""
    accum: FloatArray
    """Accumulation steps of each candidate."""
    total: FloatArray
    """K * atomic * (accum + 1): the total batch each candidate really runs."""
    valid: npt.NDArray[np.bool_]
    """Feasible K and micro-batch within [min_local_bsz, max_local_bsz]."""
    feasible: npt.NDArray[np.bool_]
    """(kmax + 1,) whether the row's K has a feasible batch."""
    retro: FloatArray
    """(kmax + 1,) max(K - 2, 0), the replicas past the first two (sync_time)."""
    multi: npt.NDArray[np.bool_]
    """(kmax + 1,) K > 1."""
    limits_key: tuple[BatchLimits, bool]
    """The (limits, accumulation) the table was built for."""

    @staticmethod
    def build(lim: BatchLimits, accumulation: bool, kmax: int, complete: bool) -> _CandidateTable:
        ks = np.arange(1, kmax + 1, dtype=np.int64)
        cand_atomic, cand_accum, feasible = _candidates(lim, ks, accumulation)
        # Row 0: any K past kmax (infeasible; never scored).
        atomic = np.ascontiguousarray(np.hstack((np.ones((NUM_CANDIDATES, 1)), cand_atomic)).T)
        accum = np.ascontiguousarray(np.hstack((np.zeros((NUM_CANDIDATES, 1)), cand_accum)).T)
        k_rows = np.concatenate(([1], ks))
        # As GoodputModel.goodput: (K * m) * (s + 1), in float.
        total = k_rows.astype(np.float64)[:, None] * atomic * (accum + 1)
        feas = np.concatenate(([False], feasible))
        valid = (atomic >= lim.min_local_bsz) & (atomic <= lim.max_local_bsz) & feas[:, None]
        return _CandidateTable(
            kmax=kmax,
            complete=complete,
            atomic=atomic,
            accum=accum,
            total=total,
            valid=valid,
            feasible=feas,
            retro=np.maximum(k_rows - 2, 0).astype(np.float64),
            multi=k_rows > 1,
            limits_key=(lim, accumulation),
        )

    def lookup(self, k: IntArray, top: int) -> IntArray:
        """Rows of queries K (each >= 1, the largest ``top``).

        The result may be ``k`` itself: never write to it.
        """
        return k if top <= self.kmax else np.where(k <= self.kmax, k, 0)

    def throughput(self, perf: PerfParams, n: IntArray, rows: IntArray) -> FloatArray:
        """Throughput of every candidate of the queries (n, rows), invalid ones included.

        The operations of :meth:`GoodputModel.throughput` element by element. A value
        depends only on the parameters, whether N > 1, and the row (K), not on the
        gradient statistics, which change every epoch while the parameters change only
        with a refit: so the rows are memoized per (parameters, limits, accumulation)
        (:data:`_THROUGHPUT`) and only the rows never computed are computed, in one
        vectorized pass. Each element is computed by the same operations whatever else
        is computed with it, so the memo never changes a value.

        Returns:
            Shape (P, NUM_CANDIDATES) for the P queries; a fresh array.
        """
        inter = (n > 1).view(np.int8)
        memo = _throughput_memo(perf, self, int(rows.max()))
        done = memo.done[inter, rows]
        if not done.all():
            todo = ~done
            r, i = rows[todo], inter[todo]
            # The NumPy formulation, element by element, compiled (sync_time: only
            # whether N > 1, and K, matter); tests/perf/test_goodputkernel.py.
            out = np.empty((r.size, NUM_CANDIDATES))
            params = np.array(
                [
                    perf.alpha_c,
                    perf.beta_c,
                    perf.alpha_n,
                    perf.beta_n,
                    perf.alpha_r,
                    perf.beta_r,
                    perf.gamma,
                ],
                dtype=np.float64,
            )
            throughput_rows(
                params, self.atomic, self.accum, self.total, self.retro, self.multi, r, i, out
            )
            memo.rows[i, r] = out
            memo.done[i, r] = True
        return memo.rows[inter, rows]

    def scores(self, model: GoodputModel, n: IntArray, rows: IntArray) -> FloatArray:
        """Goodput of every candidate of the queries (n, rows), 0 where invalid.

        The operations of :meth:`GoodputModel.goodput` element by element, hence the
        same values as :meth:`GoodputModel.optimize_reference` scores.

        Returns:
            Shape (P, NUM_CANDIDATES) for the P queries.
        """
        good = self.throughput(model.perf, n, rows)
        grad = model.grad
        if grad.sqr > 0.0 and math.isfinite(grad.sqr):
            m0 = float(model.limits.init_batch_size)
            phi = m0 * max(grad.var, 0.0) / grad.sqr
            good = good * ((phi + m0) / (phi + self.total[rows]))
        return np.where(self.valid[rows], good, 0.0)


@dataclass(slots=True)
class _ThroughputRows:
    """Memoized :meth:`_CandidateTable.throughput` rows of one model's parameters."""

    rows: FloatArray
    """(2, R, NUM_CANDIDATES): [N > 1][row] -> throughput of each candidate."""
    done: npt.NDArray[np.bool_]
    """(2, R): which rows hold a value."""


_THROUGHPUT: dict[tuple[PerfParams, BatchLimits, bool, int], _ThroughputRows] = {}
"""Throughput rows by (parameters, limits, accumulation, table size); the oldest
entry goes when it holds _THROUGHPUT_SIZE (a job's parameters change with each refit,
so only recent ones are asked again)."""
_THROUGHPUT_SIZE = 256


def _throughput_memo(perf: PerfParams, table: _CandidateTable, top: int) -> _ThroughputRows:
    """The memo of ``perf`` on ``table``'s candidates, holding rows 0..``top`` at least.

    Row r >= 1 is replica count r's candidates in every table of the same limits, and
    row 0 the same placeholder, but a table's size is part of the key anyway (a table
    is rebuilt larger rarely), so a memo never outlives the table it was built for.
    """
    lim, accumulation = table.limits_key
    key = (perf, lim, accumulation, table.kmax)
    memo = _THROUGHPUT.get(key)
    if memo is not None and top < memo.done.shape[1]:
        return memo
    size = max(top + 1, 2 * (0 if memo is None else memo.done.shape[1]), 16)
    size = min(max(size, top + 1), table.kmax + 1)
    grown = _ThroughputRows(np.zeros((2, size, NUM_CANDIDATES)), np.zeros((2, size), dtype=bool))
    if memo is not None:
        old = memo.done.shape[1]
        grown.rows[:, :old] = memo.rows
        grown.done[:, :old] = memo.done
    elif len(_THROUGHPUT) >= _THROUGHPUT_SIZE:
        del _THROUGHPUT[next(iter(_THROUGHPUT))]
    _THROUGHPUT[key] = grown
    return grown


_TABLES: dict[tuple[BatchLimits, bool], _CandidateTable] = {}
"""Candidate tables by (limits, accumulation); cleared when it holds 256."""


def _fast_table(lim: BatchLimits, accumulation: bool, low: int, top: int) -> _CandidateTable | None:
    """The shared candidate table covering replica counts ``low``..``top``, or None
    outside its domain (K below 1, non-positive limits, a feasible K past _TABLE_MAX_K).
    """
    if low < 1:
        return None
    key = (lim, accumulation)
    table = _TABLES.get(key)
    if table is not None and (top <= table.kmax or table.complete):
        return table
    if min(lim.init_batch_size, lim.max_batch_size, lim.max_local_bsz) < 1:
        return None
    last = _last_feasible(lim)
    need = top if last is None else min(top, last)
    if need > _TABLE_MAX_K:
        return None
    kmax = max(2 * need, 64, 0 if table is None else table.kmax)
    if last is not None:
        kmax = min(kmax, last)
    kmax = max(min(kmax, _TABLE_MAX_K), need)
    if len(_TABLES) >= 256:
        _TABLES.clear()
    table = _CandidateTable.build(lim, accumulation, kmax, last is not None and kmax == last)
    _TABLES[key] = table
    return table


def _flat_queries(
    num_nodes: ArrayLike, num_replicas: ArrayLike
) -> tuple[tuple[int, ...], IntArray, IntArray]:
    """(broadcast shape, N flattened, K flattened), both int64."""
    n_in = np.asarray(num_nodes, dtype=np.int64)
    k_in = np.asarray(num_replicas, dtype=np.int64)
    if n_in.shape == k_in.shape:
        return n_in.shape, n_in.ravel(), k_in.ravel()
    shape = np.broadcast(n_in, k_in).shape
    return shape, np.broadcast_to(n_in, shape).ravel(), np.broadcast_to(k_in, shape).ravel()


@dataclass(frozen=True, slots=True)
class GoodputModel:
    """One job's goodput model: fitted throughput, gradient statistics, batch limits.

    Immutable; every method is pure and vectorized (see the module docstring).
    """

    perf: PerfParams
    grad: GradParams
    limits: BatchLimits

    def throughput(
        self,
        num_nodes: ArrayLike,
        num_replicas: ArrayLike,
        atomic_bsz: ArrayLike,
        accum_steps: ArrayLike,
    ) -> FloatArray:
        """Samples per second: K * m * (s + 1) / T_iter.

        Returns:
            Array of the broadcast shape of the four arguments.
        """
        k = np.asarray(num_replicas, dtype=np.float64)
        m = np.asarray(atomic_bsz, dtype=np.float64)
        s = np.asarray(accum_steps, dtype=np.float64)
        t_iter = step_time(self.perf, num_nodes, num_replicas, m) + s * compute_time(self.perf, m)
        return np.asarray(k * m * (s + 1) / t_iter, dtype=np.float64)

    def efficiency(self, batch_size: ArrayLike) -> FloatArray:
        """Statistical efficiency at total batch ``batch_size`` (see :func:`efficiency_of`)."""
        return efficiency_of(self.grad, self.limits.init_batch_size, batch_size)

    def goodput(
        self,
        num_nodes: ArrayLike,
        num_replicas: ArrayLike,
        atomic_bsz: ArrayLike,
        accum_steps: ArrayLike,
    ) -> FloatArray:
        """throughput * efficiency, in samples per second at the initial batch size.

        Returns:
            Array of the broadcast shape of the four arguments.
        """
        k = np.asarray(num_replicas, dtype=np.float64)
        m = np.asarray(atomic_bsz, dtype=np.float64)
        s = np.asarray(accum_steps, dtype=np.float64)
        tput = self.throughput(num_nodes, k, m, s)
        return np.asarray(tput * self.efficiency(k * m * (s + 1)), dtype=np.float64)

    def optimize(
        self,
        num_nodes: ArrayLike,
        num_replicas: ArrayLike,
        accumulation: bool = True,
    ) -> tuple[FloatArray, IntArray, IntArray]:
        """Best goodput over total batch sizes, and the per-GPU batch/accumulation for it.

        Tries ``NUM_CANDIDATES`` total batches M geometrically spaced between
        max(M0, K * min_local_bsz) and max_batch_size. For each, local = M / K; with
        ``accumulation`` the local batch is split into (accum + 1) micro-batches of at
        most max_local_bsz (at least 2 when K == 1 and local > M0); candidates whose
        micro-batch falls outside [min_local_bsz, max_local_bsz] score 0.

        Unlike the reference (which never sees it, since Pollux caps replicas), when
        K * min_local_bsz > max_batch_size no batch is feasible: goodput is 0,
        atomic_bsz = max(1, max_batch_size // K) and accum_steps = 0.

        The result is bit-for-bit that of :meth:`optimize_reference`; the candidates,
        which depend only on the limits and K, come from a table shared by every model
        with the same limits, so only the goodput of each candidate is computed here.

        Args:
            num_nodes: N >= 1, broadcast with ``num_replicas``.
            num_replicas: K >= N.
            accumulation: Allow gradient accumulation.

        Returns:
            ``(goodput, atomic_bsz, accum_steps)``, arrays of the broadcast shape.
        """
        shape, n, k = _flat_queries(num_nodes, num_replicas)
        top = int(k.max()) if k.size else 0
        table = _fast_table(self.limits, accumulation, int(k.min()), top) if k.size else None
        if table is None:
            return self.optimize_reference(num_nodes, num_replicas, accumulation)
        rows = table.lookup(k, top)
        good = table.scores(self, n, rows)
        best = np.argmax(good, axis=1)
        out_good = good[np.arange(rows.size), best]
        atomic = table.atomic[rows, best].astype(np.int64)
        accum = table.accum[rows, best].astype(np.int64)
        feasible = table.feasible[rows]
        if not feasible.all():
            fallback = np.maximum(self.limits.max_batch_size // np.maximum(k, 1), 1)
            atomic = np.where(feasible, atomic, fallback)
            accum = np.where(feasible, accum, 0)
        return out_good.reshape(shape), atomic.reshape(shape), accum.reshape(shape)

    def optimize_goodput(
        self,
        num_nodes: ArrayLike,
        num_replicas: ArrayLike,
        accumulation: bool = True,
    ) -> FloatArray:
        """``optimize(num_nodes, num_replicas, accumulation)[0]``, bit for bit, without
        the batch and accumulation choice (the speedup tables need only the goodput)."""
        shape, n, k = _flat_queries(num_nodes, num_replicas)
        top = int(k.max()) if k.size else 0
        table = _fast_table(self.limits, accumulation, int(k.min()), top) if k.size else None
        if table is None:
            return self.optimize_reference(num_nodes, num_replicas, accumulation)[0]
        rows = table.lookup(k, top)
        good = table.scores(self, n, rows)
        best: FloatArray = good[np.arange(rows.size), np.argmax(good, axis=1)]
        return best.reshape(shape)

    def optimize_with_base(
        self,
        num_nodes: ArrayLike,
        num_replicas: ArrayLike,
        accumulation: bool = True,
    ) -> tuple[float, FloatArray]:
        """``optimize(1, 1)`` and ``optimize(num_nodes, num_replicas)`` goodputs in one pass.

        Returns:
            ``(float(optimize(1, 1, accumulation)[0]),
            optimize(num_nodes, num_replicas, accumulation)[0])``, bit for bit.
        """
        shape, n, k = _flat_queries(num_nodes, num_replicas)
        # Range of K over the queries and the (1, 1) one.
        top = max(int(k.max()), 1) if k.size else 1
        low = min(int(k.min()), 1) if k.size else 1
        table = _fast_table(self.limits, accumulation, low, top)
        if table is None:
            base, _, _ = self.optimize(1, 1, accumulation)
            good, _, _ = self.optimize(num_nodes, num_replicas, accumulation)
            return float(base), good
        # Row 0 is the (1, 1) query, the rest the batch: each in the arithmetic of its
        # own optimize call.
        unit = np.ones(1, dtype=np.int64)
        rows = np.concatenate((table.lookup(unit, 1), table.lookup(k, top)))
        good = table.scores(self, np.concatenate((unit, n)), rows)
        best = good[np.arange(rows.size), np.argmax(good, axis=1)]
        return float(best[0]), best[1:].reshape(shape)

    def optimize_reference(
        self,
        num_nodes: ArrayLike,
        num_replicas: ArrayLike,
        accumulation: bool = True,
    ) -> tuple[FloatArray, IntArray, IntArray]:
        """The straightforward :meth:`optimize`: every candidate built and scored per call.

        Same contract and results as :meth:`optimize`; kept as its specification (the
        tests compare the two) and as its fallback outside the shared tables' domain
        (no query, some K < 1, a limit below 1, a feasible K past 4096).
        """
        lim = self.limits
        shape = np.broadcast(np.asarray(num_nodes), np.asarray(num_replicas)).shape
        n = np.broadcast_to(np.asarray(num_nodes, dtype=np.int64), shape).ravel()
        k = np.broadcast_to(np.asarray(num_replicas, dtype=np.int64), shape).ravel()
        atomic, accum, feasible = _candidates(lim, k, accumulation)
        good = self.goodput(n, k, atomic, accum)
        valid = (atomic >= lim.min_local_bsz) & (atomic <= lim.max_local_bsz) & feasible
        good = np.where(valid, good, 0.0)
        best = np.argmax(good, axis=0)
        cols = np.arange(good.shape[1])
        out_good = good[best, cols]
        out_atomic = atomic[best, cols].astype(np.int64)
        out_accum = accum[best, cols].astype(np.int64)
        fallback = np.maximum(lim.max_batch_size // np.maximum(k, 1), 1)
        out_atomic = np.where(feasible, out_atomic, fallback)
        out_accum = np.where(feasible, out_accum, 0)
        return (
            out_good.reshape(shape),
            out_atomic.reshape(shape).astype(np.int64),
            out_accum.reshape(shape).astype(np.int64),
        )

    def fixed_batch(
        self, num_nodes: ArrayLike, num_replicas: ArrayLike, batch_size: ArrayLike
    ) -> tuple[FloatArray, IntArray, IntArray]:
        """Goodput when the total batch is fixed at ``batch_size`` (Tiresias/Optimus/AFS).

        The split is :func:`fixed_batch_split_array`; entries with 0 replicas give 0.

        Returns:
            ``(goodput, atomic_bsz, accum_steps)``, arrays of the broadcast shape.
        """
        n = np.asarray(num_nodes, dtype=np.int64)
        k = np.asarray(num_replicas, dtype=np.int64)
        atomic, accum = fixed_batch_split_array(k, batch_size, self.limits)
        n, k, atomic, accum = np.broadcast_arrays(n, k, atomic, accum)
        with np.errstate(divide="ignore", invalid="ignore"):
            good = self.goodput(np.maximum(n, 1), np.maximum(k, 1), np.maximum(atomic, 1), accum)
        good = np.where(k > 0, good, 0.0)
        return np.asarray(good, dtype=np.float64), atomic, accum


def initial_batch_size(limits: BatchLimits, num_replicas: int) -> int:
    """Total batch of an adaptive job before it has a model: max(M0, K * min_local_bsz)."""
    return max(limits.init_batch_size, limits.min_local_bsz * num_replicas)


def select_batch(
    model: GoodputModel | None,
    limits: BatchLimits,
    num_nodes: int,
    num_replicas: int,
    target_batch_size: int | None = None,
) -> tuple[int, int]:
    """The per-GPU batch and accumulation a job runs with (the reference update_local_bsz).

    * ``target_batch_size`` given: :func:`fixed_batch_split` of it.
    * adaptive with no model yet: fixed split of :func:`initial_batch_size`.
    * adaptive with a model: :meth:`GoodputModel.optimize` with accumulation, its
      micro-batch capped so that the total stays within max_batch_size.

    Args:
        model: The job's fitted model, or None before it has run.
        limits: The application's batch limits.
        num_nodes: N >= 1.
        num_replicas: K >= N.
        target_batch_size: Fixed total batch, or None for adaptive.

    Returns:
        ``(atomic_bsz, accum_steps)`` with atomic_bsz >= 1.

    Raises:
        ValueError: ``num_replicas`` is below 1.
    """
    if num_replicas < 1:
        raise ValueError(f"need num_replicas >= 1; got {num_replicas}")
    batch = target_batch_size
    if batch is None and model is None:
        batch = initial_batch_size(limits, num_replicas)
    if batch is not None:
        return fixed_batch_split(num_replicas, batch, limits)
    assert model is not None
    _, atomic_arr, accum_arr = model.optimize(num_nodes, num_replicas, accumulation=True)
    atomic, accum = int(atomic_arr), int(accum_arr)
    cap = limits.max_batch_size // (num_replicas * (accum + 1))
    return max(min(atomic, cap), 1), accum
