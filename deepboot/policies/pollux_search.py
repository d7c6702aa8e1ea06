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
4. If the lower bound is still not reached: a tighter bound that also budgets nodes
   (:func:`slot_bound`: distributed jobs hold disjoint nodes); reaching it proves the
   packing optimal too. Otherwise: local search from the current allocation, a
   large-neighbourhood search (free one node, or two on small clusters, and redo
   steps 1-3 for the jobs there and the idle ones), and a short tabu search, each
   stopping at the tighter bound.

The knapsack's bound assumes that no job runs faster split over nodes. Fitted models
can break that (an inter-node sync fitted cheaper than the intra-node one: in 536 of
the 685 rounds of Pollux workload 7 that reach step 4), and then reaching it may stop
the search early.
That is the search's behaviour, kept as it is (every golden depends on it);
:func:`slot_bound` does not assume it.

Everything is deterministic (ties go to the lowest index); no randomness is needed.

Speed: the moves are scored by :class:`~deepboot.policies.pollux_state.SearchState`
(incremental, scalar; bit for bit the vectorized
:func:`~deepboot.policies.pollux_moves.best_move_reference`); costs come from the
problem's per-(job, nodes, GPUs) memo; the pure steps (local search, plan-and-pack,
a matrix's total cost) are memoized per problem, since neighbourhoods and packing
orders often repeat them; and the tabu search stops when it returns to a state it
has been in (see :func:`tabu_search`). None of this changes a result.
All constraints hold at every step: node capacity, min/max replicas, at most
``max_nodes_per_job`` nodes per job, and (with ``interference_avoidance``) at most one
distributed job per node.
"""

from __future__ import annotations

import bisect
import enum
import functools
import itertools
import math
from collections.abc import Mapping

import numpy as np

from deepboot.policies._slotkernel import slot_knapsack
from deepboot.policies.pollux_fitness import BoolArray, FloatArray, IntArray, PolluxProblem
from deepboot.policies.pollux_moves import Move, MoveKind
from deepboot.policies.pollux_state import ProblemView, SearchState, problem_view

__all__ = [
    "Move",
    "MoveKind",
    "PackOrder",
    "dp_counts",
    "local_search",
    "nodes_for",
    "pack_counts",
    "plan_and_pack",
    "repair_base",
    "ruin_and_recreate",
    "slot_bound",
    "solve",
    "tabu_search",
    "total_cost",
]

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
    # intra-node; fitted models do not always have it, see the module docstring):
    # reaching it ends the search.
    counts, keep, lower = dp_counts(problem)
    empty = np.zeros_like(problem.base)
    rounds = problem.config.max_search_rounds
    # Where the first packing misses that bound, a tighter one that also counts nodes
    # (see slot_bound) takes over. Reaching it proves a matrix optimal too, and every
    # step replaces a matrix only by a strictly better one, so stopping there (here or
    # in any later step) gives the result the whole search gives: only sooner.
    best = plan_and_pack(
        problem, empty, np.arange(num_jobs), lower, rounds, (counts, keep), tighten=True
    )
    best_cost = total_cost(problem, best)
    if best_cost <= lower + _tolerance(lower):
        return best
    lower = max(lower, slot_bound(problem))
    if best_cost <= lower + _tolerance(lower):
        return best
    other = local_search(problem, repair_base(problem))
    if total_cost(problem, other) < best_cost - _tolerance(best_cost):
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
    tighten: bool = False,
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
        tighten: ``lower`` is the bound of the whole problem: once a packing misses
            it, :func:`slot_bound` tightens it (the result is the same).

    Returns:
        The best feasible (J, V) matrix found (a new array). A pure function of the
        arguments, memoized per problem: neighbourhoods often clear the same jobs.
    """
    key = ("plan_and_pack", start.tobytes(), jobs.tobytes(), lower, rounds, first is None, tighten)
    done = problem.search_memo.get(key)
    if done is None:
        done = _plan_and_pack(problem, start, jobs, lower, rounds, first, tighten)
        problem.search_memo[key] = done
    return done.copy()


