"""Builders of jobs and snapshots for the policy tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from deepboot.core import (
    BatchLimits,
    ClusterSpec,
    ClusterState,
    GradParams,
    JobView,
    Node,
    PerfParams,
    Placement,
)

LIMITS = BatchLimits(init_batch_size=128, max_batch_size=4096, min_local_bsz=32, max_local_bsz=1024)
"""cifar10-like batch limits."""

PERF = PerfParams(
    alpha_c=0.0175,
    beta_c=0.0007,
    alpha_n=0.13,
    beta_n=0.0011,
    alpha_r=0.029,
    beta_r=0.00035,
    gamma=2.0,
)
"""cifar10-like fitted throughput parameters (seconds)."""

GRAD = GradParams(sqr=0.1, var=4.0)
"""Gradient statistics with a noise scale large enough to reward big batches."""

POOR_PERF = PerfParams(
    alpha_c=0.0175, beta_c=0.0007, alpha_n=2.0, beta_n=0.05, alpha_r=1.0, beta_r=0.02, gamma=1.0
)
"""A job whose synchronisation is so slow that extra GPUs barely help."""


def make_job(
    name: str = "j0",
    *,
    submit_time: float = 0.0,
    attained_service: float = 0.0,
    num_restarts: int = 0,
    placement: Sequence[int] = (),
    min_replicas: int = 0,
    max_replicas: int = 64,
    limits: BatchLimits = LIMITS,
    perf: PerfParams | None = None,
    grad: GradParams | None = None,
    fitted: bool = False,
    target_num_replicas: int | None = None,
    target_batch_size: int | None = None,
    remaining_progress: float = 0.0,
    application: str = "cifar10",
) -> JobView:
    """A JobView; ``fitted=True`` gives it :data:`PERF` and :data:`GRAD`."""
    if fitted:
        perf = perf or PERF
        grad = grad or GRAD
    elif perf is not None and grad is None:
        grad = GRAD
    return JobView(
        name=name,
        application=application,
        submit_time=submit_time,
        attained_service=attained_service,
        num_restarts=num_restarts,
        placement=Placement.of(placement),
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        limits=limits,
        perf_params=perf,
        grad_params=grad,
        target_num_replicas=target_num_replicas,
        target_batch_size=target_batch_size,
        remaining_progress=remaining_progress,
    )


def make_cluster(nodes: int = 4, gpus: int | Sequence[int] = 4) -> ClusterSpec:
    """``nodes`` training nodes of ``gpus`` GPUs each (or one count per node)."""
    per_node = [gpus] * nodes if isinstance(gpus, int) else list(gpus)
    return ClusterSpec(tuple(Node(i, g) for i, g in enumerate(per_node)))


def make_state(
    jobs: Sequence[JobView] = (),
    *,
    nodes: int = 4,
    gpus: int | Sequence[int] = 4,
    capacity: Mapping[int, int] | None = None,
    now: float = 3600.0,
) -> ClusterState:
    """A snapshot at ``now``; capacity defaults to every GPU of every node."""
    cluster = make_cluster(nodes, gpus)
    ordered = tuple(sorted(jobs, key=lambda j: (j.submit_time, j.name)))
    if capacity is None:
        capacity = {n.node_id: n.gpus for n in cluster.nodes}
    return ClusterState(now, cluster, ordered, capacity)
