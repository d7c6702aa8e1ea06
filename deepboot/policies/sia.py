"""A Sia-style reference allocator for clusters of several GPU types.

After Sia (Jayaram Subramanya et al., "Sia: Heterogeneity-aware, goodput-optimized
ML-cluster scheduling", SOSP'23), as its paper and its public artifact's simulator
describe it (read, not copied; the shared traces README's ``hetero/`` section):

1. **Configurations.** Per GPU type of ``g`` GPUs a node: 1, 2, 4, ... GPUs within
   one node up to ``g``, then whole nodes (2g, 3g, ... up to the type's nodes). A job
   may take one configuration of one type, between its min and max replicas.
2. **Goodput per type.** On a type the job has run on, its own fitted model of that
   type (the batch re-optimised per configuration, as Pollux's goodput). On a type it
   has not run on, projected from the first type it has a model of, scaled by the
   ratio of the model's one-GPU peak throughputs (``TypeModel.speed``; Sia profiles
   one GPU of each type). A job with no model yet scores 1 on every one-GPU
   configuration and (almost) nothing elsewhere, so it starts on one GPU.
3. **Normalisation.** Each job's row is divided by its smallest useful entry, so
   jobs of very different speeds weigh alike.
4. **Restarts.** Every configuration but the one the job holds is scaled by
   ``max(age - restarts x S, 0) / (age + S)`` (1 while the job is younger than S),
   S its model's restart penalty.
5. **Objective.** With ``p < 0``, minimise ``sum(x * (G * r) ** p) + lambda x (jobs
   left out)`` over binary ``x`` (one configuration per job; per type, the GPUs
   given at most the GPUs free for training), solved exactly as a mixed-integer
   program (HiGHS, through ``scipy.optimize.milp``, relative gap ``gap``, a time
   bound ``time_limit_s``; past it, the best solution found).
6. **Placement.** A job whose configuration is unchanged keeps its GPUs; the others,
   largest first, take whole free nodes of their type, then the best-fitting node,
   then whatever of the type is free.

On one GPU type (every cluster before typed specs) the same program runs over one
type; the policy is then a goodput-normalising reference, not a reproduction of any
homogeneous result. Differences from the artifact: its scores are rounded to two
decimals and clipped at 3000 (not here), and a job in the middle of a restart is
pinned to its configuration there (a ``JobView`` does not say so here).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar

import numpy as np
import numpy.typing as npt
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp

from deepboot.core.errors import ConfigError
from deepboot.core.modes import JobMode
from deepboot.core.params import BatchLimits, GradParams, PerfParams
from deepboot.core.placement import Allocation, Placement, freeze_allocation
from deepboot.core.state import ClusterState, JobView, TypeModel
from deepboot.perf import detmath
from deepboot.perf.goodput import GoodputModel

log = logging.getLogger(__name__)

SIA_RESTART_PENALTY: Mapping[str, float] = MappingProxyType(
    {"deepspeech2": 25.0, "imagenet": 250.0, "cifar10": 30.0, "bert": 120.0, "yolov3": 45.0}
)
"""The restart penalty S of Sia's policy per model, seconds (its artifact's
``sia.py``; any other model: :attr:`SiaConfig.restart_penalty`)."""

NOTHING = 1e-4
"""The score of a configuration that is of no use (the artifact's ZERO_ALLOC_GAIN)."""


@dataclass(frozen=True, slots=True)
class SiaConfig:
    """Parameters of :class:`SiaPolicy` (the paper's and the artifact's defaults).

    Attributes:
        p: Exponent of the normalised goodput (< 0: the published -0.5).
        lam: Cost of leaving a job without GPUs (lambda_n, 1.1).
        restart_penalty: S of a model missing from :data:`SIA_RESTART_PENALTY`.
        gap: Relative optimality gap of the solver (the artifact's 0.01 %).
        time_limit_s: The solver's time bound, seconds.
    """

    p: float = -0.5
    lam: float = 1.1
    restart_penalty: float = 30.0
    gap: float = 1e-4
    time_limit_s: float = 10.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.p) and self.p < 0):
            raise ConfigError(f"sia: p must be negative; got {self.p}")
        if not (math.isfinite(self.lam) and self.lam > 0):
            raise ConfigError(f"sia: lam must be positive; got {self.lam}")
        if not (math.isfinite(self.restart_penalty) and self.restart_penalty >= 0):
            raise ConfigError(f"sia: restart_penalty must be >= 0; got {self.restart_penalty}")
        if not (0 <= self.gap < 1):
            raise ConfigError(f"sia: gap must be in [0, 1); got {self.gap}")
        if not (math.isfinite(self.time_limit_s) and self.time_limit_s > 0):
            raise ConfigError(f"sia: time_limit_s must be positive; got {self.time_limit_s}")