def _plan_and_pack(
    problem: PolluxProblem,
    start: IntArray,
    jobs: IntArray,
    lower: float,
    rounds: int,
    first: tuple[IntArray, BoolArray] | None,
    tighten: bool,
) -> IntArray:
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
            packed = _pack(problem, counts, keep, start, sequence)
            matrix = local_search(problem, packed)
            cost = total_cost(problem, matrix)
            if round_best is None or cost < round_best[0] - _tolerance(cost):
                round_best = (cost, packed)
            if cost < best_cost - _tolerance(best_cost):
                best, best_cost = matrix, cost
            if best_cost <= lower + _tolerance(lower):
                return best
            if tighten:
                tighten = False
                lower = max(lower, slot_bound(problem))
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
    best_cost = total_cost(problem, best)
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
            cost = total_cost(problem, trial)
            if cost < best_cost - _tolerance(best_cost):
                best, best_cost, improved = trial, cost, True
        if not improved:
            break
    return best


def slot_bound(problem: PolluxProblem) -> float:
    """A lower bound on the summed cost of every feasible matrix that also counts nodes.

    :func:`dp_counts`' bound budgets GPUs only, so it may value at once several jobs
    on their fewest nodes that no packing can give them together. With interference
    avoidance, distributed jobs hold disjoint node sets, and a one-node job holding a
    whole largest node shares it with no distributed job (such a node has a GPU of the
    distributed job on it) nor with another such job: so those jobs' nodes ("slots")
    add up to at most the node count. This knapsack takes, per job, one option under
    both budgets: 0 GPUs; k GPUs valued as changed on the fewest nodes (slots: the
    nodes when more than one, else one when k fills a largest node, else none); k GPUs
    split over two nodes when that is cheaper (two slots); the current row, unchanged
    (slots as for the fewest nodes).

    Every feasible matrix maps to a choice costing no more when a job's speedup
    depends on its node count only through whether it spans more than one node, which
    holds for every speedup function deepboot builds (the sync time is intra- or
    inter-node; :attr:`PolluxProblem.two_level`). Otherwise, without interference
    avoidance, or with a cost not finite, the bound is ``-inf`` (no bound).

    Returns:
        The bound, or ``-inf``; memoized per problem.
    """
    found = problem.row_memo.get(("slot_bound",))
    if isinstance(found, float):
        return found
    bound = _slot_bound(problem)
    problem.row_memo[("slot_bound",)] = bound
    return bound


def _slot_bound(problem: PolluxProblem) -> float:
    view = problem_view(problem)
    cap = problem.capacity.tolist()
    total, num_jobs = sum(cap), view.num_jobs
    if not (view.avoid and problem.two_level and problem.costs_finite and total > 0):
        return -_INF
    biggest = max(cap)
    cum = tuple(itertools.accumulate(sorted(cap, reverse=True)))
    fewest = view.fewest_nodes[: total + 1]  # nodes_for(capacity, k), k = 0..total
    jobs = list(range(num_jobs))
    keep_nodes, keep_gpus = _keep_rows(view, jobs, cap)
    keep_cost = problem.memo_costs(jobs, keep_nodes, keep_gpus, False).tolist()
    split = _split_costs(problem, view, biggest)
    if split is None:
        return -_INF

    # Slots of k GPUs on the fewest nodes: those nodes when more than one, else one
    # when k fills a largest node, else none.
    count = np.array(fewest, dtype=np.int64)
    slots = np.where(count > 1, count, np.arange(total + 1) >= biggest).astype(np.int64)
    gpus: list[IntArray] = []
    used: list[IntArray] = []
    costs: list[FloatArray] = []
    starts = [0]
    for j in jobs:
        low, top = view.low[j], min(view.high[j], total)
        ks = np.concatenate(([0], np.arange(low, top + 1, dtype=np.int64)))
        options = _option_costs(problem, view, j, top, cum, fewest)
        more_k, more_s, more_c = [], [], []
        for k, two in split.get(j, ()):
            if two < options[k - low + 1]:
                more_k.append(k)
                more_s.append(2)
                more_c.append(two)
        if keep_gpus[j] > 0:
            more_k.append(keep_gpus[j])
            more_s.append(keep_nodes[j] if keep_nodes[j] > 1 else int(slots[keep_gpus[j]]))
            more_c.append(keep_cost[j])
        gpus += [ks, np.array(more_k, dtype=np.int64)]
        used += [slots[ks], np.array(more_s, dtype=np.int64)]
        costs += [options, np.array(more_c, dtype=np.float64)]
        starts.append(starts[-1] + ks.size + len(more_k))
    if not problem.costs_finite:
        return -_INF
    return slot_knapsack(
        np.concatenate(gpus),
        np.concatenate(used),
        np.concatenate(costs),
        np.array(starts, dtype=np.int64),
        total,
        view.num_nodes,
    )


