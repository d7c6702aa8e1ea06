"""How the engine sizes jobs per job mode: max_replicas, batch re-picks, own models."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np
import pytest

from deepboot.core import (
    ClusterSpec,
    ClusterState,
    JobMode,
    JobView,
    Placement,
    TrainingJobSpec,
    Workload,
)
from deepboot.core.placement import Allocation, freeze_allocation
from deepboot.perf.catalog import load_catalog
from deepboot.perf.goodput import fixed_batch_split
from deepboot.scheduler import Scheduler
from deepboot.sim.config import SimConfig
from deepboot.sim.engine import Simulation

APPS = load_catalog()


@dataclass
class GiveMax:
    """Gives every job ``max_replicas`` GPUs on node 0 upward; records every view."""

    job_mode: JobMode
    name: str = "give-max"
    seen: list[tuple[float, JobView]] = field(default_factory=list)

    def allocate(self, state: ClusterState, rng: np.random.Generator) -> Allocation:
        free = dict(state.capacity)
        out: dict[str, Placement] = {}
        for job in state.jobs:
            self.seen.append((state.now, job))
            ids: list[int] = []
            for n in sorted(free):
                take = min(free[n], job.max_replicas - len(ids))
                ids += [n] * take
                free[n] -= take
            if ids:
                out[job.name] = Placement.of(ids)
        return freeze_allocation(out)


def simulate_one(
    app: str, mode: JobMode, replicas: int = 2, batch: int = 256, max_time: float = 1800.0
) -> tuple[Simulation, GiveMax]:
    policy = GiveMax(mode)
    wl = Workload("w", (TrainingJobSpec("a", 0.0, app, replicas, batch),))
    sim = Simulation(
        wl, ClusterSpec.parse("4x4"), Scheduler(policy), APPS, SimConfig(max_time=max_time)
    )
    sim.run()
    return sim, policy


def test_adaptive_job_is_profiled_and_its_max_replicas_doubles() -> None:
    sim, policy = simulate_one("cifar10", JobMode.ADAPTIVE)
    views = [v for _, v in policy.seen]
    first = views[0]
    assert first.perf_params is None and first.grad_params is None
    assert first.max_replicas == 1
    assert first.target_batch_size is None
    # Each round it runs at max_replicas, so the next round allows twice as many,
    # up to max_batch_size // min_local_bsz = 4096 // 32 = 128, capped at 16 GPUs here.
    caps = [v.max_replicas for v in views]
    assert caps[:5] == [1, 2, 4, 8, 16]
    assert views[1].perf_params is not None and views[1].grad_params is not None
    assert all(b.remaining_progress <= a.remaining_progress for a, b in pairwise(views))
    assert views[-1].num_restarts == 4


def test_adaptive_job_batch_stays_within_limits_and_adapts() -> None:
    sim, _ = simulate_one("cifar10", JobMode.ADAPTIVE)
    job = sim.jobs[0]
    lim = APPS["cifar10"].limits
    k = job.num_replicas
    assert k == 16
    assert lim.min_local_bsz <= job.atomic_bsz <= lim.max_local_bsz
    assert k * job.atomic_bsz * (job.accum_steps + 1) <= lim.max_batch_size
    # The optimizer moved away from the initial max(M0, K * min_local) batch.
    assert k * job.atomic_bsz * (job.accum_steps + 1) != max(lim.init_batch_size, 32 * k)


def test_adaptive_runs_before_a_fit_use_the_initial_batch() -> None:
    policy = GiveMax(JobMode.ADAPTIVE)
    wl = Workload("w", (TrainingJobSpec("a", 0.0, "cifar10", 2, 256),))
    sim = Simulation(wl, ClusterSpec.parse("1x4"), Scheduler(policy), APPS, SimConfig(max_time=60))
    sim.run()
    job = sim.jobs[0]
    # Placed at 60, nothing run yet: batch max(M0, K * min_local) = 128 on one GPU.
    assert (job.atomic_bsz, job.accum_steps) == fixed_batch_split(1, 128, APPS["cifar10"].limits)


def test_ncf_under_adaptive_has_a_fixed_batch_and_one_replica() -> None:
    sim, policy = simulate_one("ncf", JobMode.ADAPTIVE, max_time=600.0)
    views = [v for _, v in policy.seen]
    assert {v.max_replicas for v in views} == {1}
    assert {v.target_batch_size for v in views} == {32768}
    job = sim.jobs[0]
    assert job.num_replicas * job.atomic_bsz * (job.accum_steps + 1) == 32768


@pytest.mark.parametrize(
    ("mode", "app", "batch", "replicas", "expected"),
    [
        (JobMode.FIXED_BATCH, "cifar10", 256, 2, 256 // 32),
        (JobMode.FIXED_BATCH, "ncf", 32768, 2, 1),
        (JobMode.FIXED, "cifar10", 256, 3, 3),
        (JobMode.FIXED, "ncf", 32768, 2, 2),
    ],
    ids=["fixed-batch", "fixed-batch-ncf", "fixed", "fixed-ncf"],
)
def test_max_replicas_of_fixed_modes(
    mode: JobMode, app: str, batch: int, replicas: int, expected: int
) -> None:
    sim, policy = simulate_one(app, mode, replicas=replicas, batch=batch, max_time=300.0)
    views = [v for _, v in policy.seen]
    assert {v.max_replicas for v in views} == {expected}
    assert {v.target_batch_size for v in views} == {batch}
    job = sim.jobs[0]
    split = fixed_batch_split(job.num_replicas, batch, APPS[app].limits)
    assert (job.atomic_bsz, job.accum_steps) == split


def test_config_overrides_the_reference_per_application_rules() -> None:
    policy = GiveMax(JobMode.ADAPTIVE)
    wl = Workload("w", (TrainingJobSpec("a", 0.0, "ncf", 1, 32768),))
    config = SimConfig(max_time=600.0, adaptive_batch_size={}, app_max_replicas={})
    Simulation(wl, ClusterSpec.parse("4x4"), Scheduler(policy), APPS, config).run()
    views = [v for _, v in policy.seen]
    assert views[0].target_batch_size is None
    assert max(v.max_replicas for v in views) > 1
