"""Optimus: fixed batch size, GPUs handed out one at a time by remaining-time gain.

Faithful to the reference simulator's ``optimus.py`` (petuum/adaptdl):

* Start: in submission order, each job gets its minimum (1 GPU, or ``min_replicas``)
  while GPUs last; the others get nothing this round.
* Then, one GPU at a time, the job whose predicted remaining time falls the most gets
  one more, until GPUs run out or no job gains. Ties go to the earlier job.
* Cap per job: ``max_replicas`` of the snapshot, and the fixed batch over
  ``min_local_bsz`` (the reference's ``target_batch_size // min_local_bsz``).
* Placement: jobs whose GPU count is unchanged keep their placement; the others are
  placed in ascending GPU count, most free node first (the reference's rule).

Remaining time = remaining progress / progress rate, where the rate (steps at the
initial batch size per second) comes from the job's fitted goodput model at its fixed
batch, on the fewest nodes that hold that many GPUs. The reference used the true
(oracle) step time; the snapshot only carries the fitted model. A job with no model
yet is assumed to scale linearly from a single-GPU rate equal to the mean single-GPU
rate of the jobs that do have one (1 step/s when none has), so that it neither wins
nor loses every comparison by an arbitrary unit.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from deepboot.core.modes import JobMode
from deepboot.core.placement import Allocation, freeze_allocation
from deepboot.core.state import ClusterState, JobView
from deepboot.perf.goodput import GoodputModel
from deepboot.policies.packing import Packing, free_map, keep_or_pack

FloatArray = npt.NDArray[np.float64]

_MIN_REMAINING = 1.0
"""Remaining progress floor: the reference uses one iteration for a finished job."""


@dataclass(frozen=True, slots=True)
class OptimusConfig:
    """Parameters of :class:`OptimusPolicy`.

    Attributes:
        packing: How a moved job's GPUs are chosen (reference: most free first).
    """

    packing: Packing = Packing.MOST_FREE


def fixed_batch(job: JobView) -> int:
    """The job's fixed total batch: its target, else its application's initial batch."""
    return job.target_batch_size or job.limits.init_batch_size


def replica_cap(job: JobView, total_gpus: int) -> int:
    """Most GPUs Optimus gives ``job``: max_replicas, batch / min_local_bsz, cluster size."""
    by_batch = max(fixed_batch(job) // max(job.limits.min_local_bsz, 1), 1)
    return max(min(job.max_replicas, by_batch, total_gpus), 0)


def nodes_needed(capacities: list[int], num_gpus: int) -> int:
    """Fewest nodes whose capacities (sorted descending) sum to ``num_gpus`` or more."""
    total = 0
    for i, cap in enumerate(sorted(capacities, reverse=True)):
        total += cap
        if total >= num_gpus:
            return i + 1
    return max(len(capacities), 1)


def progress_rates(job: JobView, max_gpus: int, capacities: list[int]) -> FloatArray | None:
    """Predicted steps-at-initial-batch per second on 1..max_gpus GPUs, or None.

    Returns:
        Array of shape (max_gpus,), entry i for i + 1 GPUs; None when the job has no
        fitted model.
    """
    if job.perf_params is None or job.grad_params is None or max_gpus <= 0:
        return None
    model = GoodputModel(job.perf_params, job.grad_params, job.limits)
    k = np.arange(1, max_gpus + 1, dtype=np.int64)
    n = np.array([nodes_needed(capacities, int(x)) for x in k], dtype=np.int64)
    goodput, _, _ = model.fixed_batch(np.minimum(n, k), k, fixed_batch(job))
    # Goodput is in samples per second at the initial batch; progress is in steps.
    return np.asarray(goodput, dtype=np.float64) / float(job.limits.init_batch_size)


@dataclass(frozen=True, slots=True)
class OptimusPolicy:
    """Greedy remaining-time-reduction allocation at each job's fixed batch size."""

    config: OptimusConfig = OptimusConfig()
    name: ClassVar[str] = "optimus"
    job_mode: ClassVar[JobMode] = JobMode.FIXED_BATCH
    # Reads the remaining work (an oracle a real cluster lacks): no runtime use.
    needs_oracle: ClassVar[bool] = True

    def gpu_counts(self, state: ClusterState) -> dict[str, int]:
        """GPU count per job name (0 included), before placement."""
        capacities = [c for c in state.capacity.values() if c > 0]
        total = sum(capacities)
        jobs = sorted(state.jobs, key=lambda j: (j.submit_time, j.name))
        caps = [replica_cap(j, total) for j in jobs]
        rates = [progress_rates(j, c, capacities) for j, c in zip(jobs, caps, strict=True)]
        fitted = [r[0] for r in rates if r is not None and r.size and r[0] > 0]
        unit = float(np.mean(fitted)) if fitted else 1.0
        times: list[FloatArray] = []
        for job, cap, rate in zip(jobs, caps, rates, strict=True):
            if rate is None:
                rate = unit * np.arange(1, cap + 1, dtype=np.float64)
            remaining = max(job.remaining_progress, _MIN_REMAINING)
            # times[i][k] = predicted remaining seconds on k GPUs (k = 0 unused).
            with np.errstate(divide="ignore"):
                t = np.where(rate > 0, remaining / np.maximum(rate, 1e-300), np.inf)
            times.append(np.concatenate(([np.inf], t)))

        counts = [0] * len(jobs)
        left = total
        for i, job in enumerate(jobs):
            start = max(1, job.min_replicas)
            if start <= caps[i] and start <= left:
                counts[i] = start
                left -= start

        def gain(i: int) -> float:
            k = counts[i]
            if k == 0 or k + 1 > caps[i]:
                return 0.0
            before, after = times[i][k], times[i][k + 1]
            if np.isinf(before):
                return np.inf if np.isfinite(after) else 0.0
            return float(before - after)

        # Max-heap on (gain, earlier job); only the chosen job's gain changes per step.
        heap = [(-g, i) for i, g in enumerate(gain(i) for i in range(len(jobs))) if g > 0]
        heapq.heapify(heap)
        while left > 0 and heap:
            _, best = heapq.heappop(heap)
            counts[best] += 1
            left -= 1
            g = gain(best)
            if g > 0:
                heapq.heappush(heap, (-g, best))
        return {job.name: k for job, k in zip(jobs, counts, strict=True)}

    def allocate(self, state: ClusterState, rng: np.random.Generator) -> Allocation:
        """Return the allocation; ``state`` is never mutated and ``rng`` is unused."""
        del rng
        counts = self.gpu_counts(state)
        jobs = sorted(
            (j for j in state.jobs if counts[j.name] > 0),
            key=lambda j: (counts[j.name], j.submit_time, j.name),
        )
        free = free_map(state)
        placed = keep_or_pack(((j, counts[j.name]) for j in jobs), free, self.config.packing)
        return freeze_allocation(placed)
