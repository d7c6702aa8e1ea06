"""The simulator's entry point: run one policy on one workload."""

from __future__ import annotations

import time
from collections.abc import Mapping

from deepboot.core.cluster import ClusterSpec
from deepboot.core.jobs import Workload
from deepboot.perf.application import Application
from deepboot.policies.base import TrainingPolicy
from deepboot.scheduler import Scheduler
from deepboot.sim.config import SimConfig
from deepboot.sim.engine import ProgressCallback, Simulation
from deepboot.sim.metrics import JobRecord, SimResult


def simulate(
    workload: Workload,
    cluster: ClusterSpec,
    policy: TrainingPolicy,
    apps: Mapping[str, Application],
    config: SimConfig,
    on_progress: ProgressCallback | None = None,
) -> SimResult:
    """Simulate ``policy`` scheduling ``workload``'s training jobs on ``cluster``.

    Deterministic for a given ``config.seed``: only ``wall_s`` and the decision
    latencies differ between runs. Inference tasks are ignored (one warning).
    Nothing passed in is mutated.

    Args:
        workload: Jobs to replay.
        cluster: The cluster; training uses its training-pool nodes.
        policy: The training-allocation policy; its ``job_mode`` sets how batch sizes
            and replica limits are handled.
        apps: Ground truth per application name.
        config: Run settings.
        on_progress: ``on_progress(now, completed_jobs, total_jobs)``, called at
            most once per scheduling tick.

    Returns:
        The frozen per-job records and scheduler statistics.

    Raises:
        ConfigError: a job names an application missing from ``apps``.
        InvalidDecisionError: the policy broke a scheduling invariant.
    """
    start = time.perf_counter()
    sim = Simulation(workload, cluster, Scheduler(policy), apps, config)
    sim.run(on_progress)
    return SimResult(
        jobs=tuple(JobRecord.of(j) for j in sim.jobs),
        cluster=cluster,
        rounds=sim.rounds,
        decision_ms=tuple(sim.decision_ms),
        wall_s=time.perf_counter() - start,
        end_time=sim.now,
    )
