"""AFS (NSDI'21): fixed batch size, GPUs handed out one at a time (§3).

Faithful to the reference artifact's ``afs.py`` (czq693497091/DeepBoot):

* Jobs are scanned in submission order. Each free GPU goes to the winner of one pass
  over the jobs, comparing the current winner ``a`` with the next job ``b``:

  - both hold 0 GPUs: the shorter predicted remaining time on one GPU wins (a tie goes
    to ``b``);
  - otherwise, with ``a`` the one holding fewer GPUs (``b`` if equal), ``b`` wins only
    if its marginal throughput gain ratio ``(tput(k+1) - tput(k)) / tput(k+1)`` is
    higher. A job with 0 GPUs has ratio 1, so every job gets a GPU before any gets a
    second one.

* Counts become placements as in ATS-T: ascending count, unchanged counts keep their
  placement, the others are best-fitted (the artifact's ``select_node``).

Throughput comes from each job's fitted goodput model at its fixed batch (the ratio
is the same as with throughput, since the efficiency of a fixed batch is a constant),
on the fewest nodes that hold that many GPUs; the artifact used the true (oracle)
step times. A job without a model scales linearly. The remaining time on one GPU is
Optimus's estimate (:func:`deepboot.policies.optimus.progress_rates`).

Deviations (noted in the report): the artifact hands out *every* free GPU and has no
per-job cap; here a job never exceeds its ``max_replicas`` (its batch over the
smallest per-GPU batch) and, with ``require_gain`` (default), never gets a GPU that
would not raise its throughput. A job with ``min_replicas`` > 1 gets them at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from deepboot.core.modes import JobMode
from deepboot.core.placement import Allocation, freeze_allocation
from deepboot.core.state import ClusterState, JobView
from deepboot.perf.speedup import speedup_fn
from deepboot.policies.allocation import capacity_profile, nodes_for
from deepboot.policies.optimus import progress_rates, replica_cap
from deepboot.policies.packing import Packing, free_map, keep_or_pack

FloatArray = npt.NDArray[np.float64]

_MIN_REMAINING = 1.0
"""Remaining progress floor: the reference counts one iteration for a finished job."""

MAX_REMAINING_TIME = 1e8
"""Remaining time (s) of a job that cannot progress (the artifact's value for 0 GPUs)."""


def remaining_times(jobs: list[JobView], capacities: list[int]) -> list[float]:
    """Predicted seconds to completion of each job on one GPU.

    Jobs without a fitted model use the mean single-GPU rate of the jobs that have one
    (1 step/s when none has), as Optimus does. A job that cannot progress gets
    :data:`MAX_REMAINING_TIME`.

    Returns:
        One time per job, in the order of ``jobs``.
    """
    rates = [progress_rates(j, 1, capacities) for j in jobs]
    fitted = [float(r[0]) for r in rates if r is not None and r.size and r[0] > 0]
    unit = float(np.mean(fitted)) if fitted else 1.0
    out: list[float] = []
    for job, rate in zip(jobs, rates, strict=True):
        one = unit if rate is None else float(rate[0])
        remaining = max(job.remaining_progress, _MIN_REMAINING)
        time = remaining / one if one > 0 else MAX_REMAINING_TIME
        out.append(min(time, MAX_REMAINING_TIME) if np.isfinite(time) else MAX_REMAINING_TIME)
    return out


@dataclass(frozen=True, slots=True)
class AfsConfig:
    """Parameters of :class:`AfsPolicy`.

    Attributes:
        require_gain: Hand a job a GPU only if its predicted throughput rises (the
            artifact hands out every GPU regardless).
        packing: How a job whose count changed is placed (artifact: best fit).
    """

    require_gain: bool = True
    packing: Packing = Packing.BEST_FIT


@dataclass(frozen=True, slots=True)
class AfsPolicy:
    """AFS: one GPU at a time by marginal throughput gain ratio, fixed batch size."""

    config: AfsConfig = AfsConfig()
    name: ClassVar[str] = "afs"
    job_mode: ClassVar[JobMode] = JobMode.FIXED_BATCH
    # Reads the remaining work (an oracle a real cluster lacks): no runtime use.
    needs_oracle: ClassVar[bool] = True

    def gpu_counts(self, state: ClusterState) -> dict[str, int]:
        """GPU count per job name (0 included), before placement."""
        capacities = [c for c in state.capacity.values() if c > 0]
        total = sum(capacities)
        jobs = sorted(state.jobs, key=lambda j: (j.submit_time, j.name))
        if not jobs or total == 0:
            return {j.name: 0 for j in jobs}
        remaining = remaining_times(jobs, capacities)
        lows = [max(j.min_replicas, 1) for j in jobs]
        caps = [replica_cap(j, total) for j in jobs]
        tputs = [self._throughputs(j, c, capacities) for j, c in zip(jobs, caps, strict=True)]
        counts = [0] * len(jobs)
        left = total

        def next_count(i: int) -> int:
            return lows[i] if counts[i] == 0 else counts[i] + 1

        def eligible(i: int) -> bool:
            k, nxt = counts[i], next_count(i)
            if nxt > caps[i] or nxt - k > left:
                return False
            return not self.config.require_gain or tputs[i][nxt] > tputs[i][k]

        def ratio(i: int) -> float:
            k = counts[i]
            after = tputs[i][next_count(i)]
            return float((after - tputs[i][k]) / after) if after > 0 else 0.0

        while left > 0:
            best = -1
            for i in range(len(jobs)):
                if not eligible(i):
                    continue
                if best < 0:
                    best = i
                    continue
                a, b = best, i
                if counts[a] == 0 and counts[b] == 0:
                    best = a if remaining[a] < remaining[b] else b
                    continue
                if counts[a] >= counts[b]:
                    a, b = b, a
                best = b if ratio(b) > ratio(a) else a
            if best < 0:
                break
            left -= next_count(best) - counts[best]
            counts[best] = next_count(best)
        return {job.name: k for job, k in zip(jobs, counts, strict=True)}

    @staticmethod
    def _throughputs(job: JobView, cap: int, capacities: list[int]) -> FloatArray:
        """Relative throughput on 0..cap+1 GPUs (entry k for k GPUs; 0 GPUs -> 0)."""
        out = np.zeros(cap + 2, dtype=np.float64)
        if cap <= 0:
            return out
        total = sum(capacities)
        ks = np.arange(1, min(cap + 1, total) + 1, dtype=np.int64)
        fn = speedup_fn(job, JobMode.FIXED_BATCH)
        values = np.asarray(fn(nodes_for(ks, capacity_profile(capacities)), ks), dtype=np.float64)
        out[1 : ks.size + 1] = np.where(np.isfinite(values), np.maximum(values, 0.0), 0.0)
        return out

    def allocate(self, state: ClusterState, rng: np.random.Generator) -> Allocation:
        """Return the allocation; ``state`` is never mutated and ``rng`` is unused."""
        del rng
        counts = self.gpu_counts(state)
        order = sorted(
            (j for j in state.jobs if counts[j.name] > 0),
            key=lambda j: (counts[j.name], j.submit_time, j.name),
        )
        placed = keep_or_pack(
            ((j, counts[j.name]) for j in order), free_map(state), self.config.packing
        )
        return freeze_allocation(placed)