def _split_costs(
    problem: PolluxProblem, view: ProblemView, biggest: int
) -> dict[int, list[tuple[int, float]]] | None:
    """Per job, (k, the changed cost of k GPUs on two nodes) for the counts from 2 to
    what the largest node holds (larger counts span several nodes anyway). Computed
    by :meth:`PolluxProblem.costs`, so the cost memo and ``costs_finite`` stay as they
    are; None when one is not finite."""
    pairs = [
        (j, k)
        for j in range(view.num_jobs)
        for k in range(max(view.low[j], 2), min(view.high[j], biggest) + 1)
    ]
    if not pairs or view.top < 2:
        return {}
    jobs = np.array([j for j, _ in pairs], dtype=np.int64)
    reps = np.array([k for _, k in pairs], dtype=np.int64)
    values = problem.costs(jobs, np.full_like(reps, 2), reps, np.ones(len(pairs), dtype=bool))
    if not np.all(np.isfinite(values)):
        return None
    out: dict[int, list[tuple[int, float]]] = {}
    for (j, k), value in zip(pairs, values.tolist(), strict=True):
        out.setdefault(j, []).append((k, value))
    return out


def _keep_rows(view: ProblemView, jobs: list[int], cap: list[int]) -> tuple[list[int], list[int]]:
    """Per job of ``jobs``, the nodes and GPUs of its current row when it may keep it
    within the capacities ``cap`` (its bounds, the node limit, not held outside), else
    (0, 0)."""
    keep_nodes: list[int] = []
    keep_gpus: list[int] = []
    for j in jobs:
        row = view.base[j]
        k = view.base_k[j]
        n = len(row) - row.count(0)
        ok = k > 0 and not view.out[j] and view.low[j] <= k <= view.high[j]
        ok = ok and n <= view.max_nodes and all(x <= c for x, c in zip(row, cap, strict=True))
        keep_nodes.append(n if ok else 0)
        keep_gpus.append(k if ok else 0)
    return keep_nodes, keep_gpus


def _tolerance(total: float) -> float:
    return 1e-10 * (1.0 + abs(total)) if math.isfinite(total) else 0.0


def _row_allowed(
    view: ProblemView, row: list[int], free: list[int], owner: list[int], j: int
) -> bool:
    """Whether job ``j`` may take ``row`` now: its replica bounds, the node limit, the
    free GPUs, and (with interference avoidance) no other distributed job's node."""
    k = sum(row)
    nodes = [v for v, x in enumerate(row) if x]
    if k < view.low[j] or k > view.high[j] or len(nodes) > view.max_nodes:
        return False
    if any(x > f for x, f in zip(row, free, strict=True)):
        return False
    return not (view.avoid and len(nodes) > 1 and any(owner[v] >= 0 for v in nodes))


def _place_row(
    matrix: list[list[int]], free: list[int], owner: list[int], j: int, row: list[int]
) -> None:
    matrix[j] = row[:]
    nodes = [v for v, x in enumerate(row) if x]
    for v in nodes:
        free[v] -= row[v]
    if len(nodes) > 1:
        for v in nodes:
            owner[v] = j


def _owners(matrix: list[list[int]], num_nodes: int) -> list[int]:
    """Per node, the last distributed job (in job order) on it, or -1."""
    owner = [-1] * num_nodes
    for d, row in enumerate(matrix):
        nodes = [v for v, x in enumerate(row) if x]
        if len(nodes) > 1:
            for v in nodes:
                owner[v] = d
    return owner


def repair_base(problem: PolluxProblem) -> IntArray:
    """The current allocation, minus the jobs that no longer fit the constraints.

    Jobs are admitted in reference order; a job whose current row breaks a bound
    (capacity, replica limits, node count, one distributed job per node) holds nothing.

    Returns:
        (J, V) int array.
    """
    view = problem_view(problem)
    matrix = [[0] * view.num_nodes for _ in range(view.num_jobs)]
    free = view.cap[:]
    owner = [-1] * view.num_nodes
    for j, row in enumerate(view.base):
        if sum(row) > 0 and _row_allowed(view, row, free, owner, j):
            _place_row(matrix, free, owner, j, row)
    return _as_matrix(matrix, problem)


