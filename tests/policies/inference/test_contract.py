"""Contract tests every registered inference-placement policy must pass, on random
snapshots of the shared cluster."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deepboot.core import ClusterSpec, GpuState, GpuView, InferenceState, Node, Pool
from deepboot.policies import inference
from deepboot.policies.inference import InferencePlacement, PlaceAction

from ..builders import GRAD, PERF, POOR_PERF, make_job

POLICIES = inference.names()
SERVICES = ("s0", "s1", "s2")
JOBS = ("j0", "j1", "j2", "j3")
MODELS = [None, (PERF, GRAD), (POOR_PERF, GRAD)]

_TRAINING_POOL = [
    GpuState.FREE,
    GpuState.TRAINING,
    GpuState.RUNNING,
    GpuState.PROTECT,
    GpuState.SLEEP,
]
_INFERENCE_POOL = [GpuState.FREE, GpuState.RUNNING, GpuState.PROTECT, GpuState.SLEEP, GpuState.LENT]


@st.composite
def snapshots(draw: st.DrawFn) -> InferenceState:
    """Random pools, GPU states, replicas, hits, lent workers and their jobs."""
    num_nodes = draw(st.integers(1, 5))
    training = draw(st.integers(0, num_nodes))
    nodes, gpus = [], []
    for node in range(num_nodes):
        pool = Pool.TRAINING if node < training else Pool.INFERENCE
        count = draw(st.integers(1, 4))
        nodes.append(Node(node, count, pool))
        for index in range(count):
            states = _TRAINING_POOL if pool is Pool.TRAINING else _INFERENCE_POOL
            state = draw(st.sampled_from(states))
            if state in (GpuState.TRAINING, GpuState.LENT):
                gpus.append(GpuView(node, index, pool, state, job=draw(st.sampled_from(JOBS))))
            elif state is GpuState.FREE:
                gpus.append(GpuView(node, index, pool, state))
            else:
                gpus.append(
                    GpuView(
                        node,
                        index,
                        pool,
                        state,
                        service=draw(st.sampled_from(SERVICES)),
                        hits=draw(st.integers(0, 4)),
                        protect_until=100.0 if state is GpuState.PROTECT else None,
                    )
                )
    jobs = []
    for i, name in enumerate(JOBS):
        where = [g.node_id for g in gpus if g.job == name]
        if not where and draw(st.booleans()):
            continue
        model = draw(st.sampled_from(MODELS))
        jobs.append(
            make_job(
                name,
                submit_time=float(i),
                attained_service=draw(st.floats(0, 1e5)),
                num_restarts=draw(st.integers(0, 5)),
                placement=where,
                perf=None if model is None else model[0],
                grad=None if model is None else model[1],
            )
        )
    lending = draw(st.booleans())
    return InferenceState(3600.0, ClusterSpec(tuple(nodes)), tuple(gpus), tuple(jobs), lending)


def allowed_pools(state: InferenceState) -> set[Pool]:
    """Pools the default config may cold-start in: the training pool only with lending."""
    return {Pool.INFERENCE, Pool.TRAINING} if state.lending else {Pool.INFERENCE}


def check_contract(state: InferenceState, service: str, out: InferencePlacement | None) -> None:
    gpus = {g.gpu_id: g for g in state.gpus}
    pools = allowed_pools(state)
    warm = [
        g
        for g in state.gpus
        if g.state in (GpuState.PROTECT, GpuState.SLEEP) and g.service == service
    ]
    free = [g for g in state.gpus if g.state is GpuState.FREE and g.pool in pools]
    sleeping = [
        g
        for g in state.gpus
        if g.state is GpuState.SLEEP and g.service != service and g.pool in pools
    ]
    lent = [g for g in state.gpus if g.state is GpuState.LENT]
    if out is None:
        assert not warm and not free and not sleeping, "a task waits while a GPU could take it"
        assert not (state.lending and lent), "a task waits while a lent GPU could be reclaimed"
        return
    assert out.gpu in gpus, "the GPU exists"
    g = gpus[out.gpu]
    assert g.state not in (GpuState.RUNNING, GpuState.TRAINING), f"took a {g.state.name} GPU"
    if g.state is GpuState.PROTECT:
        assert g.service == service, "never another service's PROTECT replica"
    if warm:
        assert out.action.warm and g in warm, "warm reuse whenever a replica is idle"
        expected = (
            PlaceAction.WARM_PROTECT if g.state is GpuState.PROTECT else PlaceAction.WARM_SLEEP
        )
        assert out.action is expected
        return
    assert g.pool in pools, f"cold start in the {g.pool.name} pool"
    if out.action is PlaceAction.COLD_FREE:
        assert g.state is GpuState.FREE
        if g.pool is Pool.TRAINING:
            assert not any(f.pool is Pool.INFERENCE for f in free), "inference pool first"
    elif out.action is PlaceAction.COLD_EVICT:
        assert g.state is GpuState.SLEEP and g.service != service and out.evicts == (g.gpu_id,)
        assert not free, "eviction only when no GPU is FREE"
    else:
        assert out.action is PlaceAction.COLD_RECLAIM
        assert state.lending, "a reclaim only with lending on"
        assert not free and not sleeping, "a reclaim only when no FREE or SLEEP option exists"
        assert out.reclaims
        for gpu_id, job in out.reclaims:
            assert gpus[gpu_id].state is GpuState.LENT and gpus[gpu_id].job == job
    if out.action is not PlaceAction.COLD_RECLAIM:
        assert not out.reclaims


CONTRACT_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@pytest.mark.parametrize("name", POLICIES, ids=POLICIES)
@CONTRACT_SETTINGS
@given(state=snapshots(), service=st.sampled_from(SERVICES), seed=st.integers(0, 2**32 - 1))
def test_placement_contract(name: str, state: InferenceState, service: str, seed: int) -> None:
    policy = inference.create(name)
    before = repr(state)
    first = policy.place(state, service, np.random.default_rng(seed))
    assert repr(state) == before, "the snapshot was mutated"
    check_contract(state, service, first)
    assert policy.place(state, service, np.random.default_rng(seed)) == first, "not deterministic"


@pytest.mark.parametrize("name", POLICIES, ids=POLICIES)
@CONTRACT_SETTINGS
@given(state=snapshots(), service=st.sampled_from(SERVICES), seed=st.integers(0, 2**32 - 1))
def test_inference_pool_only_never_touches_the_training_pool(
    name: str, state: InferenceState, service: str, seed: int
) -> None:
    policy = inference.create(name, use_training_pool=False)
    out = policy.place(state, service, np.random.default_rng(seed))
    if out is not None and not out.action.warm:
        assert {g.gpu_id: g for g in state.gpus}[out.gpu].pool is Pool.INFERENCE


def test_the_built_in_policies_are_registered() -> None:
    # Plug-ins may add more (the contract tests above run on them too).
    assert {"ats-i", "ats-i-pack", "lyra", "random"} <= set(POLICIES)
