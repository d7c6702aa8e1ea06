"""FIFO: first come, first served, fixed size, non-preemptive."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from deepboot.core.modes import JobMode
from deepboot.core.placement import Allocation, Placement, freeze_allocation
from deepboot.core.state import ClusterState
from deepboot.policies.packing import Packing, fits, free_map, pack, requested_replicas, take


@dataclass(frozen=True, slots=True)
class FifoConfig:
    """Parameters of :class:`FifoPolicy`.

    Attributes:
        packing: How a starting job's GPUs are chosen (default: fewest nodes, best fit).
    """

    packing: Packing = Packing.BEST_FIT


@dataclass(frozen=True, slots=True)
class FifoPolicy:
    """Jobs run in submission order, each with its requested GPU count.

    * Running jobs keep their placement (non-preemptive) as long as the capacity still
      holds it; a job whose GPUs were taken away rejoins the queue at its place.
    * Queued jobs start in (submit_time, name) order while their whole request fits
      in the free GPUs; the first that does not fit blocks every later one
      (head-of-line blocking). A job that can never run (its ``max_replicas`` is below
      its request) is skipped instead of blocking the queue forever.
    """

    config: FifoConfig = FifoConfig()
    name: ClassVar[str] = "fifo"
    job_mode: ClassVar[JobMode] = JobMode.FIXED

    def allocate(self, state: ClusterState, rng: np.random.Generator) -> Allocation:
        """Return the allocation; ``state`` is never mutated and ``rng`` is unused."""
        del rng
        free = free_map(state)
        jobs = sorted(state.jobs, key=lambda j: (j.submit_time, j.name))
        out: dict[str, Placement] = {}
        for job in jobs:
            gpus = requested_replicas(job)
            current = job.placement
            if gpus > 0 and current.num_replicas == gpus and fits(free, current):
                take(free, current)
                out[job.name] = current
        for job in jobs:
            gpus = requested_replicas(job)
            if job.name in out or gpus == 0:
                continue
            placement = pack(gpus, free, self.config.packing)
            if placement is None:
                break
            out[job.name] = placement
        return freeze_allocation(out)
