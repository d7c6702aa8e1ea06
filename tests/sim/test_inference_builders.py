"""Builders shared by the inference-simulation tests (no tests here).

The tiny application: per-GPU batch m costs 0.01 * m seconds per step, no sync time,
gain 1, 600 units of progress per epoch, 2 epochs. A job with batch 100 on K GPUs
progresses at K units per second, so it needs 1200 / K seconds of work.

Imported by basename (pytest puts ``tests/sim`` on ``sys.path``; it has no
``__init__.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from deepboot.core import (
    BatchLimits,
    ClusterSpec,
    ClusterState,
    InferenceTaskSpec,
    JobMode,
    Placement,
    TrainingJobSpec,
    Workload,
)
from deepboot.core.placement import Allocation, freeze_allocation
from deepboot.perf.application import Application
from deepboot.perf.restart import FlatRestartCost, RestartCostModel
from deepboot.policies.inference import InferencePolicy
from deepboot.sim.config import SimConfig
from deepboot.sim.engine import EventCallback
from deepboot.sim.metrics import SimResult
from deepboot.sim.run import simulate

TINY_COLD = {"tiny": 5.0, "small": 2.0}
"""Start-up seconds of the test models' replicas."""

SERVICES = ("infer-tiny-1", "infer-tiny-2", "infer-small-1")
"""Services of the random workloads: two of one model, one of another."""


@dataclass
class TinyApp:
    """Hand-computable ground truth (see the module docstring)."""

    name: str = "tiny"
    limits: BatchLimits = BatchLimits(100, 100, 10, 100)
    max_epochs: int = 2
    per_epoch: float = 600.0

    def step_time(self, shape: tuple[int, ...], local_bsz: int) -> tuple[float, float]:
        return 0.01 * local_bsz, 0.0

    def grad_stats(self, batch_size: int, epoch: int) -> tuple[float, float]:
        return 1.0, 0.0

    def progress_at(self, epoch: int) -> float:
        return self.per_epoch * epoch


@dataclass(frozen=True)
class Greedy:
    """FIXED_BATCH policy: every job wants ``want`` GPUs (capped by its max_replicas);
    jobs in order keep what they hold and take the lowest free capacity.

    Deterministic and capacity-respecting, so the tests exercise the simulator's
    lending and reclaim rather than a policy.
    """

    want: int = 4
    name: str = "greedy"
    job_mode: JobMode = JobMode.FIXED_BATCH

    def allocate(self, state: ClusterState, rng: np.random.Generator) -> Allocation:
        free = dict(state.capacity)
        for job in state.jobs:
            for n in job.placement.node_ids:
                free[n] -= 1
        # A job may keep GPUs its node no longer offers (capacity shrank): drop them.
        out: dict[str, list[int]] = {}
        for job in state.jobs:
            keep: list[int] = []
            for n in job.placement.node_ids:
                if free[n] < 0:
                    free[n] += 1
                else:
                    keep.append(n)
            out[job.name] = keep
        for job in state.jobs:
            want = min(self.want, job.max_replicas)
            ids = out[job.name][:want]
            for n in out[job.name][want:]:
                free[n] += 1
            for n in sorted(free):
                while len(ids) < want and free[n] > 0:
                    ids.append(n)
                    free[n] -= 1
            out[job.name] = ids
        return freeze_allocation({k: Placement.of(v) for k, v in out.items() if v})


def job(name: str, submit: float = 0.0, batch: int = 100) -> TrainingJobSpec:
    return TrainingJobSpec(name, submit, "tiny", 1, batch)


def task(
    name: str, submit: float, duration: float, service: str = "infer-tiny-1"
) -> InferenceTaskSpec:
    model = service.split("-")[1]
    return InferenceTaskSpec(name, submit, service, model, duration, 1)


def workload(
    jobs: Sequence[TrainingJobSpec] = (), tasks: Sequence[InferenceTaskSpec] = ()
) -> Workload:
    return Workload(
        "test",
        tuple(sorted(jobs, key=lambda j: (j.submit_time, j.name))),
        tuple(sorted(tasks, key=lambda t: t.submit_time)),
    )


def run(
    jobs: Sequence[TrainingJobSpec] = (),
    tasks: Sequence[InferenceTaskSpec] = (),
    *,
    shape: str = "2x2",
    inference_nodes: int = 1,
    policy: object = None,
    inference_policy: InferencePolicy | None = None,
    restart: RestartCostModel | None = None,
    on_event: EventCallback | None = None,
    apps: Mapping[str, Application] | None = None,
    **config: object,
) -> SimResult:
    """Simulate on the tiny application (models ``tiny`` and ``small``)."""
    config.setdefault("cold_start", TINY_COLD)
    return simulate(
        workload(jobs, tasks),
        ClusterSpec.parse(shape, inference_nodes),
        policy or Greedy(),  # type: ignore[arg-type]
        apps or {"tiny": TinyApp(), "small": TinyApp("small")},
        SimConfig(restart=restart or FlatRestartCost(30.0), **config),  # type: ignore[arg-type]
        inference_policy=inference_policy,
        on_event=on_event,
    )
