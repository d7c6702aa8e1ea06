"""Closed-form integration equals a fine-step reference integration."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from deepboot.core import (
    BatchLimits,
    ClusterSpec,
    ClusterState,
    JobMode,
    Placement,
    TrainingJobSpec,
    Workload,
)
from deepboot.core.placement import Allocation, freeze_allocation
from deepboot.sim.config import SimConfig
from deepboot.sim.run import simulate

RESTART = 30.0
SYNC = 0.1


@dataclass
class EpochApp:
    """Per-GPU batch m costs 0.01 * m s (+ SYNC on several GPUs); the gradient
    variance grows with the epoch, so the gain (hence the rate) changes per epoch;
    epochs get longer (100 e + 10 e^2)."""

    name: str = "epoch"
    limits: BatchLimits = BatchLimits(100, 400, 10, 100)
    max_epochs: int = 5

    def step_time(self, shape: tuple[int, ...], local_bsz: int) -> tuple[float, float]:
        sync = SYNC if sum(shape) > 1 else 0.0
        return 0.01 * local_bsz + sync, sync

    def grad_stats(self, batch_size: int, epoch: int) -> tuple[float, float]:
        return 1.0, float(epoch + 1)

    def progress_at(self, epoch: int) -> float:
        return 100.0 * epoch + 10.0 * epoch**2


@dataclass(frozen=True)
class Schedule:
    """FIXED policy giving the single job ``k(now)`` GPUs on node 0 (0 = preempt)."""

    switch: float
    before: int
    after: int
    name: str = "schedule"
    job_mode: JobMode = JobMode.FIXED

    def k(self, now: float) -> int:
        return self.before if now < self.switch else self.after

    def allocate(self, state: ClusterState, rng: np.random.Generator) -> Allocation:
        k = self.k(state.now)
        return freeze_allocation({state.jobs[0].name: Placement((0,) * k)} if k else {})


def fine_step(policy: Schedule, batch: int, interval: float, dt: float) -> tuple[float, float]:
    """Integrate with explicit small steps; returns (completion, GPU-seconds)."""
    app = EpochApp()
    epoch, progress, service = 0, 0.0, 0.0
    k, restart_until = 0, 0.0
    per_tick = round(interval / dt)
    for i in range(round(5000.0 / dt)):
        t = i * dt
        if i and i % per_tick == 0 and policy.k(t) != k:
            k = policy.k(t)
            restart_until = t + RESTART
        if not k:
            continue
        service += k * dt
        if t < restart_until - dt / 2:
            continue
        local = -(-batch // k)
        accum = -(-local // app.limits.max_local_bsz) - 1
        if k == 1 and batch > app.limits.init_batch_size:
            accum = max(accum, 1)
        atomic = -(-local // (accum + 1))
        step, sync = app.step_time((k,), atomic)
        total = k * atomic * (accum + 1)
        sqr, var = app.grad_stats(total, epoch)
        scale = total / app.limits.init_batch_size
        rate = (var + sqr) / (var / scale + sqr) / (step + (step - sync) * accum)
        progress += rate * dt
        if progress >= app.progress_at(epoch + 1):
            progress = app.progress_at(epoch + 1)
            epoch += 1
            if epoch == app.max_epochs:
                return t + dt, service
    raise AssertionError("the fine-step job did not finish")


CASES = [
    (Schedule(switch=300.0, before=1, after=2), 200),
    (Schedule(switch=480.0, before=2, after=1), 400),
    (Schedule(switch=240.0, before=1, after=0), 200),  # preempted for good: never ends
    (Schedule(switch=600.0, before=1, after=1), 100),
]


@pytest.mark.parametrize(
    ("policy", "batch"), CASES, ids=["grow", "shrink-accum", "preempt", "steady"]
)
def test_closed_form_matches_fine_steps(policy: Schedule, batch: int) -> None:
    interval, dt = 60.0, 0.01
    wl = Workload("w", (TrainingJobSpec("a", 0.0, "epoch", 2, batch),))
    config = SimConfig(interval=interval, max_time=5000.0)
    rec = simulate(wl, ClusterSpec.parse("1x2"), policy, {"epoch": EpochApp()}, config).jobs[0]
    if policy.after == 0:
        assert rec.completion is None
        return
    completion, service = fine_step(policy, batch, interval, dt)
    assert rec.completion == pytest.approx(completion, abs=20 * dt)
    assert rec.gpu_seconds == pytest.approx(service, abs=20 * dt)
