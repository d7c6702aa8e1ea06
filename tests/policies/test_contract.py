"""Contract tests every registered training policy must pass, on random snapshots."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deepboot.core import ClusterState, GradParams, JobView, PerfParams
from deepboot.core.placement import Allocation
from deepboot.policies import registry

from .builders import GRAD, PERF, POOR_PERF, make_job, make_state

POLICIES = registry.names()

# A few fixed models keep the perf layer's speedup memo warm across examples.
MODELS: list[tuple[PerfParams, GradParams] | None] = [
    None,
    (PERF, GRAD),
    (POOR_PERF, GRAD),
    (PERF, GradParams(sqr=1.0, var=0.01)),
]


@st.composite
def snapshots(draw: st.DrawFn) -> ClusterState:
    """Random clusters, capacities, jobs (fitted or not) and current placements."""
    num_nodes = draw(st.integers(1, 6))
    gpus = draw(st.lists(st.integers(1, 8), min_size=num_nodes, max_size=num_nodes))
    capacity: dict[int, int] = {}
    for node, g in enumerate(gpus):
        if draw(st.integers(0, 5)) > 0:  # some nodes are absent (no training capacity)
            capacity[node] = draw(st.integers(0, g))
    used = Counter[int]()
    jobs: list[JobView] = []
    for i in range(draw(st.integers(0, 10))):
        model = draw(st.sampled_from(MODELS))
        # Current placements fit the nodes but may exceed today's capacity.
        wanted = draw(st.lists(st.integers(0, num_nodes - 1), max_size=6))
        placement = []
        for node in wanted:
            if used[node] < gpus[node]:
                used[node] += 1
                placement.append(node)
        jobs.append(
            make_job(
                f"job{i}",
                submit_time=draw(st.floats(0.0, 3500.0)),
                attained_service=draw(st.floats(0.0, 40 * 3600.0)),
                num_restarts=draw(st.integers(0, 5)),
                placement=placement,
                min_replicas=draw(st.integers(0, 2)),
                max_replicas=draw(st.integers(0, 12)),
                perf=None if model is None else model[0],
                grad=None if model is None else model[1],
                target_num_replicas=draw(st.none() | st.integers(1, 8)),
                target_batch_size=draw(st.none() | st.sampled_from([64, 128, 512, 2048])),
                remaining_progress=draw(st.floats(0.0, 1e5)),
            )
        )
    return make_state(jobs, nodes=num_nodes, gpus=gpus, capacity=capacity, now=3600.0)


def check_invariants(state: ClusterState, alloc: Allocation) -> None:
    names = {j.name for j in state.jobs}
    assert set(alloc) <= names, "placements only for known jobs"
    usage: Counter[int] = Counter()
    for name, placement in alloc.items():
        job = state.job(name)
        assert placement.num_replicas <= job.max_replicas, f"{name} over max_replicas"
        assert placement.num_replicas >= max(job.min_replicas, 1), f"{name} under min_replicas"
        usage.update(placement.node_ids)
    for node, count in usage.items():
        assert count <= state.capacity.get(node, 0), f"node {node}: {count} GPUs booked"


CONTRACT_SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@pytest.mark.parametrize("name", POLICIES, ids=POLICIES)
@CONTRACT_SETTINGS
@given(state=snapshots(), seed=st.integers(0, 2**32 - 1))
def test_allocation_respects_capacity_and_bounds(name: str, state: ClusterState, seed: int) -> None:
    policy = registry.create(name)
    alloc = policy.allocate(state, np.random.default_rng(seed))
    check_invariants(state, alloc)


@pytest.mark.parametrize("name", POLICIES, ids=POLICIES)
@CONTRACT_SETTINGS
@given(state=snapshots(), seed=st.integers(0, 2**32 - 1))
def test_state_unchanged_and_deterministic(name: str, state: ClusterState, seed: int) -> None:
    policy = registry.create(name)
    # MappingProxyType cannot be deep-copied; repr walks every field instead.
    before = (repr(state), state.jobs, dict(state.capacity))
    first = dict(policy.allocate(state, np.random.default_rng(seed)))
    assert (repr(state), state.jobs, dict(state.capacity)) == before, "the snapshot was mutated"
    second = dict(policy.allocate(state, np.random.default_rng(seed)))
    assert first == second


@pytest.mark.parametrize("name", POLICIES, ids=POLICIES)
def test_empty_cluster_and_no_jobs(name: str) -> None:
    policy = registry.create(name)
    rng = np.random.default_rng(0)
    assert dict(policy.allocate(make_state([]), rng)) == {}
    no_capacity = make_state([make_job("a", target_num_replicas=1, fitted=True)], capacity={})
    assert dict(policy.allocate(no_capacity, rng)) == {}
