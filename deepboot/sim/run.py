"""The simulator's entry point: run one policy on one workload."""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import MappingProxyType

from deepboot.core.cluster import ClusterSpec, Pool
from deepboot.core.jobs import Workload
from deepboot.perf.application import Application
from deepboot.perf.gputypes import TypedApps
from deepboot.policies.base import TrainingPolicy
from deepboot.policies.inference import InferencePolicy
from deepboot.scheduler import Scheduler
from deepboot.sim.config import SimConfig
from deepboot.sim.engine import EventCallback, ProgressCallback, Simulation
from deepboot.sim.metrics import JobRecord, SimResult


def simulate(
    workload: Workload,
    cluster: ClusterSpec,
    policy: TrainingPolicy,
    apps: Mapping[str, Application],
    config: SimConfig,
    on_progress: ProgressCallback | None = None,
    *,
    inference_policy: InferencePolicy | None = None,
    on_event: EventCallback | None = None,
    typed_apps: TypedApps | None = None,
) -> SimResult:
    """Simulate ``policy`` scheduling ``workload``'s training jobs on ``cluster``, and
    the inference policy placing its inference tasks on the inference pool.

    Deterministic for a given ``config.seed``: only ``wall_s`` and the decision
    latencies differ between runs. Inference tasks are ignored (one warning) when
    the cluster has no inference pool. Nothing passed in is mutated.

    Args:
        workload: Jobs and inference tasks to replay.
        cluster: The cluster: training uses its training pool, plus idle
            inference-pool GPUs when ``config.lending`` is on.
        policy: The training-allocation policy; its ``job_mode`` sets how batch sizes
            and replica limits are handled.
        apps: Ground truth per application name.
        config: Run settings.
        on_progress: ``on_progress(now, completed_jobs, total_jobs)``, called at
            most once per scheduling tick.
        inference_policy: Places inference tasks; None builds
            ``config.inference_policy`` from the inference registry.
        on_event: ``on_event(now, event, sim)`` after every event (debug hook).
        typed_apps: Ground truth per GPU type and application, on a cluster of
            several types (:mod:`deepboot.perf.gputypes`).

    Returns:
        The frozen per-job records and scheduler statistics.

    Raises:
        ConfigError: a job names an application missing from ``apps``.
        InvalidDecisionError: the policy broke a scheduling invariant.
    """
    start = time.perf_counter()
    sim = Simulation(
        workload, cluster, Scheduler(policy), apps, config, inference_policy, typed_apps
    )
    sim.run(on_progress, on_event)
    serving = sim.serving
    seconds = {
        (pool, state): v
        for pool in Pool
        for state, v in sim.board.gpu_seconds(pool).items()
        if pool in {n.pool for n in cluster.nodes}
    }
    return SimResult(
        jobs=tuple(JobRecord.of(j) for j in sim.jobs),
        cluster=cluster,
        rounds=sim.rounds,
        decision_ms=tuple(sim.decision_ms),
        wall_s=time.perf_counter() - start,
        end_time=sim.now,
        inference=() if serving is None else serving.records(),
        timeline=tuple(sim.timeline),
        reclaim_times=() if serving is None else tuple(serving.reclaim_times),
        proactive_reclaim_times=(() if serving is None else tuple(serving.proactive_reclaim_times)),
        start_time=sim.start_time if sim.start_time is not None else sim.now,
        gpu_seconds=MappingProxyType(seconds),
        slo_wait_s=MappingProxyType(
            {} if serving is None else {n: s.slo_wait_s for n, s in serving.services.items()}
        ),
        slo_target=MappingProxyType(
            {} if serving is None else {n: s.slo_target for n, s in serving.services.items()}
        ),
        host_cache=serving is not None and serving.cache is not None,
    )
