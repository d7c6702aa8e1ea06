"""The Sia-style reference allocator (deepboot.policies.sia): its configurations,
its goodput rows and their projection, its program solved exactly (against brute
force), its placements one type each within the capacity."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepboot.core import ClusterSpec, ClusterState, JobView, PerfParams
from deepboot.core.state import TypeModel
from deepboot.policies.sia import (
    NOTHING,
    SiaConfig,
    SiaPolicy,
    _cluster_types,
    _restart_factor,
    job_row,
    normalised_row,
)
from tests.policies.builders import GRAD, LIMITS, PERF, make_job

CLUSTER = ClusterSpec.parse("t4:2x4,a100:1x8")  # nodes 0-1 t4, node 2 a100
FAST = dataclasses.replace(PERF, alpha_c=PERF.alpha_c / 4, beta_c=PERF.beta_c / 4)


def state(jobs: list[JobView], capacity: dict[int, int] | None = None) -> ClusterState:
    cap = capacity or {n.node_id: n.gpus for n in CLUSTER.nodes}
    return ClusterState(3600.0, CLUSTER, tuple(jobs), cap)


def typed_job(name: str, t4: PerfParams | None, a100: PerfParams | None, **kw: object) -> JobView:
    job = make_job(name, perf=t4 or a100, grad=GRAD, **kw)  # type: ignore[arg-type]
    types = (TypeModel("t4", LIMITS, 100.0, t4), TypeModel("a100", LIMITS, 400.0, a100))
    return dataclasses.replace(job, types=types)


def test_configurations_are_powers_of_two_within_a_node_then_whole_nodes() -> None:
    types = {t.name: t for t in _cluster_types(state([]))}
    assert types["t4"].configs == ((1, 1), (1, 2), (1, 4), (2, 8))
    assert types["a100"].configs == ((1, 1), (1, 2), (1, 4), (1, 8))
    assert (types["t4"].free, types["a100"].free) == (8, 8)
    # GPUs not free for training (capacity 0) leave their node out.
    busy = {t.name: t for t in _cluster_types(state([], {0: 4, 1: 0, 2: 8}))}
    assert busy["t4"].configs == ((1, 1), (1, 2), (1, 4)) and busy["t4"].free == 4


def test_a_job_that_never_ran_starts_on_one_gpu() -> None:
    alloc = SiaPolicy().allocate(state([make_job("new")]), np.random.default_rng(0))
    assert alloc["new"].num_replicas == 1


def test_a_type_without_a_model_is_projected_by_the_one_gpu_speed_ratio() -> None:
    job = typed_job("j", PERF, None)
    types = _cluster_types(state([job]))
    row = job_row(job, types)
    t4, a100 = row[:4], row[4:]
    assert a100[:3] == pytest.approx([4.0 * v for v in t4[:3]])  # 400 / 100
    assert all(v > NOTHING for v in row)


def test_the_faster_type_goes_to_the_job_that_gains_most() -> None:
    jobs = [typed_job("slow-on-a100", PERF, PERF), typed_job("fast-on-a100", PERF, FAST)]
    alloc = SiaPolicy().allocate(state(jobs), np.random.default_rng(0))
    assert set(alloc["fast-on-a100"].node_ids) == {2}
    assert set(alloc["slow-on-a100"].node_ids) <= {0, 1}


def test_the_restart_factor_spares_young_jobs_and_charges_restarts() -> None:
    config = SiaConfig()
    young = make_job(submit_time=3600.0 - 10.0)
    assert _restart_factor(young, 3600.0, config) == 1.0
    old = make_job(submit_time=0.0, num_restarts=4, application="bert")  # S = 120
    assert _restart_factor(old, 3600.0, config) == pytest.approx((3600 - 480) / 3720)


def test_a_job_keeping_its_configuration_keeps_its_gpus() -> None:
    # On t4 alone (the a100 busy), 4 GPUs is the best the job may have: it holds them.
    job = typed_job("j", PERF, None, placement=(1, 1, 1, 1), submit_time=3000.0, max_replicas=4)
    alloc = SiaPolicy().allocate(state([job], {0: 4, 1: 4, 2: 0}), np.random.default_rng(0))
    assert alloc["j"] == job.placement


def _objective(policy: SiaPolicy, st_: ClusterState) -> float:
    """The program's value of the policy's allocation, rebuilt from its rows."""
    value = 0.0
    alloc = policy.allocate(st_, np.random.default_rng(0))
    for job in st_.jobs:
        value += _cost_of(policy, st_, job, alloc.get(job.name))
    return value


def _cost_of(policy: SiaPolicy, st_: ClusterState, job: JobView, placement: object) -> float:
    costs = _costs(policy, st_, job)
    if not placement:
        return 0.0
    types = _cluster_types(st_)
    node_type = {n: t.name for t in types for n in t.nodes}
    k = placement.num_replicas  # type: ignore[attr-defined]
    name = node_type[placement.node_ids[0]]  # type: ignore[attr-defined]
    cols = [(t.name, c[1]) for t in types for c in t.configs]
    return costs[cols.index((name, k))]


def _costs(policy: SiaPolicy, st_: ClusterState, job: JobView) -> list[float]:
    row = normalised_row(job, _cluster_types(st_))
    return list(row**policy.config.p - policy.config.lam)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([None, PERF, FAST]), st.sampled_from([None, PERF, FAST])),
        min_size=1,
        max_size=3,
    ),
    st.integers(1, 8),
)
def test_the_program_is_solved_exactly(models: list[tuple[object, object]], cap: int) -> None:
    """Brute force over every assignment of configurations (or none) to at most
    three jobs on a snapshot where nobody holds GPUs: the solver's value is the least."""
    jobs = [typed_job(f"j{i}", t4, a100) for i, (t4, a100) in enumerate(models)]  # type: ignore[arg-type]
    st_ = state(jobs, {0: 4, 1: 4, 2: cap})
    policy = SiaPolicy()
    types = _cluster_types(st_)
    cols = [(t, c[1]) for t in types for c in t.configs]
    best = math_inf = float("inf")
    for choice in itertools.product([None, *range(len(cols))], repeat=len(jobs)):
        used = {t.name: 0 for t in types}
        value = 0.0
        for job, col in zip(jobs, choice, strict=True):
            if col is not None:
                used[cols[col][0].name] += cols[col][1]
                value += _costs(policy, st_, job)[col]
        if all(used[t.name] <= t.free for t in types):
            best = min(best, value)
    assert best < math_inf
    got = _objective(policy, st_)
    assert got == pytest.approx(best, abs=1e-6 + 1e-3 * abs(best))
    alloc = policy.allocate(st_, np.random.default_rng(0))
    node_type = CLUSTER.node_types()
    used_nodes: dict[int, int] = {}
    for placement in alloc.values():
        assert len({node_type[n] for n in placement.node_ids}) == 1
        for n, c in placement.counts().items():
            used_nodes[n] = used_nodes.get(n, 0) + c
    assert all(c <= st_.capacity[n] for n, c in used_nodes.items())
