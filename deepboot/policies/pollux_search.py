"""Search for the Pollux allocation matrix (jobs x nodes) of best fitness.

The reference runs NSGA-II (population 100, 100 generations) over the matrix. The
fitness is a sum of per-job costs that depend only on each job's (nodes, replicas,
changed?) (see :mod:`deepboot.policies.pollux_fitness`), so this module instead:

1. **Counts by dynamic programming.** A group knapsack over jobs chooses each job's
   GPU count (0, or min..max replicas) minimizing the summed cost under the total
   capacity, valuing k GPUs at the fewest nodes that hold k, or at the job's current
   placement when k is its current count and keeping it is cheaper (no realloc
   factor). Its optimum is a lower bound on every feasible matrix when no job runs
   faster on more nodes (true of fitted Pollux models): reaching it ends the search.
2. **Packing** in three orders (kept rows first; by count; by regret, i.e. what a job
   loses without its fewest nodes): a single node when one fits (best fit), else the
   cheaper of the fewest nodes not holding another distributed job and the fullest
   single node. Each packing is polished by **local search**: best-improvement over
   one-GPU moves (grow, shrink, transfer a GPU between jobs on one node, move a GPU
   between nodes, swap two jobs' GPUs across nodes) and whole-job consolidation.
3. **Learning rounds.** Jobs that packing could not give their planned count or node
   count teach the knapsack the cost they really got, and steps 1-2 repeat.
4. If the lower bound is still not reached: local search from the current
   allocation, a large-neighbourhood search (free one node, or two on small
   clusters, and redo steps 1-3 for the jobs there and the idle ones), and a short
   tabu search.

Everything is deterministic (ties go to the lowest index); no randomness is needed.
All constraints hold at every step: node capacity, min/max replicas, at most
``max_nodes_per_job`` nodes per job, and (with ``interference_avoidance``) at most one
distributed job per node.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from deepboot.policies.pollux_fitness import BoolArray, FloatArray, IntArray, PolluxProblem

_INF = np.inf

_PAIR_NODES = 8
"""Clusters up to this many nodes also try freeing every pair of nodes."""


class PackOrder(enum.Enum):
    """The order in which :func:`pack_counts` places jobs.

    KEEP_FIRST: kept rows first, then by descending count.
    SIZE: by descending count (kept rows in turn, so a small kept job cannot take the
        only node a big job fits on).
    REGRET: by descending regret: how much a job loses when it cannot have the fewest
        nodes (split over one more node, or one GPU fewer).

    Within each order, jobs that lose nothing when split go last: they take whatever
    fragments the others leave.
    """

    KEEP_FIRST = "keep_first"
    SIZE = "size"
    REGRET = "regret"


class MoveKind(enum.IntEnum):
    """Local-search moves; on equal gain the lower value wins."""

    GROW = 0
    SHRINK = 1
    TRANSFER = 2
    MOVE = 3
    SWAP = 4
    CONSOLIDATE = 5


@dataclass(frozen=True, slots=True)
class Move:
    """One candidate move: its cost change (negative improves) and its cells.

    ``cells`` are (job, node, +1 or -1) GPU changes, applied in order.
    """

    gain: float
    kind: MoveKind
    cells: tuple[tuple[int, int, int], ...]


def solve(problem: PolluxProblem) -> IntArray:
    """The best allocation matrix found for ``problem``.

    Returns:
        (J, V) int array of GPUs per job (reference order) and node (ascending id).
    """
    num_jobs, num_nodes = problem.num_jobs, problem.num_nodes
    if num_jobs == 0 or num_nodes == 0:
        return np.zeros((num_jobs, num_nodes), dtype=np.int64)
    # Without learned costs the knapsack optimum is a lower bound on every feasible
    # matrix whenever no job runs faster on more nodes (inter-node sync no cheaper than
    # intra-node, as fitted models have it): reaching it ends the search.
    counts, keep, lower = dp_counts(problem)
    empty = np.zeros_like(problem.base)
    rounds = problem.config.max_search_rounds
    best = plan_and_pack(problem, empty, np.arange(num_jobs), lower, rounds, (counts, keep))
    best_cost = float(problem.matrix_cost(best).sum())
    if best_cost <= lower + _tolerance(lower):
        return best
    other = local_search(problem, repair_base(problem))
    if float(problem.matrix_cost(other).sum()) < best_cost - _tolerance(best_cost):
        best = other
    best = ruin_and_recreate(problem, best, lower)
    return tabu_search(problem, best, lower)


def plan_and_pack(
    problem: PolluxProblem,
    start: IntArray,
    jobs: IntArray,
    lower: float,
    rounds: int,
    first: tuple[IntArray, BoolArray] | None = None,
) -> IntArray:
    """Size ``jobs`` by knapsack, pack them around ``start``, polish; learn and repeat.

    Each round packs the knapsack's plan in every :class:`PackOrder` and runs local
    search on each packing. Jobs that missed their planned count or node count
    teach the next round's knapsack the cost they really got. Rounds stop when the
    plan repeats, when every job got its plan, or at ``lower``.

    Args:
        problem: The round's problem.
        start: Feasible (J, V) matrix; rows of ``jobs`` must be empty.
        jobs: Indices of the jobs to size and place.
        lower: Summed cost at which nothing better exists.
        rounds: Most knapsack rounds.
        first: The first round's ``(counts, keep)`` when already known.

    Returns:
        The best feasible (J, V) matrix found.
    """
    free = problem.capacity - start.sum(axis=0)
    best, best_cost = start, _INF
    learned: dict[tuple[int, int], float] = {}
    plans: set[bytes] = set()
    for _ in range(rounds):
        if first is not None and not plans:
            counts, keep = first
        else:
            counts, keep, _ = dp_counts(problem, learned, jobs, free)
        plan = counts.tobytes() + keep.tobytes()
        if plan in plans:
            break
        plans.add(plan)
        round_best: tuple[float, IntArray] | None = None
        regret = _regret(problem, counts)
        orders: set[tuple[int, ...]] = set()
        for order in PackOrder:
            sequence = _pack_sequence(order, counts, keep, regret)
            if sequence in orders:
                continue
            orders.add(sequence)
            packed = pack_counts(problem, counts, keep, start, order, regret)
            matrix = local_search(problem, packed)
            cost = float(problem.matrix_cost(matrix).sum())
            if round_best is None or cost < round_best[0] - _tolerance(cost):
                round_best = (cost, packed)
            if cost < best_cost - _tolerance(best_cost):
                best, best_cost = matrix, cost
            if best_cost <= lower + _tolerance(lower):
                return best
        assert round_best is not None
        packed = round_best[1][jobs]
        # Teach the knapsack what packing really gave the jobs that missed their plan.
        planned = counts[jobs]
        missed = (packed.sum(axis=1) != planned) | (
            np.count_nonzero(packed, axis=1) > nodes_for(free, planned)
        )
        missed |= keep[jobs] & ~np.all(packed == problem.base[jobs], axis=1)
        if not np.any(missed):
            break
        realized = problem.matrix_cost(round_best[1])[jobs]
        for i in np.flatnonzero(missed):
            key = (int(jobs[i]), int(planned[i]))
            learned[key] = max(learned.get(key, -_INF), float(realized[i]))
    return best


def _neighbourhoods(num_nodes: int, pairs: bool) -> list[tuple[int, ...]]:
    singles: list[tuple[int, ...]] = [(v,) for v in range(num_nodes)]
    if not pairs:
        return singles
    return singles + [(v, w) for v in range(num_nodes) for w in range(v + 1, num_nodes)]


def ruin_and_recreate(problem: PolluxProblem, matrix: IntArray, lower: float) -> IntArray:
    """Large-neighbourhood search: free one node (or two), then re-size and re-pack.

    For each node (pairs of nodes too on small clusters), the jobs on it and the jobs
    holding nothing are cleared and re-placed by :func:`plan_and_pack` (two rounds);
    a strictly better result replaces ``matrix``. Passes repeat while they improve, at
    most ``max_search_rounds`` times.

    Returns:
        A feasible (J, V) matrix at least as good as ``matrix``.
    """
    best = matrix
    best_cost = float(problem.matrix_cost(best).sum())
    groups = _neighbourhoods(problem.num_nodes, problem.num_nodes <= _PAIR_NODES)
    for _ in range(problem.config.max_search_rounds):
        improved = False
        for group in groups:
            if best_cost <= lower + _tolerance(lower):
                return best
            on_group = best[:, list(group)].sum(axis=1) > 0
            if not np.any(on_group):
                continue
            jobs = np.flatnonzero(on_group | (best.sum(axis=1) == 0))
            start = best.copy()
            start[jobs] = 0
            trial = plan_and_pack(problem, start, jobs, lower, 2)
            cost = float(problem.matrix_cost(trial).sum())
            if cost < best_cost - _tolerance(best_cost):
                best, best_cost, improved = trial, cost, True
        if not improved:
            break
    return best


def _tolerance(total: float) -> float:
    return 1e-10 * (1.0 + abs(total)) if np.isfinite(total) else 0.0


def _lower_bound(problem: PolluxProblem) -> IntArray:
    """Fewest GPUs a running job may hold: max(min_replicas, 1)."""
    return np.maximum(problem.min_replicas, 1)


def _row_allowed(
    problem: PolluxProblem, row: IntArray, free: IntArray, owner: IntArray, j: int
) -> bool:
    k = int(row.sum())
    n = int(np.count_nonzero(row))
    if k < int(_lower_bound(problem)[j]) or k > int(problem.max_replicas[j]):
        return False
    if n > problem.config.max_nodes_per_job or np.any(row > free):
        return False
    return not (problem.config.interference_avoidance and n > 1 and np.any(owner[row > 0] >= 0))


def _place_row(matrix: IntArray, free: IntArray, owner: IntArray, j: int, row: IntArray) -> None:
    matrix[j] = row
    free -= row
    if np.count_nonzero(row) > 1:
        owner[row > 0] = j


def repair_base(problem: PolluxProblem) -> IntArray:
    """The current allocation, minus the jobs that no longer fit the constraints.

    Jobs are admitted in reference order; a job whose current row breaks a bound
    (capacity, replica limits, node count, one distributed job per node) holds nothing.

    Returns:
        (J, V) int array.
    """
    matrix = np.zeros_like(problem.base)
    free = problem.capacity.copy()
    owner = np.full(problem.num_nodes, -1, dtype=np.int64)
    for j in range(problem.num_jobs):
        row = problem.base[j]
        if row.sum() > 0 and _row_allowed(problem, row, free, owner, j):
            _place_row(matrix, free, owner, j, row)
    return matrix


def nodes_for(capacity: IntArray, replicas: IntArray) -> IntArray:
    """Fewest nodes whose capacities hold ``replicas`` GPUs (0 for 0 replicas).

    Args:
        capacity: (V,) GPUs per node.
        replicas: Any-shape int array; entries above the total get the node count V.
    """
    cum = np.cumsum(np.sort(capacity)[::-1])
    n = np.searchsorted(cum, replicas, side="left") + 1
    n = np.minimum(n, len(capacity))
    return np.where(replicas > 0, n, 0).astype(np.int64)


def dp_counts(
    problem: PolluxProblem,
    learned: Mapping[tuple[int, int], float] | None = None,
    jobs: IntArray | None = None,
    free: IntArray | None = None,
) -> tuple[IntArray, BoolArray, float]:
    """GPU counts per job by group knapsack, and whether each keeps its placement.

    Args:
        problem: The round's problem.
        learned: (job, count) -> a cost that job really got when packed with that
            count; it replaces the knapsack's estimate when higher.
        jobs: Indices of the jobs to size (default: all); the others get 0.
        free: (V,) GPUs available per node (default: the capacity).

    Returns:
        ``(counts, keep, bound)``: (J,) ints, (J,) bools, and the optimal summed cost
        of the sized jobs (their cost if every one gets its assumed nodes).
    """
    num_jobs = problem.num_jobs
    subset = np.arange(num_jobs) if jobs is None else np.asarray(jobs, dtype=np.int64)
    cap = problem.capacity if free is None else free
    total = int(cap.sum())
    counts = np.zeros(num_jobs, dtype=np.int64)
    keep = np.zeros(num_jobs, dtype=bool)
    if len(subset) == 0 or total == 0:
        nothing = np.zeros(len(subset), dtype=np.int64)
        idle = problem.costs(subset, nothing, nothing, np.ones(len(subset), dtype=bool))
        return counts, keep, float(idle.sum())
    low = _lower_bound(problem)
    options: list[IntArray] = []
    for j in subset:
        top = min(int(problem.max_replicas[j]), total)
        ks = np.concatenate(([0], np.arange(int(low[j]), top + 1))).astype(np.int64)
        options.append(ks)
    flat_j = np.concatenate(
        [np.full(len(ks), j, dtype=np.int64) for j, ks in zip(subset, options, strict=True)]
    )
    flat_k = np.concatenate(options)
    flat_n = nodes_for(cap, flat_k)
    change_cost = problem.costs(flat_j, flat_n, flat_k, np.ones_like(flat_k, dtype=bool))

    base = problem.base[subset]
    base_k = base.sum(axis=1)
    base_n = np.count_nonzero(base, axis=1)
    keepable = (
        (base_k > 0)
        & ~problem.base_outside[subset]
        & (base_k >= low[subset])
        & (base_k <= problem.max_replicas[subset])
        & (base_n <= problem.config.max_nodes_per_job)
        & np.all(base <= cap, axis=1)
    )
    keep_cost = problem.costs(
        subset,
        np.where(keepable, base_n, 0),
        np.where(keepable, base_k, 0),
        np.zeros(len(subset), dtype=bool),
    )
    by_job: dict[int, list[tuple[int, float]]] = {}
    for (job, count), value in (learned or {}).items():
        by_job.setdefault(job, []).append((count, value))

    budget = np.arange(total + 1)
    dp = np.zeros(total + 1)
    choice = np.zeros((len(subset), total + 1), dtype=np.int64)
    keeps = np.zeros(len(subset), dtype=bool)
    offset = 0
    for i, (j, ks) in enumerate(zip(subset, options, strict=True)):
        cs = change_cost[offset : offset + len(ks)].copy()
        offset += len(ks)
        if keepable[i]:
            at = int(np.searchsorted(ks, base_k[i]))
            if keep_cost[i] <= cs[at]:
                cs[at] = keep_cost[i]
                keeps[i] = True
        for count, value in by_job.get(int(j), ()):
            at = int(np.searchsorted(ks, count))
            if at < len(ks) and ks[at] == count:
                cs[at] = max(cs[at], value)
        src = budget[None, :] - ks[:, None]  # (len(ks), total + 1)
        vals = np.where(src >= 0, dp[np.maximum(src, 0)], _INF) + cs[:, None]
        arg = np.argmin(vals, axis=0)
        dp = vals[arg, budget]
        choice[i] = ks[arg]

    left = total
    for i in range(len(subset) - 1, -1, -1):
        counts[subset[i]] = choice[i, left]
        left -= int(choice[i, left])
    keep[subset] = keeps & (counts[subset] == base_k)
    return counts, keep, float(dp[total])


def _job_cost(problem: PolluxProblem, j: int, row: IntArray) -> float:
    """Cost of job ``j`` holding ``row`` (GPUs per node)."""
    k = int(row.sum())
    n = int(np.count_nonzero(row))
    changed = bool(np.any(row != problem.base[j])) or bool(problem.base_outside[j])
    one = np.ones(1, dtype=np.int64)
    return float(problem.costs(one * j, one * n, one * k, np.array([changed]))[0])


def _pack_count(
    problem: PolluxProblem,
    matrix: IntArray,
    free: IntArray,
    owner: IntArray,
    j: int,
    want: int,
) -> None:
    """Give job ``j`` ``want`` GPUs on one node if possible; else the cheaper of the
    fewest nodes (not holding another distributed job) and the fullest single node."""
    cfg = problem.config
    low = int(_lower_bound(problem)[j])
    fitting = np.flatnonzero(free >= want)
    if len(fitting):
        v = fitting[np.argmin(free[fitting])]
        row = np.zeros_like(free)
        row[v] = want
        _place_row(matrix, free, owner, j, row)
        return
    options: list[IntArray] = []
    usable = (free > 0) & ((owner < 0) | (not cfg.interference_avoidance))
    cand = list(np.flatnonzero(usable)[np.argsort(-free[usable], kind="stable")])
    split = np.zeros_like(free)
    need = want
    while need > 0 and cand and np.count_nonzero(split) < cfg.max_nodes_per_job:
        fits = [v for v in cand if free[v] >= need]
        if fits:
            v = min(fits, key=lambda x: (free[x], x))
            split[v] = need
            break
        v = cand.pop(0)
        split[v] = free[v]
        need -= int(free[v])
    if split.sum() >= low:
        options.append(split)
    if free.max(initial=0) >= low:
        single = np.zeros_like(free)
        single[int(np.argmax(free))] = free.max()
        options.append(single)
    if options:
        row = min(options, key=lambda r: _job_cost(problem, j, r))
        _place_row(matrix, free, owner, j, row)


def pack_counts(
    problem: PolluxProblem,
    counts: IntArray,
    keep: BoolArray,
    start: IntArray | None = None,
    order: PackOrder = PackOrder.KEEP_FIRST,
    regret: FloatArray | None = None,
) -> IntArray:
    """GPU counts packed into a feasible matrix (see the module docstring, step 2).

    Args:
        problem: The round's problem.
        counts: (J,) GPUs wanted per job (jobs already placed in ``start`` are skipped).
        keep: (J,) whether a job keeps its current row (tried first in its turn).
        start: Feasible (J, V) matrix whose rows stay as they are (default: empty).
        order: The order jobs are placed in.
        regret: (J,) from :func:`_regret` (computed when not given).

    Returns:
        (J, V) int array; a job that cannot get ``counts[j]`` gets fewer or none.
    """
    matrix = np.zeros_like(problem.base) if start is None else start.copy()
    free = problem.capacity - matrix.sum(axis=0)
    owner = np.full(problem.num_nodes, -1, dtype=np.int64)
    for d in np.flatnonzero(np.count_nonzero(matrix, axis=1) > 1):
        owner[matrix[d] > 0] = d
    if regret is None:
        regret = _regret(problem, counts)
    placed = matrix.sum(axis=1) > 0
    for j in _pack_sequence(order, counts, keep, regret):
        if placed[j]:
            continue
        if keep[j] and _row_allowed(problem, problem.base[j], free, owner, j):
            _place_row(matrix, free, owner, j, problem.base[j])
        elif counts[j] > 0:
            _pack_count(problem, matrix, free, owner, j, int(counts[j]))
    return matrix


def _pack_sequence(
    order: PackOrder, counts: IntArray, keep: BoolArray, regret: FloatArray
) -> tuple[int, ...]:
    """Job indices (those with a count or a kept row) in ``order``."""
    todo = [j for j in range(len(counts)) if keep[j] or counts[j] > 0]

    def key(j: int) -> tuple[bool, bool, float, float, int]:
        idle = not regret[j] > 0
        if order is PackOrder.KEEP_FIRST:
            return (not keep[j], idle, -float(counts[j]), -float(regret[j]), j)
        if order is PackOrder.SIZE:
            return (False, idle, -float(counts[j]), -float(regret[j]), j)
        return (False, idle, -float(regret[j]), -float(counts[j]), j)

    return tuple(sorted(todo, key=key))


def _regret(problem: PolluxProblem, counts: IntArray) -> FloatArray:
    """(J,) cost a job loses when it cannot have its count on the fewest nodes: the
    smaller of one node more and one GPU fewer (0 for jobs that lose nothing)."""
    cap = problem.capacity
    jobs = np.arange(problem.num_jobs)
    changed = np.ones(problem.num_jobs, dtype=bool)
    n = nodes_for(cap, counts)
    here = problem.costs(jobs, n, counts, changed)
    more = np.minimum(n + 1, np.minimum(counts, problem.num_nodes))
    split = problem.costs(jobs, more, counts, changed)
    fewer_k = counts - 1
    fewer_k = np.where(fewer_k >= _lower_bound(problem), fewer_k, 0)
    fewer = problem.costs(jobs, nodes_for(cap, fewer_k), fewer_k, changed)
    return np.maximum(np.minimum(split, fewer) - here, 0.0)


def local_search(problem: PolluxProblem, start: IntArray) -> IntArray:
    """Best-improvement local search from a feasible ``start`` (not modified).

    Returns:
        A feasible (J, V) matrix at least as good as ``start``.
    """
    matrix = start.copy()
    if matrix.size == 0:
        return matrix
    for _ in range(problem.config.max_search_moves):
        total = float(problem.matrix_cost(matrix).sum())
        move = best_move(problem, matrix)
        if move is None or not move.gain < -_tolerance(total):
            break
        for job, node, change in move.cells:
            matrix[job, node] += change
    return matrix


def tabu_search(problem: PolluxProblem, start: IntArray, lower: float) -> IntArray:
    """Tabu search from ``start``: take the best move even when it worsens, but never
    touch a (job, node) cell changed in the last ``tabu_tenure`` moves, unless the move
    gives a new best. Stops after ``tabu_moves`` moves or at the lower bound.

    Returns:
        The best feasible (J, V) matrix seen (at least as good as ``start``).
    """
    cfg = problem.config
    matrix = start.copy()
    best, best_cost = matrix.copy(), float(problem.matrix_cost(matrix).sum())
    if matrix.size == 0:
        return best
    touched = np.full(matrix.shape, -(cfg.tabu_tenure + 1), dtype=np.int64)
    current = best_cost
    for step in range(cfg.tabu_moves):
        if best_cost <= lower + _tolerance(lower):
            break
        tabu = step - touched <= cfg.tabu_tenure
        move = best_move(problem, matrix, tabu, best_cost - current - _tolerance(best_cost))
        if move is None:
            break
        for job, node, change in move.cells:
            matrix[job, node] += change
            touched[job, node] = step
        current = float(problem.matrix_cost(matrix).sum())
        if current < best_cost - _tolerance(best_cost):
            best, best_cost = matrix.copy(), current
    return best


def best_move(
    problem: PolluxProblem,
    m: IntArray,
    tabu: BoolArray | None = None,
    aspiration: float = -_INF,
) -> Move | None:
    """The feasible move of lowest cost change from ``m`` (not modified).

    Args:
        problem: The round's problem.
        m: A feasible (J, V) matrix.
        tabu: (J, V) cells no move may change, unless its gain is below ``aspiration``.
        aspiration: Gain below which a tabu move is allowed.

    Returns:
        The best move (ties: lower :class:`MoveKind`), or None when no move is feasible.
    """
    cfg = problem.config
    base, cap = problem.base, problem.capacity
    num_jobs, num_nodes = m.shape
    low, high = _lower_bound(problem), problem.max_replicas
    outside = problem.base_outside
    jobs = np.arange(num_jobs)

    k = m.sum(axis=1)
    n = np.count_nonzero(m, axis=1)
    free = cap - m.sum(axis=0)
    on = m > 0
    absdiff = np.abs(m - base)
    diff = absdiff.sum(axis=1)
    cost = problem.matrix_cost(m)

    if cfg.interference_avoidance:
        dist_cells = on & (n > 1)[:, None]
        other = dist_cells.sum(axis=0)[None, :] - dist_cells  # other distributed jobs
        conflict = np.any(on & (other > 0), axis=1)
    else:
        other = np.zeros_like(m)
        conflict = np.zeros(num_jobs, dtype=bool)

    def delta(jj: IntArray, nn: IntArray, kk: IntArray, dd: IntArray, ok: BoolArray) -> FloatArray:
        """Cost change of jobs ``jj`` taking (nn, kk) with |row - base| sum ``dd``."""
        nn = np.where(ok, nn, 0)
        kk = np.where(ok, kk, 0)
        changed = (dd > 0) | outside[jj]
        new = problem.costs(jj, nn, kk, changed)
        return np.where(ok, new - cost[jj], _INF)

    def allowed(values: FloatArray, blocked: BoolArray | None) -> FloatArray:
        if blocked is None:
            return values
        return np.where(blocked & ~(values < aspiration), _INF, values)

    tb = tabu if tabu is not None else None
    jj_full = np.broadcast_to(jobs[:, None], m.shape)
    # Add one GPU of job j on node v (capacity checked by each move that adds).
    k_add = np.broadcast_to((k + 1)[:, None], m.shape)
    n_add = n[:, None] + (~on)
    d_add = diff[:, None] - absdiff + np.abs(m + 1 - base)
    ok_add = (k_add >= low[:, None]) & (k_add <= high[:, None]) & (n_add <= cfg.max_nodes_per_job)
    ok_add &= (n_add == 1) | (~conflict[:, None] & (other == 0))
    c_add = delta(jj_full, n_add, k_add, d_add, ok_add)
    # Remove one GPU of job j from node v.
    k_rem = np.broadcast_to((k - 1)[:, None], m.shape)
    n_rem = n[:, None] - (m == 1)
    d_rem = diff[:, None] - absdiff + np.abs(m - 1 - base)
    ok_rem = on & ((k_rem == 0) | (k_rem >= low[:, None]))
    c_rem = delta(jj_full, n_rem, k_rem, d_rem, ok_rem)

    moves: list[Move] = []

    grow = allowed(np.where(free[None, :] > 0, c_add, _INF), tb)
    j, v = _argmin2(grow)
    moves.append(Move(float(grow[j, v]), MoveKind.GROW, ((j, v, 1),)))

    shrink = allowed(c_rem, tb)
    j, v = _argmin2(shrink)
    moves.append(Move(float(shrink[j, v]), MoveKind.SHRINK, ((j, v, -1),)))

    cell_j, cell_v = np.nonzero(on)
    if len(cell_j):
        cells_idx = np.arange(len(cell_j))
        cell_tabu = None if tb is None else tb[cell_j, cell_v]
        # Transfer: job a gives one GPU on node v to job b.
        transfer = c_rem[cell_j, cell_v][:, None] + c_add[:, cell_v].T  # (C, J)
        transfer[cells_idx, cell_j] = _INF
        blocked = None if tb is None or cell_tabu is None else cell_tabu[:, None] | tb[:, cell_v].T
        transfer = allowed(transfer, blocked)
        c, b = _argmin2(transfer)
        src_j, src_v = int(cell_j[c]), int(cell_v[c])
        moves.append(
            Move(float(transfer[c, b]), MoveKind.TRANSFER, ((src_j, src_v, -1), (b, src_v, 1)))
        )
        # Move one GPU of job a from node v to node w.
        a, src = cell_j, cell_v
        leaves = (m[a, src] == 1).astype(np.int64)
        n_mv = n[a][:, None] - leaves[:, None] + (~on[a])  # (C, V)
        n_mv[cells_idx, src] = n[a]  # w == v is no move
        d_mv = (
            diff[a][:, None]
            + (np.abs(m[a, src] - 1 - base[a, src]) - absdiff[a, src])[:, None]
            + (np.abs(m[a] + 1 - base[a]) - absdiff[a])
        )
        ok_mv = np.ones_like(n_mv, dtype=bool)
        ok_mv[cells_idx, src] = False
        ok_mv &= n_mv <= cfg.max_nodes_per_job
        ok_mv &= (n_mv == 1) | (~conflict[a][:, None] & (other[a] == 0))
        aa = np.broadcast_to(a[:, None], n_mv.shape)
        c_mv = delta(aa, n_mv, np.broadcast_to(k[a][:, None], n_mv.shape), d_mv, ok_mv)
        mv_blocked = None if tb is None or cell_tabu is None else cell_tabu[:, None] | tb[a]
        move = allowed(np.where(free[None, :] > 0, c_mv, _INF), mv_blocked)
        c, w = _argmin2(move)
        aj, av = int(a[c]), int(src[c])
        moves.append(Move(float(move[c, w]), MoveKind.MOVE, ((aj, av, -1), (aj, w, 1))))
        # Swap: job a's GPU on v goes to w and job b's GPU on w goes to v.
        swap = c_mv[:, src].copy()  # [c1, c2] = a1 moves v1 -> v2
        swap += swap.T  # + a2 moves v2 -> v1
        same = (a[:, None] == a[None, :]) | (src[:, None] == src[None, :])
        both_dist = (n_mv[:, src] > 1) & (n_mv[:, src] > 1).T
        swap[same | (both_dist & cfg.interference_avoidance)] = _INF
        if mv_blocked is not None:
            into = mv_blocked[:, src]  # a1's cell on v1, or a1's cell on v2
            swap = allowed(swap, into | into.T)
        c1, c2 = _argmin2(swap)
        a1, v1, a2, v2 = int(a[c1]), int(src[c1]), int(a[c2]), int(src[c2])
        swap_cells = ((a1, v1, -1), (a1, v2, 1), (a2, v2, -1), (a2, v1, 1))
        moves.append(Move(float(swap[c1, c2]), MoveKind.SWAP, swap_cells))

    # Consolidate a multi-node job onto the best-fitting single node.
    room = free[None, :] + m  # (J, V)
    fits = (room >= k[:, None]) & (n > 1)[:, None] & (k[:, None] > 0)
    if np.any(fits):
        target = np.argmin(np.where(fits, room, np.iinfo(np.int64).max), axis=1)
        can = np.any(fits, axis=1)
        same_as_base = (base[jobs, target] == k) & (base.sum(axis=1) == k)
        d_con = np.where(same_as_base, 0, 1)
        c_con = delta(jobs, np.ones_like(k), k, d_con, can)
        c_con = allowed(c_con, None if tb is None else np.any(tb & (on | (room > 0)), axis=1))
        j = int(np.argmin(c_con))
        to = int(target[j])
        kj = int(k[j])
        cells = tuple((j, int(v), -int(m[j, v])) for v in np.flatnonzero(m[j]) if v != to)
        cells += ((j, to, kj - int(m[j, to])),)
        moves.append(Move(float(c_con[j]), MoveKind.CONSOLIDATE, cells))

    best = min(moves, key=lambda mv: (mv.gain, mv.kind))
    return best if np.isfinite(best.gain) else None


def _argmin2(a: FloatArray) -> tuple[int, int]:
    """Row and column of the first minimum of a 2-D array."""
    r, c = np.unravel_index(int(np.argmin(a)), a.shape)
    return int(r), int(c)
