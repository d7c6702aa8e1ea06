"""Per-job records and the run summary of one simulation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from deepboot.core.cluster import ClusterSpec, Pool
from deepboot.core.gpu import GpuState
from deepboot.core.service import DEFAULT_SLO_TARGET, DEFAULT_SLO_WAIT_S
from deepboot.sim.job import SimJob

_BUSY = (GpuState.TRAINING, GpuState.LENT, GpuState.RUNNING)


@dataclass(frozen=True, slots=True)
class JobRecord:
    """The outcome of one training job. Times are virtual seconds.

    Attributes:
        name: Job name.
        application: Model name.
        submit: Submission time.
        first_start: Time of its first placement (None if it never ran).
        completion: Time it finished (None if it did not finish before the end).
        jct: completion - submit (None if unfinished).
        queue_delay: first_start - submit, the wait before its first start (None if
            it never ran).
        restarts: Placement changes after its first start.
        restart_s: Seconds of restart delay it served (first start included).
        gpu_seconds: GPU-seconds it held (restart delays included).
    """

    name: str
    application: str
    submit: float
    first_start: float | None
    completion: float | None
    jct: float | None
    queue_delay: float | None
    restarts: int
    restart_s: float
    gpu_seconds: float

    @classmethod
    def of(cls, job: SimJob) -> JobRecord:
        """Freeze the outcome of a simulated job."""
        submit = job.spec.submit_time
        return cls(
            name=job.name,
            application=job.spec.application,
            submit=submit,
            first_start=job.first_start,
            completion=job.completion,
            jct=None if job.completion is None else job.completion - submit,
            queue_delay=None if job.first_start is None else job.first_start - submit,
            restarts=job.num_restarts or 0,
            restart_s=job.restart_seconds,
            gpu_seconds=job.attained_service,
        )


@dataclass(frozen=True, slots=True)
class InferenceRecord:
    """The outcome of one inference task. Times are virtual seconds.

    Attributes:
        name: Task name.
        service: Its service id (``infer-<model>-<k>``).
        model: Model of the service.
        submit: Arrival time.
        start: When it began serving, after the replica's cold start if it had one
            (None if it never got a GPU before the end of the run).
        end: When it finished (None if it did not finish before the end).
        cold: It needed a new replica (a cold start), not a warm one.
        delay: start - submit: queueing plus cold start (None if it never started).
        host: Its new replica started from the node's host-memory cache (a host
            start, not a cold one).
    """

    name: str
    service: str
    model: str
    submit: float
    start: float | None
    end: float | None
    cold: bool
    delay: float | None
    host: bool = False


@dataclass(frozen=True, slots=True)
class TimelinePoint:
    """GPU counts per use right after the events at time ``t`` (a step function).

    Attributes:
        t: Virtual time.
        training: TRAINING GPUs (training workers on the training pool).
        lent: LENT GPUs (training workers on inference-pool GPUs).
        running: RUNNING GPUs (serving an inference task, cold start included).
        protect: PROTECT GPUs (idle replicas kept warm, not lendable).
        sleep: SLEEP GPUs (idle replicas, lendable).
        free: FREE GPUs.
    """

    t: float
    training: int
    lent: int
    running: int
    protect: int
    sleep: int
    free: int

    @property
    def total(self) -> int:
        return self.training + self.lent + self.running + self.protect + self.sleep + self.free


def _stat(values: Sequence[float], fn: str) -> float:
    if not values:
        return 0.0
    arr = np.asarray(values, dtype=np.float64)
    if fn == "mean":
        return float(arr.mean())
    if fn == "median":
        return float(np.median(arr))
    if fn == "p99":
        return float(np.percentile(arr, 99))
    return float(arr.max())


@dataclass(frozen=True, slots=True)
class SimResult:
    """Everything one simulation produced; immutable.

    Attributes:
        jobs: One record per training job, in workload order.
        cluster: The simulated cluster.
        rounds: Scheduling rounds (ticks where the policy was consulted).
        decision_ms: Wall-clock milliseconds of each round's decision, in order.
        wall_s: Wall-clock seconds of the whole run.
        end_time: Virtual time of the last event handled.
        inference: One record per inference task, in arrival order (empty when the
            cluster has no inference pool).
        timeline: GPU counts per state after each event time, consecutive duplicates
            dropped (a step function over the run).
        reclaim_times: Time of each GPU taken back from training, in order.
        proactive_reclaim_times: The reclaims of ``reclaim_times`` made ahead of
            demand (before the requests that need the GPU arrived), in order.
        start_time: Virtual time of the first event handled.
        gpu_seconds: GPU-seconds per (pool, state) over [start_time, end_time]; they
            add up to the cluster's GPUs times that span.
        slo_wait_s: Each service's request SLO, seconds (missing: the default, 1 s).
        slo_target: Each service's target attainment (missing: the default, 0.99).
        host_cache: The run kept evicted models in host memory (then the summary
            counts host starts apart from cold starts).
    """

    jobs: tuple[JobRecord, ...]
    cluster: ClusterSpec
    rounds: int
    decision_ms: tuple[float, ...]
    wall_s: float
    end_time: float
    inference: tuple[InferenceRecord, ...] = ()
    timeline: tuple[TimelinePoint, ...] = ()
    reclaim_times: tuple[float, ...] = ()
    proactive_reclaim_times: tuple[float, ...] = ()
    start_time: float = 0.0
    gpu_seconds: Mapping[tuple[Pool, GpuState], float] = field(
        default_factory=lambda: MappingProxyType({})
    )
    slo_wait_s: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    slo_target: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    host_cache: bool = False

    def state_seconds(self, state: GpuState, pool: Pool | None = None) -> float:
        """GPU-seconds spent in ``state`` (in ``pool``, or the whole cluster)."""
        return sum(v for (p, s), v in self.gpu_seconds.items() if s is state and pool in (None, p))

    def utilisation(self, pool: Pool) -> float:
        """Busy GPU-seconds of ``pool`` / (its GPUs x the run's span); 0.0 when empty.

        Busy means doing work: TRAINING, LENT or RUNNING (a replica's cold start
        included). Idle replicas (PROTECT, SLEEP) and FREE GPUs are not busy. The
        span is [``start_time``, ``end_time``], from the first event to the last.
        """
        gpus = sum(n.gpus for n in self.cluster.nodes if n.pool is pool)
        span = self.end_time - self.start_time
        if gpus == 0 or span <= 0:
            return 0.0
        busy = sum(self.state_seconds(s, pool) for s in _BUSY)
        return busy / (gpus * span)

    @property
    def completed(self) -> tuple[JobRecord, ...]:
        """Records of the jobs that finished."""
        return tuple(r for r in self.jobs if r.completion is not None)

    def summary(self, policy: str, workload: str) -> dict[str, Any]:
        """The run summary (``deepboot.report.schema`` layout; keys are never renamed).

        JCT statistics are over finished jobs; ``avg_queue_s`` over jobs that started;
        ``makespan_s`` is the last completion minus the first submission;
        ``restart_s`` sums the restart delay each job served (job-seconds, first
        starts included); ``max_job_restarts`` and ``max_job_restart_s`` are the
        most restarts, and the most restart seconds, of any one job (the thrash
        check); ``p99`` interpolates linearly. Empty sets give 0.0.

        ``inference`` delays are over the tasks that started; its SLO fields
        (attainment, the worst window, late requests, ``per_service``) are
        :func:`deepboot.sim.slo_accounting.slo_summary`'s; ``reclaims_proactive`` are the
        reclaims made ahead of demand, ``reclaims_reactive`` the others.
        ``cluster.lent_gpu_s`` is the GPU-seconds spent LENT; ``reclaims`` counts GPUs
        taken back; ``util_*_pool`` is :meth:`utilisation`.
        """
        from deepboot.sim.slo_accounting import slo_summary

        done = self.completed
        jcts = [r.jct for r in done if r.jct is not None]
        queues = [r.queue_delay for r in self.jobs if r.queue_delay is not None]
        makespan = 0.0
        if done:
            makespan = max(r.completion for r in done if r.completion is not None) - min(
                r.submit for r in self.jobs
            )
        inference_nodes = sum(1 for n in self.cluster.nodes if n.pool is Pool.INFERENCE)
        started = [r.delay for r in self.inference if r.delay is not None]
        return {
            "policy": policy,
            "workload": workload,
            "cluster": {
                "nodes": self.cluster.num_nodes,
                "gpus_per_node": self.cluster.gpus_per_node,
                "inference_nodes": inference_nodes,
                "lent_gpu_s": self.state_seconds(GpuState.LENT),
                "reclaims": len(self.reclaim_times),
                "util_training_pool": self.utilisation(Pool.TRAINING),
                "util_inference_pool": self.utilisation(Pool.INFERENCE),
                # Only where it says more than nodes x GPUs (report/schema.py).
                **({"shape": self.cluster.shape_text()} if self.cluster.heterogeneous else {}),
            },
            "training": {
                "jobs": len(self.jobs),
                "completed": len(done),
                "avg_jct_s": _stat(jcts, "mean"),
                "median_jct_s": _stat(jcts, "median"),
                "p99_jct_s": _stat(jcts, "p99"),
                "makespan_s": makespan,
                "avg_queue_s": _stat(queues, "mean"),
                "restarts": sum(r.restarts for r in self.jobs),
                "restart_s": sum(r.restart_s for r in self.jobs),
                "max_job_restarts": max((r.restarts for r in self.jobs), default=0),
                "max_job_restart_s": max((r.restart_s for r in self.jobs), default=0.0),
            },
            "inference": {
                "tasks": len(self.inference),
                "completed": sum(1 for r in self.inference if r.end is not None),
                "cold_starts": sum(
                    1 for r in self.inference if r.start is not None and r.cold and not r.host
                ),
                **self._host_starts(),
                "warm_hits": sum(1 for r in self.inference if r.start is not None and not r.cold),
                "avg_delay_s": _stat(started, "mean"),
                "p99_delay_s": _stat(started, "p99"),
                **self._slo(slo_summary),
            },
            "scheduler": {
                "rounds": self.rounds,
                "decision_ms_median": _stat(self.decision_ms, "median"),
                "decision_ms_max": _stat(self.decision_ms, "max"),
            },
            "wall_s": self.wall_s,
        }

    def _host_starts(self) -> dict[str, int]:
        """``host_starts`` (new replicas started from host memory), for a run with
        the host cache only: without it the summary is as it always was."""
        if not self.host_cache:
            return {}
        return {"host_starts": sum(1 for r in self.inference if r.start is not None and r.host)}

    def _slo(self, slo_summary: Any) -> dict[str, Any]:
        services = {r.service for r in self.inference}
        wait = {s: self.slo_wait_s.get(s, DEFAULT_SLO_WAIT_S) for s in services}
        target = {s: self.slo_target.get(s, DEFAULT_SLO_TARGET) for s in services}
        out: dict[str, Any] = slo_summary(self.inference, wait, target)
        proactive = len(self.proactive_reclaim_times)
        per_service = out.pop("per_service")
        out["reclaims_proactive"] = proactive
        out["reclaims_reactive"] = len(self.reclaim_times) - proactive
        out["per_service"] = per_service
        return out
