"""The immutable snapshot a policy decides on."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from deepboot.core.cluster import ClusterSpec
from deepboot.core.gpu import GpuId, GpuView
from deepboot.core.params import BatchLimits, GradParams, PerfParams
from deepboot.core.placement import EMPTY, Placement


@dataclass(frozen=True, slots=True)
class TypeModel:
    """What a policy may know about one job on one GPU type of a cluster of several.

    Attributes:
        gpu_type: The type.
        limits: The job's batch limits on that type (a larger GPU fits a larger
            per-GPU batch).
        speed: The model's peak one-GPU throughput on that type, samples per second
            (what profiling one GPU of each type at submission gives, as Sia does):
            the projection of a type the job has not run on from one it has.
        perf_params: The job's own throughput model fitted on that type; None until
            it has run there.
    """

    gpu_type: str
    limits: BatchLimits
    speed: float
    perf_params: PerfParams | None = None


@dataclass(frozen=True, slots=True)
class JobView:
    """What a policy may know about one active (submitted, unfinished) training job.

    Attributes:
        name: Job name.
        application: Model name.
        submit_time: Submission time (s).
        attained_service: GPU-seconds the job has held so far.
        num_restarts: Placement changes after its first start.
        placement: Its current GPUs (EMPTY when queued or preempted).
        min_replicas: Fewest GPUs it can run on once started (0 = preemptible).
        max_replicas: Most GPUs a policy may give it now (grows as it is profiled).
        limits: Batch-size limits of its application.
        perf_params: Its own fitted throughput model; None until it has run.
        grad_params: Its latest gradient statistics; None until it has run.
        target_num_replicas: GPUs requested by the user.
        target_batch_size: Total batch fixed by the user or the policy; None = adaptive.
        remaining_progress: Statistical progress left to completion (oracle knowledge,
            in steps at the initial batch size; used by Optimus).
        restart_cost: Seconds one resize of this job costs, finite and >= 0 (None:
            unknown, the policy uses its own default delta). Policies that weigh a
            resize against its cost (Pollux's realloc factor, DeepBoot's restart
            penalty) use it as the job's delta where it exceeds their default
            (``policies.allocation.restart_delta``). The simulator sets it for
            ``resize="restart"`` jobs (their cold or explicit restart cost) and leaves
            it None for AFE jobs, whose resizes the policies' calibrated defaults
            stand for; the runtime may set it from measured resize costs.
        types: On a cluster of several GPU types, one entry per type, in the
            cluster's order (empty on one type: ``perf_params`` and ``limits`` say
            it all). ``perf_params`` and ``limits`` are then those of the type it
            runs on (or last ran on; the first type's before it ran).
    """

    name: str
    application: str
    submit_time: float
    attained_service: float
    num_restarts: int
    placement: Placement
    min_replicas: int
    max_replicas: int
    limits: BatchLimits
    perf_params: PerfParams | None = None
    grad_params: GradParams | None = None
    target_num_replicas: int | None = None
    target_batch_size: int | None = None
    remaining_progress: float = 0.0
    restart_cost: float | None = None
    types: tuple[TypeModel, ...] = ()

    def __post_init__(self) -> None:
        cost = self.restart_cost
        if cost is not None and not (math.isfinite(cost) and cost >= 0):
            raise ValueError(f"job {self.name!r}: restart_cost must be finite and >= 0; got {cost}")

    def age(self, now: float) -> float:
        return max(now - self.submit_time, 0.0)


@dataclass(frozen=True, slots=True)
class ClusterState:
    """Snapshot of the cluster at ``now``; never mutated by anyone.

    Attributes:
        now: Current (virtual or real) time in seconds.
        cluster: The cluster spec.
        jobs: Active training jobs, sorted by (submit_time, name).
        capacity: GPUs training may use per node id (nodes absent => 0).
    """

    now: float
    cluster: ClusterSpec
    jobs: tuple[JobView, ...]
    capacity: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if not isinstance(self.capacity, MappingProxyType):
            object.__setattr__(self, "capacity", MappingProxyType(dict(self.capacity)))

    @classmethod
    def training_view(
        cls, now: float, cluster: ClusterSpec, jobs: tuple[JobView, ...]
    ) -> ClusterState:
        """A snapshot where training may use every GPU of every node."""
        return cls(now, cluster, jobs, {n.node_id: n.gpus for n in cluster.nodes})

    @property
    def total_capacity(self) -> int:
        return sum(self.capacity.values())

    def job(self, name: str) -> JobView:
        for j in self.jobs:
            if j.name == name:
                return j
        raise KeyError(name)

    def current(self, name: str) -> Placement:
        for j in self.jobs:
            if j.name == name:
                return j.placement
        return EMPTY


@dataclass(frozen=True, slots=True)
class InferenceState:
    """Snapshot an inference-placement policy (ATS-I and variants) decides on.

    Attributes:
        now: Current time (s).
        cluster: The cluster spec.
        gpus: Every GPU of the cluster, sorted by (node_id, index).
        jobs: Active training jobs (for the speedup lost by a reclaim).
        lending: Whether training may hold inference-pool GPUs in this run.
        host_nodes: Nodes whose host memory holds the task's model: a new replica
            there starts from it (a host start) instead of cold (empty: no host
            cache, or no node holds it).
        host_first: A host start meets the task's SLO and a cold start does not: a
            GPU of ``host_nodes`` in any step (FREE, evicted or reclaimed) is worth
            more than any other node's (ATS-I's ``prefer_host``).
        gpus_per_replica: GPUs a new replica of the task's service spans, all on one
            node (``ServiceSpec.gpus_per_replica``); 1 for every one-GPU service.
        sleeping: The GPUs of each server process kept asleep while its GPUs are
            lent (its weights in host memory; a wake is a host start, but only on
            exactly those GPUs), keyed by their GPU set (a one-GPU set may be keyed
            by the bare ``GpuId``), valued by its service's name. ATS-I with
            ``prefer_host`` takes exactly such a set of the task's service first, in
            each step that starts a new replica (FREE, evict, reclaim). Empty: no
            sleeping server (the simulator's, and the runtime's until it keeps them).
    """

    now: float
    cluster: ClusterSpec
    gpus: tuple[GpuView, ...]
    jobs: tuple[JobView, ...]
    lending: bool = True
    host_nodes: frozenset[int] = frozenset()
    host_first: bool = False
    gpus_per_replica: int = 1
    sleeping: Mapping[tuple[GpuId, ...] | GpuId, str] = field(
        default_factory=lambda: MappingProxyType({})
    )

    def sleeping_sets(self, service: str) -> tuple[tuple[GpuId, ...], ...]:
        """The GPU sets of ``service``'s sleeping servers (``sleeping``), each sorted,
        in sorted order; empty when none."""
        out = []
        for key, name in self.sleeping.items():
            if name != service:
                continue
            # A bare GpuId is a pair of ints; a set is a tuple of pairs.
            ids = [key] if isinstance(key[0], int) else list(key)
            out.append(tuple(sorted(ids)))
        return tuple(sorted(out))

    def job(self, name: str) -> JobView:
        for j in self.jobs:
            if j.name == name:
                return j
        raise KeyError(name)
