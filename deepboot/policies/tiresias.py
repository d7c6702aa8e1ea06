"""Tiresias: discretized two-dimensional least-attained-service (2D-LAS), two queues.

Faithful to the reference simulator's ``tiresias.py`` (petuum/adaptdl):

* Queue 0 holds jobs whose attained GPU service is below the threshold (16 GPU-hours),
  queue 1 the rest. The reference accumulates ``running seconds x replicas``; the
  snapshot's ``attained_service`` (GPU-seconds held) is the same quantity. Service never
  decreases, so a demoted job never returns to queue 0: the reference's starvation
  promotion is disabled (``_solve_starvation = 0``) and is not implemented here.
* Within a queue, FIFO by submission (the reference appends on arrival/demotion).
* Queue 0 then queue 1 is scanned once; a job runs when its whole request fits in the
  GPUs not yet claimed by higher-priority jobs, otherwise it waits and the scan goes on
  (later, smaller jobs may still start: the reference does not block the queue).
  A waiting job loses its GPUs (preemption).
* Running jobs keep their current placement; newly started jobs take GPUs from the
  node with the most free GPUs first (the reference's ``most_common`` rule).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from deepboot.core.modes import JobMode
from deepboot.core.placement import Allocation, freeze_allocation
from deepboot.core.state import ClusterState, JobView
from deepboot.policies.packing import Packing, free_map, keep_or_pack, requested_replicas
from deepboot.policies.registration import require

_GPU_HOUR = 3600.0


@dataclass(frozen=True, slots=True)
class TiresiasConfig:
    """Parameters of :class:`TiresiasPolicy`.

    Attributes:
        queue_threshold_gpu_hours: Attained service (GPU-hours) past which a job is
            demoted to the low-priority queue. Reference: 16. Must be > 0.
        packing: How a starting job's GPUs are chosen (reference: most free first).
    """

    queue_threshold_gpu_hours: float = 16.0
    packing: Packing = Packing.MOST_FREE

    def __post_init__(self) -> None:
        require(
            math.isfinite(self.queue_threshold_gpu_hours) and self.queue_threshold_gpu_hours > 0,
            "queue_threshold_gpu_hours",
            f"must be a finite number > 0; got {self.queue_threshold_gpu_hours}",
        )


@dataclass(frozen=True, slots=True)
class TiresiasPolicy:
    """Preemptive 2D-LAS with two queues; fixed batch size and replica count."""

    config: TiresiasConfig = TiresiasConfig()
    name: ClassVar[str] = "tiresias"
    job_mode: ClassVar[JobMode] = JobMode.FIXED

    def queue_of(self, job: JobView) -> int:
        """0 (high priority) while attained service is below the threshold, else 1."""
        threshold = self.config.queue_threshold_gpu_hours * _GPU_HOUR
        return 0 if job.attained_service < threshold else 1

    def priority_order(self, state: ClusterState) -> list[JobView]:
        """Jobs in scheduling priority: queue, then submission time, then name."""
        return sorted(state.jobs, key=lambda j: (self.queue_of(j), j.submit_time, j.name))

    def allocate(self, state: ClusterState, rng: np.random.Generator) -> Allocation:
        """Return the allocation; ``state`` is never mutated and ``rng`` is unused."""
        del rng
        free = free_map(state)
        left = sum(free.values())
        running: list[tuple[JobView, int]] = []
        for job in self.priority_order(state):
            gpus = requested_replicas(job)
            if 0 < gpus <= left:
                running.append((job, gpus))
                left -= gpus
        # The GPUs claimed above never exceed the total, so every running job gets a
        # placement (kept or packed).
        return freeze_allocation(keep_or_pack(running, free, self.config.packing))
