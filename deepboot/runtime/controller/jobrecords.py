"""The runtime's picture of the world: GPUs and jobs, as the controller knows them.

Pure bookkeeping (no Ray, no SQLite): the controller fills it from workers' reports
and the store, :class:`~deepboot.runtime.controller.adapter.RayBackend` turns it into the
control loop's :class:`~deepboot.scheduler.control.Snapshot` and changes it by the
operations of each step.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import numpy as np

from deepboot.core.errors import InvalidDecisionError
from deepboot.core.gpu import GpuId
from deepboot.core.modes import JobMode
from deepboot.core.params import GradParams, PerfParams
from deepboot.core.placement import EMPTY, Placement
from deepboot.core.state import JobView
from deepboot.elastic.protocol import Generation, Measurement, WorkerReport
from deepboot.perf.fit import fit_perf_params
from deepboot.perf.goodput import GoodputModel, select_batch
from deepboot.runtime.client.jobspec import JobSpec
from deepboot.runtime.store.jobstore import JobRow, JobState
from deepboot.world.gpus import BoardGpu, GpuBoard
from deepboot.world.sizing import replica_cap, target_batch

JOB_TRANSITIONS: Mapping[JobState, frozenset[JobState]] = MappingProxyType(
    {
        # Seen by the controller: queued, or refused/cancelled before it ever ran.
        JobState.SUBMITTED: frozenset({JobState.QUEUED, JobState.FAILED, JobState.CANCELLED}),
        # Placed (a generation offered), or ended without ever forming.
        JobState.QUEUED: frozenset(
            {JobState.QUEUED, JobState.RUNNING, JobState.FAILED, JobState.CANCELLED}
        ),
        # Resized (a new generation), preempted or every worker lost (back to the
        # queue), or ended.
        JobState.RUNNING: frozenset(
            {
                JobState.RUNNING,
                JobState.QUEUED,
                JobState.FINISHED,
                JobState.FAILED,
                JobState.CANCELLED,
            }
        ),
        JobState.FINISHED: frozenset(),
        JobState.FAILED: frozenset(),
        JobState.CANCELLED: frozenset(),
    }
)
"""Where a job may go from each state (:meth:`JobRec.move` checks every move, as the
GPU ledger checks every GPU's). An ended job goes nowhere."""


class JobTransitionError(InvalidDecisionError):
    """A job move that :data:`JOB_TRANSITIONS` does not allow."""


def gpu_name(gpu: GpuId) -> str:
    """ "node.index", the worker id of the worker on ``gpu``."""
    return f"{gpu[0]}.{gpu[1]}"


def parse_gpu(name: str) -> GpuId:
    node, index = name.split(".")
    return (int(node), int(index))


@dataclass
class Transition:
    """A generation offered but not yet formed by all its members."""

    how: str  # "start", "afe", "restart", "failure", "stop"
    generation: int
    started: float
    old: tuple[str, ...]
    steps_before: int = 0


RESIZE_COSTS_KEPT = 20
"""Measured resize costs a job keeps (its cost is their median)."""

REFIT_UNTIL = 64
"""The online model refits when a configuration's samples reach 2, 4, ... this many
(past it, a mean moves too little to matter; each refit is an L-BFGS-B fit)."""


@dataclass
class OnlineModel:
    """A job's goodput model, fitted online from its workers' measurements.

    ``profile`` maps (num_nodes, num_replicas, local_bsz) to running sums of
    (count, compute_time, step_time); the throughput model is refitted (warm-started)
    whenever a new configuration is measured, as Pollux does, and again each time a
    configuration's count of samples doubles (2, 4, ... :data:`REFIT_UNTIL`): a
    configuration's first step after a resize is its slowest, and a fit left on it
    misjudged the job until it ran somewhere new (the twin's simulator, which fits
    the measured means, then decided otherwise).
    """

    profile: dict[tuple[int, int, int], list[float]] = field(default_factory=dict)
    perf: PerfParams | None = None
    grad: GradParams | None = None
    failures: int = 0  # a command job's failures restarted so far
    resize_costs: list[float] = field(default_factory=list)  # measured, newest last

    def note_resize_cost(self, seconds: float) -> None:
        """A resize's measured cost (stop to first progress), the newest
        :data:`RESIZE_COSTS_KEPT` kept."""
        self.resize_costs = [*self.resize_costs, round(seconds, 3)][-RESIZE_COSTS_KEPT:]

    def resize_cost(self) -> float | None:
        """The median measured resize cost; None before the first."""
        return float(np.median(self.resize_costs)) if self.resize_costs else None

    def add(self, ms: tuple[Measurement, ...]) -> None:
        fresh = False
        for m in ms:
            key = (m.num_nodes, m.num_replicas, m.local_bsz)
            if not (m.compute_time > 0 and m.step_time >= m.compute_time):
                continue
            acc = self.profile.get(key)
            if acc is None:
                acc = self.profile[key] = [0.0, 0.0, 0.0]
                fresh = True
            acc[0] += 1
            acc[1] += m.compute_time
            acc[2] += m.step_time
            n = int(acc[0])
            fresh = fresh or (n <= REFIT_UNTIL and n & (n - 1) == 0)  # a power of two
        if fresh or (ms and self.perf is None):
            self.refit()

    def refit(self) -> None:
        if not self.profile:
            return
        keys = sorted(self.profile)
        cols = np.array(keys, dtype=np.int64)
        acc = np.array([self.profile[k] for k in keys], dtype=np.float64)
        self.perf = fit_perf_params(
            cols[:, 0],
            cols[:, 1],
            cols[:, 2],
            acc[:, 1] / acc[:, 0],
            acc[:, 2] / acc[:, 0],
            start=self.perf,
        )

    def note_grad(self, report: WorkerReport) -> None:
        if math.isfinite(report.grad_sqr) and math.isfinite(report.grad_var):
            self.grad = GradParams(report.grad_sqr, report.grad_var)

    def to_json(self) -> str:
        return json.dumps(
            {
                "profile": [[*k, *v] for k, v in sorted(self.profile.items())],
                "perf": None if self.perf is None else list(_fields(self.perf)),
                "grad": None if self.grad is None else [self.grad.sqr, self.grad.var],
                "failures": self.failures,
                "resize_costs": self.resize_costs,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> OnlineModel:
        raw = json.loads(text or "{}")
        model = cls()
        for row in raw.get("profile", []):
            model.profile[(int(row[0]), int(row[1]), int(row[2]))] = list(map(float, row[3:]))
        if raw.get("perf"):
            model.perf = PerfParams(*raw["perf"])
        if raw.get("grad"):
            model.grad = GradParams(*raw["grad"])
        model.failures = int(raw.get("failures", 0))
        model.resize_costs = [float(c) for c in raw.get("resize_costs", [])]
        return model


NEUTRAL_GRAD = GradParams(1.0, 0.0)
"""Gradient statistics of a job known only by its measured profile: no noise, so its
statistical efficiency is 1 at any batch (its batch is its script's, fixed)."""


def _prior(
    spec: JobSpec, perf: PerfParams | None, grad: GradParams | None
) -> tuple[PerfParams | None, GradParams | None]:
    """A job's model where its own is incomplete: the throughput model its own
    measurements fitted, else its file's measured ``profile``, else its
    ``application``'s catalog model; its gradient statistics its own, else its
    ``application``'s, else, for a job with a profile or a command job (which reports
    none: its batch is its script's, fixed), :data:`NEUTRAL_GRAD`. An ``entry`` job
    with neither stays as it is: no model until its workers measured both (the
    policies' linear speedup)."""
    if perf is None and spec.profile_fit:
        perf = PerfParams(*spec.profile_fit)
    if perf is None and spec.application:
        perf = catalog_prior(spec.application, spec.batch_size)[0]
    if perf is not None and grad is None:
        if spec.application:
            grad = catalog_prior(spec.application, spec.batch_size)[1]
        elif spec.profile_fit or spec.command:
            grad = NEUTRAL_GRAD
    return perf, grad


@functools.lru_cache(maxsize=64)
def catalog_prior(application: str, batch_size: int) -> tuple[PerfParams, GradParams]:
    """The catalog's throughput model of ``application`` and its gradient statistics
    at ``batch_size`` at the start of training: a job's prior until it measures its
    own (the catalog ships with the package; read once)."""
    from deepboot.perf.catalog import load_catalog

    app = load_catalog()[application]
    sqr, var = app.grad_stats(batch_size, 0)
    return app.perf, GradParams(sqr, var)


def _fields(p: PerfParams) -> tuple[float, ...]:
    return (p.alpha_c, p.beta_c, p.alpha_n, p.beta_n, p.alpha_r, p.beta_r, p.gamma)


@dataclass
class JobRec:
    """One job as the controller tracks it.

    Attributes:
        row: The store's row (replaced, never mutated, on every change).
        gen: The latest generation offered (its members are the job's workers).
        formed: Number of the latest generation every member has formed.
        actors: gpu id -> actor name of its members' workers.
        leaving: actor name -> gpu id of workers told to leave (killed once departed,
            or once they overstay ``leave_timeout``).
        leaving_since: actor name -> when it was told to leave.
        transition: The generation being formed, if any.
        lost: Members of ``gen`` whose worker died; the survivors wait for the control
            loop's round on the death (``WORKER_LOST``) to say where the job goes on.
        model: The online goodput model.
        reports: The latest report of each worker.
        on_move: Told ``(job, from, to)`` of each move that changes the state
            (:meth:`move`); the controller's event log records it.
        retry_at: A command job backing off after a failure: when its group starts
            again (None: not backing off).
        progress_pending: A command job's start or restart whose processes run and
            have not shown progress yet: (when it began, "start" or "restart"); its
            cost ends at the first progress.
    """

    row: JobRow
    gen: Generation | None = None
    formed: int = 0
    actors: dict[str, str] = field(default_factory=dict)
    leaving: dict[str, str] = field(default_factory=dict)
    leaving_since: dict[str, float] = field(default_factory=dict)
    transition: Transition | None = None
    lost: tuple[str, ...] = ()
    model: OnlineModel = field(default_factory=OnlineModel)
    reports: dict[str, WorkerReport] = field(default_factory=dict)
    on_move: Callable[[str, JobState, JobState], None] | None = field(
        default=None, repr=False, compare=False
    )
    retry_at: float | None = None
    progress_pending: tuple[float, str] | None = None
    # The last view and what it was built from (:meth:`view`).
    _view: tuple[tuple[object, ...], JobView] | None = field(
        default=None, repr=False, compare=False
    )

    @property
    def name(self) -> str:
        return self.row.name

    @property
    def members(self) -> tuple[str, ...]:
        if self.gen is None or self.gen.stop:
            return ()
        return self.gen.members

    def leave(self, name: str, gpu: str, now: float) -> None:
        """Worker ``name`` (on ``gpu``) was told to leave at ``now``."""
        self.leaving[name] = gpu
        self.leaving_since.setdefault(name, now)

    def update(self, **changes: Any) -> None:
        """Replace the row's fields in ``changes`` (never its state: :meth:`move`)."""
        assert "state" not in changes, "a job's state changes by move()"
        self.row = replace(self.row, **changes)

    def move(self, to: JobState, **changes: Any) -> None:
        """Move the job to state ``to`` (and replace the row's fields in ``changes``).

        Raises:
            JobTransitionError: :data:`JOB_TRANSITIONS` has no such move.
        """
        now = self.row.state
        if to not in JOB_TRANSITIONS[now]:
            raise JobTransitionError(f"job {self.name}: no move from {now.value} to {to.value}")
        self.row = replace(self.row, state=to, **changes)
        if to is not now and self.on_move is not None:
            self.on_move(self.name, now, to)

    def batch_for(self, num_nodes: int, num_replicas: int, mode: JobMode) -> tuple[int, int]:
        """(local_bsz, micro-batches per step) for a size: the user's batch split over
        the workers when the policy's ``mode`` keeps it, else the goodput model's pick.

        ``select_batch`` counts Pollux's *extra* accumulation steps s (a step is s + 1
        micro-batches); the generation carries s + 1.
        """
        spec = self.row.spec
        limits = spec.limits
        model = None
        if self.model.perf is not None and self.model.grad is not None:
            model = GoodputModel(self.model.perf, self.model.grad, limits)
        target = target_batch(mode, spec.batch_size)
        local_bsz, extra = select_batch(model, limits, num_nodes, num_replicas, target)
        return local_bsz, extra + 1

    def bounds(self, mode: JobMode) -> tuple[int, int]:
        """(fewest, most) GPUs a policy of ``mode`` may give the job: the user's
        ``min_workers``, and :func:`~deepboot.world.sizing.replica_cap` with the
        user's ``max_workers`` as the cap (no growth rule of the simulator's: a real
        job names its own most). The fewest may exceed the most (a fixed batch too
        small to split over ``min_workers``): the job can never run."""
        spec = self.row.spec
        most = replica_cap(
            mode,
            spec.limits,
            requested=spec.requested,
            batch_size=spec.batch_size,
            cap=spec.max_workers,
        )
        return spec.min_workers, most

    def restart_cost(self) -> float | None:
        """The seconds one resize of this job costs, as the policy is told
        (``JobView.restart_cost``; the policy charges at least its own delta): None for
        an AFE job (the policy's delta stands for it); for a command job the median of
        its measured restarts (a stop, or a start, to the first progress), or, before
        one is measured, the cold start of its ``application`` in DeepBoot's table
        (None without one)."""
        spec = self.row.spec
        if not spec.command:
            return None
        measured = self.model.resize_cost()
        if measured is None:
            from deepboot.perf.restart import DEEPBOOT_RESTART_TABLE

            known = DEEPBOOT_RESTART_TABLE.get(spec.application)
            return None if known is None else known.cold
        return measured

    def view(self, board: GpuBoard, mode: JobMode) -> JobView:
        """The job as a policy of ``mode`` sees it now (see :meth:`bounds`).

        A command job's batch is its script's own (fixed); until it reports its own
        throughput, its prior stands for it (:func:`_prior`; none: the
        policies' linear speedup).

        The same view again while nothing it is built from changed (it is a function
        of the key below: the row, the job's GPUs on the ledger, whose nodes never
        move, the mode, whether it is mid-resize, and the online model's fields)."""
        gpus = board.held(self.name)
        model = self.model
        key = (self.row, gpus, mode, self.transition is None, model.perf, model.grad,
               tuple(model.resize_costs))  # fmt: skip
        cached = self._view
        if cached is not None and cached[0] == key:
            return cached[1]
        view = self._build_view(gpus, mode)
        self._view = (key, view)
        return view

    def _build_view(self, gpus: tuple[BoardGpu, ...], mode: JobMode) -> JobView:
        spec = self.row.spec
        held = sorted(g.node_id for g in gpus)
        placement = Placement.of(held) if held else EMPTY
        lo, hi = self.bounds(mode)
        if self.transition is not None and held:
            # Mid-resize: the job cannot change size until its generation forms.
            lo = hi = len(held)
        perf, grad = self.model.perf, self.model.grad
        if perf is None or grad is None:
            perf, grad = _prior(spec, perf, grad)
        return JobView(
            name=self.name,
            application=self.name,
            submit_time=self.row.submitted,
            attained_service=self.row.attained,
            num_restarts=self.row.restarts,
            placement=placement,
            min_replicas=lo,
            max_replicas=hi,
            limits=spec.limits,
            perf_params=perf,
            grad_params=grad,
            target_num_replicas=spec.requested,
            target_batch_size=spec.batch_size
            if spec.command
            else target_batch(mode, spec.batch_size),
            restart_cost=self.restart_cost(),
        )

    @property
    def active(self) -> bool:
        return self.row.state in (JobState.QUEUED, JobState.RUNNING)