@dataclass(frozen=True, slots=True)
class _Type:
    """One GPU type of the cluster as the program sees it."""

    name: str
    node_gpus: int
    nodes: tuple[int, ...]
    free: int
    configs: tuple[tuple[int, int], ...]  # (nodes, GPUs)


@functools.lru_cache(maxsize=8192)
def _goodputs(
    perf: PerfParams, grad: GradParams, limits: BatchLimits, configs: tuple[tuple[int, int], ...]
) -> tuple[float, ...]:
    """Absolute goodput of the model at each (nodes, GPUs), the batch re-optimised."""
    nodes = np.array([n for n, _ in configs], dtype=np.int64)
    gpus = np.array([k for _, k in configs], dtype=np.int64)
    good, _, _ = GoodputModel(perf, grad, limits).optimize(nodes, gpus)
    return tuple(float(g) for g in good)


def _cluster_types(state: ClusterState) -> list[_Type]:
    """The cluster's GPU types (one unnamed type when it has none) and configurations."""
    by_type: dict[str, list[int]] = {}
    for node in state.cluster.nodes:
        if state.capacity.get(node.node_id, 0) > 0:
            by_type.setdefault(node.gpu_type or "", []).append(node.node_id)
    out = []
    for name, nodes in by_type.items():
        g = max(state.cluster.nodes[n].gpus for n in nodes)
        within = sorted({*(1 << i for i in range(g.bit_length())), g})
        configs = [(1, k) for k in within] + [(n, n * g) for n in range(2, len(nodes) + 1)]
        free = sum(state.capacity[n] for n in nodes)
        out.append(_Type(name, g, tuple(nodes), free, tuple(configs)))
    return out


def _models(job: JobView) -> dict[str, TypeModel]:
    if job.types:
        return {m.gpu_type: m for m in job.types}
    return {"": TypeModel("", job.limits, 1.0, job.perf_params)}


