"""Lyra / Aryl (EuroSys'23): a knapsack over elastic jobs by remaining time (§3).

Faithful to the reference artifact's ``aryl.py`` (czq693497091/DeepBoot):

* Jobs are ordered by predicted remaining time on one GPU, ascending (submission order
  on ties).
* Group j = job j. With m = ``min_replicas``, item "w extra workers" (w = 1 ..
  max - m) has weight ``m + w`` GPUs and value ``remaining_time * w / (w + m + 1)``; a
  job capped at one GPU has the single item (1 GPU, ``remaining_time``).
* The knapsack is the exact group knapsack of ATS-T (:func:`group_knapsack`), whose
  forward pass and backtrack are the artifact's (the same tie rules).
* Counts become placements as in ATS-T: ascending count, unchanged counts keep their
  placement, the others are best-fitted.

The artifact caps each job at the replicas the user asked for (``max_replicas =
target_num_replicas``); ``cap_at_requested`` (default) keeps that, on top of the
job's own ``max_replicas``. Remaining times come from each job's fitted model at its
fixed batch (:func:`deepboot.policies.afs.remaining_times`); the artifact used the true
(oracle) step times. Lyra's inference side (whole-node reclaim) is the ``lyra``
inference policy (:mod:`deepboot.policies.inference.lyra_placement`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from deepboot.core.modes import JobMode
from deepboot.core.placement import Allocation, freeze_allocation
from deepboot.core.state import ClusterState, JobView
from deepboot.policies.afs import remaining_times
from deepboot.policies.allocation import group_knapsack
from deepboot.policies.packing import Packing, free_map, keep_or_pack

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class LyraConfig:
    """Parameters of :class:`LyraPolicy`.

    Attributes:
        cap_at_requested: Never give a job more than the replicas its user asked for
            (the artifact's rule), on top of its ``max_replicas``.
        packing: How a job whose count changed is placed (artifact: best fit).
    """

    cap_at_requested: bool = True
    packing: Packing = Packing.BEST_FIT


def lyra_items(job: JobView, remaining: float, most: int) -> tuple[int, FloatArray]:
    """The knapsack items of ``job``: (smallest GPU count, values of counts from it).

    Args:
        job: The job.
        remaining: Its predicted remaining time on one GPU (s).
        most: The most GPUs it may get.

    Returns:
        ``(low, values)`` with ``values[t]`` the value of ``low + t`` GPUs; ``values``
        is empty when the job cannot run.
    """
    m = job.min_replicas
    if most == 1 and m <= 1:
        return 1, np.array([remaining])
    w = np.arange(1, most - m + 1, dtype=np.float64)
    return m + 1, remaining * w / (w + m + 1)


@dataclass(frozen=True, slots=True)
class LyraPolicy:
    """Aryl's knapsack by remaining time, fixed batch size."""

    config: LyraConfig = LyraConfig()
    name: ClassVar[str] = "lyra"
    job_mode: ClassVar[JobMode] = JobMode.FIXED_BATCH
    # Reads the remaining work (an oracle a real cluster lacks): no runtime use.
    needs_oracle: ClassVar[bool] = True

    def ordered(self, state: ClusterState) -> list[tuple[JobView, float]]:
        """Jobs with their remaining time on one GPU, shortest first."""
        capacities = [c for c in state.capacity.values() if c > 0]
        jobs = sorted(state.jobs, key=lambda j: (j.submit_time, j.name))
        times = remaining_times(jobs, capacities)
        return sorted(zip(jobs, times, strict=True), key=lambda p: p[1])

    def gpu_counts(self, state: ClusterState) -> dict[str, int]:
        """GPU count per job name (0 included), before placement."""
        return {job.name: k for job, k in self._plan(state)}

    def _plan(self, state: ClusterState) -> list[tuple[JobView, int]]:
        """(job, GPU count) in Lyra's order (shortest remaining time first)."""
        total = sum(c for c in state.capacity.values() if c > 0)
        pairs = self.ordered(state)
        if not pairs or total == 0:
            return [(j, 0) for j, _ in pairs]
        values: list[FloatArray] = []
        lows: list[int] = []
        for job, remaining in pairs:
            most = min(job.max_replicas, total)
            if self.config.cap_at_requested and job.target_num_replicas is not None:
                most = min(most, job.target_num_replicas)
            low, vals = lyra_items(job, remaining, most)
            lows.append(low)
            values.append(vals)
        counts = group_knapsack(values, lows, total)
        return [(job, k) for (job, _), k in zip(pairs, counts, strict=True)]

    def allocate(self, state: ClusterState, rng: np.random.Generator) -> Allocation:
        """Return the allocation; ``state`` is never mutated and ``rng`` is unused."""
        del rng
        # A stable sort keeps Lyra's order among jobs with equal counts (the artifact's).
        order = sorted((p for p in self._plan(state) if p[1] > 0), key=lambda p: p[1])
        placed = keep_or_pack(order, free_map(state), self.config.packing)
        return freeze_allocation(placed)