def _as_matrix(rows: list[list[int]], problem: PolluxProblem) -> IntArray:
    return np.array(rows, dtype=np.int64).reshape(problem.num_jobs, problem.num_nodes)


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
    view = problem_view(problem)
    num_jobs = view.num_jobs
    subset = list(range(num_jobs)) if jobs is None else [int(j) for j in jobs]
    cap = (problem.capacity if free is None else free).tolist()
    total = sum(cap)
    counts = np.zeros(num_jobs, dtype=np.int64)
    keep = np.zeros(num_jobs, dtype=bool)
    if len(subset) == 0 or total == 0:
        idle = problem.memo_costs(subset, [0] * len(subset), [0] * len(subset), True)
        return counts, keep, float(idle.sum())
    # Each job's options: 0, or low..top GPUs, valued (as changed) on the fewest nodes.
    cum = tuple(itertools.accumulate(sorted(cap, reverse=True)))
    # nodes_for(cap, k): the first running sum that holds k (at most every node).
    fewest = [0] + [min(bisect.bisect_left(cum, k) + 1, len(cum)) for k in range(1, total + 1)]
    option_costs = [
        _option_costs(problem, view, j, min(view.high[j], total), cum, fewest) for j in subset
    ]
    keep_nodes, keep_gpus = _keep_rows(view, subset, cap)
    keep_cost = problem.memo_costs(subset, keep_nodes, keep_gpus, False).tolist()
    by_job: dict[int, list[tuple[int, float]]] = {}
    for (job, count), value in (learned or {}).items():
        by_job.setdefault(job, []).append((count, value))

    # dp[b]: the best cost within budget b; dp[total + 1] = inf, the value an option
    # that does not fit reads (see _dp_index).
    budget = np.arange(total + 2)
    dp = np.zeros(total + 2)
    dp[-1] = _INF
    steps: list[tuple[IntArray, int]] = []
    keeps = np.zeros(len(subset), dtype=bool)
    for i, j in enumerate(subset):
        cs = option_costs[i]
        # The options are [0, low, low + 1, ..., top]: count c sits at c - low + 1.
        size, low_j = len(cs), view.low[j]
        edits: list[tuple[int, float]] = []
        if keep_gpus[i] > 0:
            at = keep_gpus[i] - low_j + 1
            if keep_cost[i] <= cs[at]:
                edits.append((at, keep_cost[i]))
                keeps[i] = True
        if edits or j in by_job:
            cs = cs.copy()
            for at, value in edits:
                cs[at] = value
            for count, value in by_job.get(j, ()):
                at = 0 if count == 0 else count - low_j + 1
                if (count == 0 or count >= low_j) and at < size:
                    cs[at] = max(cs[at], value)
        vals = dp[_dp_index(size, low_j, total)]
        vals += cs[:, None]
        arg = vals.argmin(axis=0)
        dp = vals[arg, budget]
        dp[-1] = _INF
        steps.append((arg, low_j))

    left = total
    for i in range(len(subset) - 1, -1, -1):
        arg, low_j = steps[i]
        at = int(arg[left])
        count = 0 if at == 0 else low_j + at - 1
        counts[subset[i]] = count
        left -= count
    keep[subset] = keeps & (counts[subset] == np.asarray(view.base_k)[subset])
    return counts, keep, float(dp[total])


def _option_costs(
    problem: PolluxProblem,
    view: ProblemView,
    j: int,
    top: int,
    cum: tuple[int, ...],
    fewest: list[int],
) -> FloatArray:
    """Job ``j``'s knapsack costs (changed, on the fewest nodes of the capacities
    whose largest-first running sums are ``cum``; ``fewest[k]`` is that node count)
    for 0, low, ..., top GPUs: ``problem.costs`` values, memoized per problem
    (read-only: copy before editing)."""
    key = ("options", j, top, cum)
    found = problem.row_memo.get(key)
    if isinstance(found, np.ndarray):
        return found
    memo = view.memo[j]
    ks = [0, *range(view.low[j], top + 1)]
    missing = [(j, fewest[k], k) for k in ks if (fewest[k], k) not in memo]
    if missing:
        problem.fill_costs(missing)
    costs = np.array([memo[fewest[k], k][1] for k in ks], dtype=np.float64)
    problem.row_memo[key] = costs
    return costs


