"""Per-job records and the run summary of one simulation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from deepboot.core.cluster import ClusterSpec, Pool
from deepboot.sim.job import SimJob


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
    """

    jobs: tuple[JobRecord, ...]
    cluster: ClusterSpec
    rounds: int
    decision_ms: tuple[float, ...]
    wall_s: float
    end_time: float

    @property
    def completed(self) -> tuple[JobRecord, ...]:
        """Records of the jobs that finished."""
        return tuple(r for r in self.jobs if r.completion is not None)

    def summary(self, policy: str, workload: str) -> dict[str, Any]:
        """The run summary (``deepboot.report.schema`` layout; keys are never renamed).

        JCT statistics are over finished jobs; ``avg_queue_s`` over jobs that started;
        ``makespan_s`` is the last completion minus the first submission;
        ``restart_s`` sums the restart delay each job served (job-seconds, first
        starts included); ``p99`` interpolates linearly. Empty sets give 0.0.
        """
        done = self.completed
        jcts = [r.jct for r in done if r.jct is not None]
        queues = [r.queue_delay for r in self.jobs if r.queue_delay is not None]
        makespan = 0.0
        if done:
            makespan = max(r.completion for r in done if r.completion is not None) - min(
                r.submit for r in self.jobs
            )
        inference_nodes = sum(1 for n in self.cluster.nodes if n.pool is Pool.INFERENCE)
        return {
            "policy": policy,
            "workload": workload,
            "cluster": {
                "nodes": self.cluster.num_nodes,
                "gpus_per_node": self.cluster.gpus_per_node,
                "inference_nodes": inference_nodes,
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
            },
            "scheduler": {
                "rounds": self.rounds,
                "decision_ms_median": _stat(self.decision_ms, "median"),
                "decision_ms_max": _stat(self.decision_ms, "max"),
            },
            "wall_s": self.wall_s,
        }
