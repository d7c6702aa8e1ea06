"""Sim-internal mutable state of one training job, integrated in closed form.

Two models per job (ALGORITHMS §1b): the ground truth (:class:`GroundTruth`, a
memoized view of an :class:`~deepboot.perf.application.Application`) advances the
job; the job's own fitted model (refitted from the points it has run at) is what
the scheduler sees through :meth:`SimJob.view`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from deepboot.core.jobs import TrainingJobSpec
from deepboot.core.modes import JobMode
from deepboot.core.params import GradParams, PerfParams
from deepboot.core.placement import EMPTY, Placement
from deepboot.core.state import JobView, TypeModel
from deepboot.perf.application import Application
from deepboot.perf.fit import fit_perf_params
from deepboot.perf.goodput import GoodputModel, select_batch
from deepboot.perf.restart import RestartCostModel, job_restart_delay
from deepboot.world.sizing import replica_cap, target_batch

ProfileKey = tuple[int, int, int]
"""(num_nodes, num_replicas, local_bsz) of one measured configuration."""


Profile = tuple[tuple[ProfileKey, tuple[float, float]], ...]
"""A job's measurements in the order it made them: ((key, (step, sync)), ...)."""


class GroundTruth:
    """Memoized ground-truth lookups of one application, shared by all its jobs.

    The application is immutable, so each (shape, batch) or (batch, epoch) query is
    computed once per simulation. Throughput fits are memoized too: a fit is a pure
    function of the measured points, and jobs of one application mostly run through
    the same configurations in the same order (tens of times fewer fits on the
    Pollux workloads, with identical results).
    """

    __slots__ = (
        "app",
        "final_progress",
        "_step",
        "_grad",
        "_progress",
        "_fits",
        "_picks",
        "_peak",
    )

    def __init__(self, app: Application) -> None:
        self.app = app
        self._step: dict[tuple[tuple[int, ...], int], tuple[float, float]] = {}
        self._grad: dict[tuple[int, int], tuple[float, float]] = {}
        self._progress: dict[int, float] = {}
        self._fits: dict[Profile, PerfParams] = {}
        self._picks: dict[tuple[PerfParams, GradParams, int, int], tuple[int, int]] = {}
        self._peak: float | None = None
        self.final_progress = self.progress(app.max_epochs)

    def peak_one_gpu(self) -> float:
        """The most samples per second one GPU reaches, over the per-GPU batches
        within the limits (both ends, and every power of two and three times one
        between them), memoized."""
        if self._peak is None:
            lo, hi = self.app.limits.min_local_bsz, self.app.limits.max_local_bsz
            batches = {lo, hi}
            b = 1
            while b <= hi:
                batches |= {x for x in (b, 3 * b) if lo <= x <= hi}
                b *= 2
            self._peak = max(x / self.step_time((1,), x)[0] for x in sorted(batches))
        return self._peak

    def fit(self, profile: Profile) -> PerfParams:
        """The throughput model fitted to ``profile`` (non-empty), memoized."""
        hit = self._fits.get(profile)
        if hit is None:
            cols = np.array([k for k, _ in profile], dtype=np.int64)  # (P, 3)
            times = np.array([v for _, v in profile], dtype=np.float64)  # (P, 2): step, sync
            # Start from the fit of the same points but the newest, when there is one:
            # same minimum, fewer iterations.
            hit = self._fits[profile] = fit_perf_params(
                cols[:, 0],
                cols[:, 1],
                cols[:, 2],
                times[:, 0] - times[:, 1],
                times[:, 0],
                start=self._fits.get(profile[:-1]),
            )
        return hit

    def adaptive_batch(
        self, perf: PerfParams, grad: GradParams, num_nodes: int, num_replicas: int
    ) -> tuple[int, int]:
        """(atomic_bsz, accum_steps) maximizing the goodput of a job's own model, memoized.

        The choice is a pure function of the model and the placement's size, and jobs
        of one application share fits (see :meth:`fit`).
        """
        key = (perf, grad, num_nodes, num_replicas)
        hit = self._picks.get(key)
        if hit is None:
            model = GoodputModel(perf, grad, self.app.limits)
            hit = self._picks[key] = select_batch(model, self.app.limits, num_nodes, num_replicas)
        return hit

    def step_time(self, shape: tuple[int, ...], local_bsz: int) -> tuple[float, float]:
        """(step_time, sync_time) in seconds; see ``Application.step_time``."""
        key = (shape, local_bsz)
        hit = self._step.get(key)
        if hit is None:
            step, sync = self.app.step_time(shape, local_bsz)
            hit = self._step[key] = (float(step), float(sync))
        return hit

    def grad_stats(self, batch_size: int, epoch: int) -> tuple[float, float]:
        """(grad_sqr, grad_var); see ``Application.grad_stats``."""
        key = (batch_size, epoch)
        hit = self._grad.get(key)
        if hit is None:
            sqr, var = self.app.grad_stats(batch_size, epoch)
            hit = self._grad[key] = (float(sqr), float(var))
        return hit

    def progress(self, epoch: int) -> float:
        """Cumulative progress at the end of ``epoch`` epochs."""
        hit = self._progress.get(epoch)
        if hit is None:
            hit = self._progress[epoch] = float(self.app.progress_at(epoch))
        return hit


