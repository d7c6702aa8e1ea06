"""smallest-first: a worked example of a deepboot policy written outside the package.

It runs each job at its requested size, like FIFO, but starts the queued jobs with the
fewest requested GPUs first (ties: submission order), and never blocks: a job that
does not fit now is skipped, and a smaller one behind it may start. ``docs/extending.md``
walks through it line by line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from deepboot.core.modes import JobMode
from deepboot.core.placement import Allocation, Placement, freeze_allocation
from deepboot.core.state import ClusterState
from deepboot.policies.packing import Packing, fits, free_map, pack, requested_replicas, take
from deepboot.policies.registry import register as register_training_policy

NAME = "smallest-first"


@dataclass(frozen=True, slots=True)
class SmallestFirstConfig:
    """Parameters (every field has a default; ``--param key=value`` sets them).

    Attributes:
        packing: How a starting job's GPUs are chosen.
        keep_running: Running jobs keep their GPUs (no preemption).
    """

    packing: Packing = Packing.BEST_FIT
    keep_running: bool = True


@dataclass(frozen=True, slots=True)
class SmallestFirstPolicy:
    """Fixed-size jobs, the smallest requests first; a pure function of the snapshot."""

    config: SmallestFirstConfig = SmallestFirstConfig()
    name: ClassVar[str] = NAME
    job_mode: ClassVar[JobMode] = JobMode.FIXED

    def allocate(self, state: ClusterState, rng: np.random.Generator) -> Allocation:
        """The new allocation; ``state`` is never mutated and ``rng`` is unused."""
        del rng
        free = free_map(state)  # GPUs per node training may use this round
        out: dict[str, Placement] = {}
        if self.config.keep_running:
            for job in state.jobs:
                current = job.placement
                if (
                    current
                    and current.num_replicas == requested_replicas(job)
                    and fits(free, current)
                ):
                    take(free, current)
                    out[job.name] = current
        queued = [j for j in state.jobs if j.name not in out and requested_replicas(j) > 0]
        for job in sorted(queued, key=lambda j: (requested_replicas(j), j.submit_time, j.name)):
            placement = pack(requested_replicas(job), free, self.config.packing)
            if placement is not None:
                out[job.name] = placement
        return freeze_allocation(out)


def register() -> None:
    """The entry point: register the policy under its name."""
    register_training_policy(NAME, SmallestFirstPolicy, SmallestFirstConfig)