def job_row(job: JobView, types: Sequence[_Type]) -> list[float]:
    """The job's goodput at every configuration of every type (before
    normalisation), :data:`NOTHING` where of no use or outside its replica bounds."""
    models = _models(job)
    known = [t for t in types if models.get(t.name) and models[t.name].perf_params is not None]
    row: list[float] = []
    for t in types:
        model = models.get(t.name)
        if model is None or job.grad_params is None or not known:
            row += [1.0 if k == 1 else NOTHING for _, k in t.configs]
            continue
        if model.perf_params is not None:
            values = _goodputs(model.perf_params, job.grad_params, model.limits, t.configs)
        else:
            base = models[known[0].name]
            assert base.perf_params is not None
            g = known[0].node_gpus
            projected = tuple((-(-k // g), k) for _, k in t.configs)
            scale = model.speed / base.speed if base.speed > 0 else 1.0
            values = tuple(
                v * scale
                for v in _goodputs(base.perf_params, job.grad_params, base.limits, projected)
            )
        row += [v if v > NOTHING else NOTHING for v in values]
    lo, hi = job.min_replicas, job.max_replicas
    ks = [k for t in types for _, k in t.configs]
    return [v if max(lo, 1) <= k <= hi else NOTHING for v, k in zip(row, ks, strict=True)]


def normalised_row(job: JobView, types: Sequence[_Type]) -> npt.NDArray[np.float64]:
    """:func:`job_row` divided by its smallest useful entry, :data:`NOTHING` kept
    where of no use (the module doc, item 3)."""
    row = np.asarray(job_row(job, types))
    useful = row[row > NOTHING]
    row = row / (useful.min() if useful.size else 1.0)
    row[row <= NOTHING] = NOTHING
    return row


def _restart_factor(job: JobView, now: float, config: SiaConfig) -> float:
    s = SIA_RESTART_PENALTY.get(job.application, config.restart_penalty)
    if job.restart_cost is not None:
        s = max(s, job.restart_cost)
    age = job.age(now)
    if age < s:
        return 1.0
    return max(age - job.num_restarts * s, 0.0) / (age + s)


@dataclass(frozen=True, slots=True)
class SiaPolicy:
    """The Sia-style reference allocator (see the module doc). Type-aware: its
    placements already hold one type each."""

    config: SiaConfig = SiaConfig()
    name: ClassVar[str] = "sia"
    job_mode: ClassVar[JobMode] = JobMode.ADAPTIVE
    type_aware: ClassVar[bool] = True

    def allocate(self, state: ClusterState, rng: np.random.Generator) -> Allocation:
        """Return the allocation; ``state`` is never mutated and ``rng`` is unused."""
        del rng
        types = _cluster_types(state)
        jobs = sorted(state.jobs, key=lambda j: (j.submit_time, j.name))
        if not jobs or not types:
            return freeze_allocation({})
        columns = [(t, c) for t in types for c in t.configs]
        node_type = {n: t.name for t in types for n in t.nodes}
        scores = np.empty((len(jobs), len(columns)))
        for j, job in enumerate(jobs):
            row = normalised_row(job, types)
            held = _held_column(job, columns, node_type)
            r = _restart_factor(job, state.now, self.config) if held is not None else 1.0
            if held is not None and r != 1.0:
                keep = row[held]
                row = row * max(r, NOTHING)
                row[held] = keep
            scores[j] = row
        cost = detmath.pow(scores, self.config.p) - self.config.lam
        chosen = _solve(cost, columns, types, self.config)
        return freeze_allocation(_place(jobs, chosen, columns, types, state, node_type))


def _held_column(
    job: JobView, columns: Sequence[tuple[_Type, tuple[int, int]]], node_type: Mapping[int, str]
) -> int | None:
    """The column of the configuration ``job`` holds (None: it holds none of them)."""
    p = job.placement
    if not p:
        return None
    held_type = node_type.get(p.node_ids[0])
    for i, (t, (_, k)) in enumerate(columns):
        if t.name == held_type and k == p.num_replicas:
            return i
    return None


def _solve(
    cost: npt.NDArray[np.float64],
    columns: Sequence[tuple[_Type, tuple[int, int]]],
    types: Sequence[_Type],
    config: SiaConfig,
) -> list[int | None]:
    """Each job's column (None: no GPUs): the program of the module doc, item 5."""
    jobs, width = cost.shape
    c = cost.ravel()
    one_each = sparse.kron(sparse.eye(jobs), np.ones((1, width)))
    per_type = np.zeros((len(types), width))
    for i, (t, (_, k)) in enumerate(columns):
        per_type[types.index(t), i] = k
    gpus = sparse.kron(np.ones((1, jobs)), per_type)
    constraints = [
        LinearConstraint(one_each, 0, 1),
        LinearConstraint(gpus, 0, [t.free for t in types]),
    ]
    result = milp(
        c,
        integrality=np.ones_like(c),
        bounds=Bounds(0, 1),
        constraints=constraints,
        options={"mip_rel_gap": config.gap, "time_limit": config.time_limit_s},
    )
    if result.status != 0:
        # Past the time bound the best solution found stands: the one way a decision
        # here depends on the machine, so say so.
        log.warning("sia: the program was not solved to its gap (%s)", result.message)
    if result.x is None:
        return [None] * jobs  # no feasible point found in time: nothing this round
    x = np.round(result.x).reshape(jobs, width)
    return [int(np.argmax(row)) if row.max() > 0.5 else None for row in x]


def _place(
    jobs: Sequence[JobView],
    chosen: Sequence[int | None],
    columns: Sequence[tuple[_Type, tuple[int, int]]],
    types: Sequence[_Type],
    state: ClusterState,
    node_type: Mapping[int, str],
) -> dict[str, Placement]:
    """GPUs for each chosen configuration (the module doc, item 6)."""
    free = {n: state.capacity[n] for t in types for n in t.nodes}
    out: dict[str, Placement] = {}
    todo: list[tuple[int, JobView, _Type]] = []
    for job, col in zip(jobs, chosen, strict=True):
        if col is None:
            continue
        t, (_, k) = columns[col]
        p = job.placement
        same = p and p.num_replicas == k and node_type.get(p.node_ids[0]) == t.name
        if same and all(free.get(n, 0) >= c for n, c in p.counts().items()):
            for n, c in p.counts().items():
                free[n] -= c
            out[job.name] = p
        else:
            todo.append((k, job, t))
    for k, job, t in sorted(todo, key=lambda x: (-x[0], x[1].submit_time, x[1].name)):
        ids: list[int] = []
        need = k
        if k > t.node_gpus:
            for n in t.nodes:
                if need >= t.node_gpus and free[n] == t.node_gpus:
                    ids += [n] * t.node_gpus
                    free[n] = 0
                    need -= t.node_gpus
        if need:
            fit = [n for n in t.nodes if free[n] >= need]
            if fit:
                n = min(fit, key=lambda n: (free[n], n))
                ids += [n] * need
                free[n] -= need
                need = 0
        for n in sorted(t.nodes, key=lambda n: (-free[n], n)):
            if not need:
                break
            take = min(free[n], need)
            ids += [n] * take
            free[n] -= take
            need -= take
        if ids:
            out[job.name] = Placement.of(ids)
    return out