@functools.lru_cache(maxsize=4096)
def _dp_index(size: int, low: int, total: int) -> IntArray:
    """For the options [0, low, ..., low + size - 2] of one knapsack step: which dp
    entry each (option, budget 0..total + 1) reads; ``total + 1`` (whose dp entry is
    inf) where the option does not fit the budget, and for the extra budget total + 1.
    inf + cost is what the step took for a missing entry before, so the same bits."""
    ks = np.concatenate(([0], np.arange(low, low + size - 1))).astype(np.int64)
    src = np.arange(total + 1)[None, :] - ks[:, None]
    out = np.full((size, total + 2), total + 1, dtype=np.int64)
    out[:, : total + 1] = np.where(src >= 0, src, total + 1)
    return out


def _job_cost(problem: PolluxProblem, j: int, row: list[int]) -> float:
    """Cost of job ``j`` holding ``row`` (GPUs per node): ``problem.costs`` of its
    (nodes, GPUs, changed), through the problem's cost memo (same values)."""
    view = problem_view(problem)
    n = len(row) - row.count(0)
    changed = row != view.base[j] or view.out[j]
    return view.memo[j][n, sum(row)][changed]


def total_cost(problem: PolluxProblem, matrix: IntArray) -> float:
    """``float(problem.matrix_cost(matrix).sum())``: the same per-job values (from the
    search's row memo) summed by NumPy in the same order, so the same bits."""
    return SearchState.costs_of(problem, matrix)


def _pack_count(
    problem: PolluxProblem,
    matrix: list[list[int]],
    free: list[int],
    owner: list[int],
    j: int,
    want: int,
) -> None:
    """Give job ``j`` ``want`` GPUs on one node if possible; else the cheaper of the
    fewest nodes (not holding another distributed job) and the fullest single node."""
    view = problem_view(problem)
    num_nodes = view.num_nodes
    fitting = [v for v in range(num_nodes) if free[v] >= want]
    if fitting:
        v = min(fitting, key=lambda x: free[x])  # the first of the least free
        row = [0] * num_nodes
        row[v] = want
        _place_row(matrix, free, owner, j, row)
        return
    low = view.low[j]
    options: list[list[int]] = []
    usable = [v for v in range(num_nodes) if free[v] > 0 and (owner[v] < 0 or not view.avoid)]
    cand = sorted(usable, key=lambda v: -free[v])  # stable: ties by node
    split = [0] * num_nodes
    need, used = want, 0
    while need > 0 and cand and used < view.max_nodes:
        fits = [v for v in cand if free[v] >= need]
        if fits:
            v = min(fits, key=lambda x: (free[x], x))
            split[v] = need
            break
        v = cand.pop(0)
        split[v] = free[v]
        used += 1
        need -= free[v]
    if sum(split) >= low:
        options.append(split)
    most = max(free, default=0)
    if most >= low:
        single = [0] * num_nodes
        single[free.index(most)] = most
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
    if regret is None:
        regret = _regret(problem, counts)
    sequence = _pack_sequence(order, counts, keep, regret)
    return _pack(problem, counts, keep, start, sequence)


def _pack(
    problem: PolluxProblem,
    counts: IntArray,
    keep: BoolArray,
    start: IntArray | None,
    sequence: tuple[int, ...],
) -> IntArray:
    """:func:`pack_counts` with the job sequence given."""
    view = problem_view(problem)
    num_nodes = view.num_nodes
    matrix = [[0] * num_nodes for _ in range(view.num_jobs)] if start is None else start.tolist()
    held = [sum(col) for col in zip(*matrix, strict=True)] if matrix else [0] * num_nodes
    free = [c - h for c, h in zip(view.cap, held, strict=True)]
    owner = _owners(matrix, num_nodes)
    placed = [sum(row) > 0 for row in matrix]
    wanted, kept = counts.tolist(), keep.tolist()
    for j in sequence:
        if placed[j]:
            continue
        if kept[j] and _row_allowed(view, view.base[j], free, owner, j):
            _place_row(matrix, free, owner, j, view.base[j])
        elif wanted[j] > 0:
            _pack_count(problem, matrix, free, owner, j, wanted[j])
    return _as_matrix(matrix, problem)