@dataclass(frozen=True, slots=True)
class JobCheckpoint:
    """Opaque saved state of a :class:`SimJob` (see :meth:`SimJob.checkpoint`)."""

    values: tuple[object, ...]
    profile_lens: tuple[tuple[str | None, int], ...]


_MUTABLE: tuple[str, ...] = (
    "truth",
    "gpu_type",
    "_profile",
    "placement",
    "_shape",
    "_num_nodes",
    "atomic_bsz",
    "accum_steps",
    "epoch",
    "progress",
    "restart_left",
    "restart_seconds",
    "num_restarts",
    "attained_service",
    "first_start",
    "completion",
    "time",
    "_perf",
    "_perf_stale",
    "_grad",
    "_max_profiled_replicas",
    "_pick_key",
    "_ran_key",
    "_ran_here",
)
"""Slots of SimJob that change after construction (``_profile`` only grows)."""


class SimJob:
    """One training job inside the simulator: placement, batch, progress, its model.

    Mutable and private to ``deepboot.sim``; policies only ever see :meth:`view`.
    Times are virtual seconds. ``time`` is the instant up to which the job's state
    has been integrated.

    Attributes:
        spec: The job as submitted.
        truth: Ground truth of its application.
        mode: Batch/replica regime of the policy.
        target_batch_size: Fixed total batch, or None when adaptive.
        placement: Its GPUs now (EMPTY when queued or preempted).
        atomic_bsz: Per-GPU micro-batch (0 without GPUs).
        accum_steps: Gradient-accumulation steps per optimizer step.
        epoch: Completed epochs.
        progress: Cumulative statistical progress.
        restart_left: Seconds of restart delay still to serve before progress resumes.
        restart_seconds: Restart delay served so far.
        num_restarts: Placement changes after the first start (None before it).
        attained_service: GPU-seconds held so far, restart delays included.
        first_start: Time of its first placement.
        completion: Time it finished its last epoch.
        time: Virtual time its state is integrated up to.
    """

    # Construction-time fields, then the mutable ones (listed once, in _MUTABLE).
    __slots__ = (
        "spec",
        "truth",
        "mode",
        "target_batch_size",
        "round_epoch_times",
        "_app_replica_cap",
        "_global_replica_cap",
        "_runtime_bounds",
        "_grad_min_replicas",
        "_profile_steps",
        "_restart_cost",
        "_truths",
        "_node_types",
        "_slowdown",
        "_model_per_type",
        "_profiles",
        *_MUTABLE,
    )

    def __init__(
        self,
        spec: TrainingJobSpec,
        truth: GroundTruth,
        mode: JobMode,
        *,
        fixed_batch_size: int | None = None,
        app_replica_cap: int | None = None,
        global_replica_cap: int = 64,
        round_epoch_times: bool = False,
        runtime_bounds: bool = False,
        grad_min_replicas: int = 1,
        profile_steps: int = 0,
        restart_cost: float | None = None,
        truths: dict[str, GroundTruth] | None = None,
        node_types: tuple[str | None, ...] = (),
        slowdown: float = 1.0,
        model_per_type: bool = True,
    ) -> None:
        """Create a job that has not been submitted yet.

        Args:
            spec: The job as submitted.
            truth: Ground truth of ``spec.application``.
            mode: The policy's job mode.
            fixed_batch_size: Total batch forced on the job even when ADAPTIVE (ncf).
            app_replica_cap: Per-application cap of ``max_replicas`` under ADAPTIVE
                and FIXED_BATCH (ncf: 1), or None.
            global_replica_cap: Cap of ``max_replicas`` under ADAPTIVE (reference 64).
            round_epoch_times: Round epoch-crossing intervals to whole seconds.
            runtime_bounds: Bound the job as the runtime bounds its jobs
                (``SimConfig.job_bounds = "runtime"``, see :attr:`max_replicas` and
                :meth:`view`) instead of by the reference simulator's rules.
            grad_min_replicas: Fewest GPUs a segment must run on for its gradient
                statistics to reach the job's view (``SimConfig.grad_min_replicas``):
                1 as the reference; 2 as the runtime, whose estimator compares ranks.
            profile_steps: Optimizer steps a configuration must run (after its
                restart delay) before its measurement reaches the job's view
                (``SimConfig.profile_steps``): 0 as the reference (known at once);
                2 as the runtime, which does not time a generation's first step.
            restart_cost: Seconds one resize of the job costs, as its view shows a
                policy (``JobView.restart_cost``; None: the policy's default;
                :func:`~deepboot.perf.restart.job_resize_cost`). What the job pays
                is charged by :meth:`reallocate`.
            truths: On a cluster of several GPU types, the ground truth of
                ``spec.application`` per type (``truth`` must be one of them: the one
                its view shows before it first runs); None on one type.
            node_types: Each node's GPU type, by node id (with ``truths``).
            slowdown: The ground truth's progress rate is divided by it
                (``SimConfig.slowdowns``); what the job measures is not.
            model_per_type: Keep one profile and fitted model per type (True), or
                one for every type, a configuration's first measurement kept
                whatever its type (False: a type-unaware job, as Sia's simulator
                runs its Pollux baseline).

        On several types, the job runs at its placement's type's ground truth (a
        placement spanning types: each step takes the slowest type's time, as a
        synchronous all-reduce waits for its slowest worker), keeps one profile and
        one fitted model per type, and a change of type is a restart from no GPUs
        (nothing of the old workers survives it).
        """
        self.spec = spec
        self.truth = truth
        self._truths = truths
        self._node_types = node_types
        self._slowdown = slowdown
        self._model_per_type = model_per_type
        self.gpu_type: str | None = None
        self.mode = mode
        self.target_batch_size = target_batch(mode, spec.batch_size, fixed_batch_size)
        self.round_epoch_times = round_epoch_times
        self._app_replica_cap = app_replica_cap
        self._global_replica_cap = global_replica_cap
        self._runtime_bounds = runtime_bounds
        self._grad_min_replicas = grad_min_replicas
        self._profile_steps = profile_steps
        self._restart_cost = restart_cost
        self.placement = EMPTY
        self._shape: tuple[int, ...] = ()
        self._num_nodes = 0
        self.atomic_bsz = 0
        self.accum_steps = 0
        self.epoch = 0
        self.progress = 0.0
        self.restart_left = 0.0
        self.restart_seconds = 0.0
        self.num_restarts: int | None = None
        self.attained_service = 0.0
        self.first_start: float | None = None
        self.completion: float | None = None
        self.time = spec.submit_time
        self._profile: dict[ProfileKey, tuple[float, float]] = {}
        self._profiles: dict[str | None, dict[ProfileKey, tuple[float, float]]] = {
            None: self._profile
        }
        self._perf: PerfParams | None = None
        self._perf_stale = False
        self._grad: GradParams | None = None
        self._max_profiled_replicas = 0
        self._pick_key: object = None
        # With profile_steps: the configuration being run and the seconds run on it.
        self._ran_key: ProfileKey | None = None
        self._ran_here = 0.0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def num_replicas(self) -> int:
        return self.placement.num_replicas

    @property
    def perf_params(self) -> PerfParams | None:
        """The job's own throughput model, refitted lazily after a new measurement."""
        if self._perf_stale:
            self._perf = self.truth.fit(tuple(self._profile.items()))
            self._perf_stale = False
        return self._perf

    @property
    def max_replicas(self) -> int:
        """Most GPUs a policy may give the job now (the reference's per-policy rule).

        ADAPTIVE: 2 x the largest replica count it has run at (1 before it ran),
        capped by max_batch_size // min_local_bsz and the global cap (64).
        FIXED_BATCH: its batch // min_local_bsz. FIXED: the replicas the user asked
        for. ADAPTIVE and FIXED_BATCH are further capped per application (ncf: 1).
        Never below 1. With runtime bounds, ADAPTIVE has no growth rule: the
        per-application cap plays the runtime's ``max_workers`` (as
        ``runtime.world.JobRec.bounds``).
        """
        if self._runtime_bounds:
            return replica_cap(
                self.mode,
                self.truth.app.limits,
                requested=self.spec.num_replicas,
                batch_size=self.spec.batch_size,
                cap=self._app_replica_cap,
            )
        return replica_cap(
            self.mode,
            self.truth.app.limits,
            requested=self.spec.num_replicas,
            batch_size=self.spec.batch_size,
            adaptive_cap=min(2 * self._max_profiled_replicas, self._global_replica_cap),
            cap=self._app_replica_cap,
        )

    def view(self, now: float) -> JobView:
        """The immutable snapshot of this job a policy may see at ``now``.

        Reference bounds: from 0 GPUs to :attr:`max_replicas`. Runtime bounds (as
        ``runtime.world.JobRec.view``): at least 1 (the runtime's ``min_workers``),
        and a job paying a resize's cost is pinned to its size (the runtime's job
        cannot change size until its new generation forms).
        """
        app = self.truth.app
        lo, hi = 0, self.max_replicas
        if self._runtime_bounds:
            held = self.placement.num_replicas
            lo, hi = (held, held) if held and self.restart_left > 0.0 else (1, hi)
        return JobView(
            name=self.spec.name,
            application=self.spec.application,
            submit_time=self.spec.submit_time,
            attained_service=self.attained_service,
            num_restarts=self.num_restarts or 0,
            placement=self.placement,
            min_replicas=lo,
            max_replicas=hi,
            limits=app.limits,
            perf_params=self.perf_params,
            grad_params=self._grad,
            target_num_replicas=self.spec.num_replicas,
            target_batch_size=self.target_batch_size,
            remaining_progress=max(self.truth.final_progress - self.progress, 0.0),
            restart_cost=self._restart_cost,
            types=self._type_models() if self._truths is not None else (),
        )

    def _type_models(self) -> tuple[TypeModel, ...]:
        """One :class:`~deepboot.core.state.TypeModel` per type of the cluster."""
        assert self._truths is not None
        out = []
        for gpu_type, truth in self._truths.items():
            profile = self._profiles.get(gpu_type)
            perf = self.perf_params if gpu_type == self.gpu_type else None
            if perf is None and profile:
                perf = truth.fit(tuple(profile.items()))
            out.append(TypeModel(gpu_type, truth.app.limits, truth.peak_one_gpu(), perf))
        return tuple(out)

    def reallocate(self, placement: Placement, now: float, restart: RestartCostModel) -> None:
        """Apply a new placement at ``now`` (the reference ``Job.reallocate``).

        A non-empty placement starts a restart delay (the first start included; priced
        by the job's resize mode, :func:`~deepboot.perf.restart.job_restart_delay`)
        and re-picks the batch size; every one after the first start counts as a
        restart. An empty one releases the GPUs and keeps the progress.
        """
        if placement == self.placement:
            return
        old_replicas = self.placement.num_replicas
        self.time = now
        self.placement = placement
        self._ran_key = None
        if not placement:
            self._shape = ()
            self._num_nodes = 0
            self.atomic_bsz = 0
            self.accum_steps = 0
            self._pick_key = None
            return
        self._shape = placement.shape()
        self._num_nodes = len(self._shape)
        if self._truths is not None and self._retype(placement):
            old_replicas = 0  # a change of type keeps no worker alive
        first = self.num_restarts is None
        self.num_restarts = 0 if first else (self.num_restarts or 0) + 1
        if first:
            self.first_start = now
        self.restart_left = float(
            job_restart_delay(restart, self.spec, old_replicas, placement.num_replicas, first)
        )
        self._repick()

    def _retype(self, placement: Placement) -> bool:
        """Point the job at ``placement``'s type (its slowest type's ground truth, its
        profile and fit); whether the type changed from the last one it ran on."""
        truths = self._truths
        assert truths is not None
        types = sorted({self._node_types[n] or "" for n in placement.node_ids})
        gpu_type = types[0]
        if len(types) > 1:
            # Spanning types: the slowest one's step decides (by the one-GPU time at
            # the smallest per-GPU batch every type measured).
            atomic = max(truths[t].app.limits.min_local_bsz for t in types)
            gpu_type = max(types, key=lambda t: truths[t].step_time((1,), atomic)[0])
        changed = self.gpu_type is not None and gpu_type != self.gpu_type
        if gpu_type != self.gpu_type:
            self.gpu_type = gpu_type
            self.truth = truths[gpu_type]
            self._pick_key = None
            if not self._model_per_type:
                return changed
            self._profile = self._profiles.setdefault(gpu_type, {})
            self._perf_stale = bool(self._profile)
            if not self._profile:
                self._perf = None
            self._pick_key = None
        return changed

    def checkpoint(self) -> JobCheckpoint:
        """Everything :meth:`advance` and :meth:`reallocate` may change, for :meth:`rollback`.

        The simulator integrates a job up to the next tick right after each round;
        when a reclaim resizes the job before that tick, it rolls back to the
        checkpoint taken at the round and integrates again up to the reclaim.
        """
        values = tuple(getattr(self, name) for name in _MUTABLE)
        return JobCheckpoint(values, tuple((t, len(p)) for t, p in self._profiles.items()))

    def rollback(self, cp: JobCheckpoint) -> None:
        """Restore the state saved by :meth:`checkpoint` (profile entries added since
        are dropped; the profile only ever grows, in insertion order)."""
        for name, value in zip(_MUTABLE, cp.values, strict=True):
            setattr(self, name, value)
        kept = dict(cp.profile_lens)
        for gpu_type in [t for t in self._profiles if t not in kept]:
            del self._profiles[gpu_type]
        for gpu_type, length in kept.items():
            profile = self._profiles[gpu_type]
            while len(profile) > length:
                profile.popitem()

    def advance(self, until: float) -> float | None:
        """Integrate the job from ``self.time`` to ``until`` on its current placement.

        Closed form, one segment per epoch (the reference ``Job.step``): restart delay
        first (GPU time, no progress); then, per segment, the ground-truth step time
        and gradient statistics at the current batch give a constant rate
        ``gain / (step + (step - sync) * accum)``; the segment ends at the next epoch
        boundary or at ``until``. Each segment records its measurement in the job's
        profile, and the batch is re-picked after it.

        Epoch-crossing times are exact unless ``round_epoch_times`` is set (the
        reference rounds each crossing interval to whole seconds). Either way a
        completion is only acted upon at the next scheduling tick: the GPUs stay
        held until then, as in the reference.

        Returns:
            The completion time if the job finished in ``(self.time, until]``,
            else None.
        """
        span = until - self.time
        if span <= 0.0 or self.completion is not None:
            return None
        if not self.placement:
            self.time = until
            return None
        replicas = self.placement.num_replicas
        if self.restart_left > 0.0:
            d = min(self.restart_left, span)
            self.restart_left -= d
            self.restart_seconds += d
            self.attained_service += d * replicas
            self.time += d
            span -= d
        truth = self.truth
        max_epochs = truth.app.max_epochs
        init_batch = truth.app.limits.init_batch_size
        while span > 0.0:
            if self.epoch >= max_epochs:
                self.completion = self.time
                return self.completion
            atomic, accum = self.atomic_bsz, self.accum_steps
            batch = replicas * atomic * (accum + 1)
            step, sync = truth.step_time(self._shape, atomic)
            sqr, var = truth.grad_stats(batch, self.epoch)
            if self._profile_steps:
                # Measured only once this configuration ran profile_steps steps.
                key = (self._num_nodes, replicas, atomic)
                if key != self._ran_key:
                    self._ran_key, self._ran_here = key, 0.0
                enough = self._profile_steps * (step + (step - sync) * accum)
                if self._ran_here >= enough:
                    self._measure(atomic, step, sync, sqr, var)
            else:
                self._measure(atomic, step, sync, sqr, var)
            scale = batch / init_batch
            denom = var / scale + sqr
            gain = (var + sqr) / denom if denom > 0.0 else 1.0
            rate = gain / (step + (step - sync) * accum)
            if self._slowdown != 1.0:
                rate /= self._slowdown
            target = truth.progress(self.epoch + 1)
            if not rate > 0.0 or self.progress + rate * span < target:
                # The whole span stays inside this epoch.
                if rate > 0.0:
                    self.progress += rate * span
                self._run(span, replicas)
                if self._profile_steps:
                    self._ran_here += span
                    if self._ran_here >= enough:
                        self._measure(atomic, step, sync, sqr, var)
                span = 0.0
            else:
                delta = (target - self.progress) / rate
                if self.round_epoch_times:
                    delta = float(round(delta))
                delta = min(max(delta, 0.0), span)
                self.epoch += 1
                self.progress = target
                self._run(delta, replicas)
                if self._profile_steps:
                    self._ran_here += delta
                    if self._ran_here >= enough:
                        self._measure(atomic, step, sync, sqr, var)
                span -= delta
                if self.epoch >= max_epochs:
                    self.completion = self.time
                    return self.completion
            self._repick()
        self.time = until
        return None

    def _run(self, seconds: float, replicas: int) -> None:
        self.time += seconds
        self.attained_service += seconds * replicas

    def _measure(self, atomic: int, step: float, sync: float, sqr: float, var: float) -> None:
        """Record what running one segment measured (the reference update_params).

        Gradient statistics are taken only from segments on at least
        ``grad_min_replicas`` GPUs (a job keeps the last ones it had).
        """
        seen = self.placement.num_replicas >= self._grad_min_replicas
        if seen and (self._grad is None or self._grad.sqr != sqr or self._grad.var != var):
            self._grad = GradParams(sqr, var)
        key = (self._num_nodes, self.placement.num_replicas, atomic)
        if key in self._profile:
            return
        self._profile[key] = (step, sync)
        self._perf_stale = True
        if key[1] > self._max_profiled_replicas:
            self._max_profiled_replicas = key[1]

    def _repick(self) -> None:
        """Re-choose per-GPU batch and accumulation (the reference update_local_bsz).

        Skipped when nothing it depends on changed since the last pick.
        """
        replicas = self.placement.num_replicas
        if self.target_batch_size is not None:
            key: object = (replicas,)
        else:
            key = (replicas, self._num_nodes, len(self._profile), self._grad)
        if key == self._pick_key:
            return
        perf = self.perf_params if self.target_batch_size is None else None
        if perf is not None and self._grad is not None:
            pick = self.truth.adaptive_batch(perf, self._grad, self._num_nodes, replicas)
        else:
            # Fixed batch, or adaptive before any measurement: max(M0, K * min_local).
            pick = select_batch(
                None, self.truth.app.limits, self._num_nodes, replicas, self.target_batch_size
            )
        self.atomic_bsz, self.accum_steps = pick
        self._pick_key = key