def _pack_sequence(
    order: PackOrder, counts: IntArray, keep: BoolArray, regret: FloatArray
) -> tuple[int, ...]:
    """Job indices (those with a count or a kept row) in ``order``."""
    wanted, kept, lost = counts.tolist(), keep.tolist(), regret.tolist()
    todo = [j for j in range(len(wanted)) if kept[j] or wanted[j] > 0]

    def key(j: int) -> tuple[bool, bool, float, float, int]:
        idle = not lost[j] > 0
        if order is PackOrder.KEEP_FIRST:
            return (not kept[j], idle, -float(wanted[j]), -lost[j], j)
        if order is PackOrder.SIZE:
            return (False, idle, -float(wanted[j]), -lost[j], j)
        return (False, idle, -lost[j], -float(wanted[j]), j)

    return tuple(sorted(todo, key=key))


def _regret(problem: PolluxProblem, counts: IntArray) -> FloatArray:
    """(J,) cost a job loses when it cannot have its count on the fewest nodes: the
    smaller of one node more and one GPU fewer (0 for jobs that lose nothing)."""
    view = problem_view(problem)
    fewest = view.fewest_nodes
    num_nodes = view.num_nodes
    jobs = list(range(view.num_jobs))
    wanted = counts.tolist()
    fewer_k = [k - 1 if k - 1 >= view.low[j] else 0 for j, k in enumerate(wanted)]
    n_here = [fewest[k] for k in wanted]
    n_split = [min(n + 1, min(k, num_nodes)) for n, k in zip(n_here, wanted, strict=True)]
    n_fewer = [fewest[k] for k in fewer_k]
    problem.fill_costs(  # all three in one call
        list(zip(jobs, n_here, wanted, strict=True))
        + list(zip(jobs, n_split, wanted, strict=True))
        + list(zip(jobs, n_fewer, fewer_k, strict=True))
    )
    here = problem.memo_costs(jobs, n_here, wanted, True)
    split = problem.memo_costs(jobs, n_split, wanted, True)
    fewer = problem.memo_costs(jobs, n_fewer, fewer_k, True)
    return np.maximum(np.minimum(split, fewer) - here, 0.0)


def local_search(problem: PolluxProblem, start: IntArray) -> IntArray:
    """Best-improvement local search from a feasible ``start`` (not modified).

    A pure function of ``(problem, start)``, memoized per problem: the packings of
    successive rounds and neighbourhoods often repeat a start.

    Returns:
        A feasible (J, V) matrix at least as good as ``start`` (a new array).
    """
    if start.size == 0:
        return start.copy()
    key = ("local_search", start.tobytes())
    done = problem.search_memo.get(key)
    if done is None:
        state = SearchState(problem, start)
        for _ in range(problem.config.max_search_moves):
            total = state.total()
            move = state.best_move()
            if move is None or not move.gain < -_tolerance(total):
                break
            state.apply(move.cells)
        done = problem.search_memo[key] = state.matrix()
    return done.copy()


def tabu_search(problem: PolluxProblem, start: IntArray, lower: float) -> IntArray:
    """Tabu search from ``start``: take the best move even when it worsens, but never
    touch a (job, node) cell changed in the last ``tabu_tenure`` moves, unless the move
    gives a new best. Stops after ``tabu_moves`` moves or at the lower bound.

    Returns:
        The best feasible (J, V) matrix seen (at least as good as ``start``).
    """
    cfg = problem.config
    best = start.copy()
    if best.size == 0:
        return best
    state = SearchState(problem, start)
    best_cost = current = state.total()
    # The moves of the last tabu_tenure + 1 steps: a cell they touched is tabu.
    recent: list[tuple[int, tuple[tuple[int, int, int], ...]]] = []
    seen: set[tuple[object, ...]] = set()
    for step in range(cfg.tabu_moves):
        if best_cost <= lower + _tolerance(lower):
            break
        recent = [(when, cells) for when, cells in recent if step - when <= cfg.tabu_tenure]
        # Each step is a function of the matrix, the tabu window (cells and ages) and
        # best_cost. Back in a state seen before, the search repeats its steps since
        # then, none of which found a better matrix (best_cost would have dropped and
        # the state would differ): the rest finds nothing new, so stop (same result).
        key = (state.key(), tuple((step - when, cells) for when, cells in recent), best_cost)
        if key in seen:
            break
        seen.add(key)
        tabu = [0] * problem.num_jobs
        for _, cells in recent:
            for job, node, _ in cells:
                tabu[job] |= 1 << node
        move = state.best_move(tabu, best_cost - current - _tolerance(best_cost))
        if move is None:
            break
        state.apply(move.cells)
        recent.append((step, move.cells))
        current = state.total()
        if current < best_cost - _tolerance(best_cost):
            best, best_cost = state.matrix(), current
    return best
