"""Conservation of GPUs over random mixed workloads (hypothesis).

At every event: every GPU is in exactly one state; the TRAINING and LENT GPUs are
exactly the jobs' placements on the training and inference pools (so a lent GPU is
counted once, by one job); and over the run the GPU-seconds of all states add up to
the cluster's GPUs times the simulated span, matching the timeline's integral.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_inference_builders import SERVICES, Greedy, job, run, task

from deepboot.core import GpuState, Pool
from deepboot.policies import inference
from deepboot.policies.lending import LendReserveConfig
from deepboot.policies.lifecycle import LifecycleConfig
from deepboot.scheduler import Event
from deepboot.sim.engine import Simulation
from deepboot.sim.metrics import SimResult

RESERVE = LendReserveConfig(enabled=True, target=0.5, window_s=300.0)
"""A reserve that keeps replicas back often on these short scenarios."""

scenarios = st.fixed_dictionaries(
    {
        "jobs": st.lists(st.floats(0.0, 900.0), max_size=4),
        "tasks": st.lists(
            st.tuples(st.floats(0.0, 1500.0), st.floats(1.0, 240.0), st.sampled_from(SERVICES)),
            max_size=25,
        ),
        "shape": st.sampled_from([("2x2", 1), ("3x2", 2), ("3x1", 1)]),
        "want": st.integers(1, 5),
        "lending": st.booleans(),
        "lifecycle": st.sampled_from([LifecycleConfig(), LifecycleConfig(enabled=False)]),
        "reserve": st.sampled_from([LendReserveConfig(), RESERVE]),
        "policy": st.sampled_from(["ats-i", "ats-i-pack", "random", "lyra"]),
        "seed": st.integers(0, 3),
    }
)


def simulate_scenario(s: dict[str, object], on_event: object) -> SimResult:
    shape, inference_nodes = s["shape"]  # type: ignore[misc]
    jobs = [job(f"j{i}", submit=t) for i, t in enumerate(s["jobs"])]  # type: ignore[arg-type]
    tasks = [
        task(f"t{i}", t, d, service=svc)
        for i, (t, d, svc) in enumerate(s["tasks"])  # type: ignore[arg-type]
    ]
    return run(
        jobs,
        tasks,
        shape=shape,
        inference_nodes=inference_nodes,
        policy=Greedy(want=s["want"]),  # type: ignore[arg-type]
        inference_policy=inference.create(s["policy"]),  # type: ignore[arg-type]
        lending=s["lending"],
        lifecycle=s["lifecycle"],
        lend_reserve=s["reserve"],
        seed=s["seed"],
        on_event=on_event,  # type: ignore[arg-type]
        check_invariants=True,
    )


def check_event(now: float, event: Event, sim: Simulation) -> None:
    views = sim.board.views()
    ids = [g.gpu_id for g in views]
    # Every GPU exactly once, each in exactly one state.
    assert len(ids) == len(set(ids)) == sim.cluster.total_gpus
    by_state = Counter(g.state for g in views)
    assert sum(by_state.values()) == sim.cluster.total_gpus
    # TRAINING / LENT GPUs are exactly the placements on each pool.
    pool_of = {n.node_id: n.pool for n in sim.cluster.nodes}
    on_pool: Counter[Pool] = Counter()
    for placement in sim.placements().values():
        on_pool.update(pool_of[n] for n in placement.node_ids)
    assert by_state[GpuState.TRAINING] == on_pool[Pool.TRAINING]
    assert by_state[GpuState.LENT] == on_pool[Pool.INFERENCE]
    if not sim.config.lending:
        assert by_state[GpuState.LENT] == 0
    holders = Counter(g.job for g in views if g.job is not None)
    assert holders == {
        name: p.num_replicas for name, p in sim.placements().items() if p.num_replicas
    }


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios)
def test_gpus_are_conserved_at_every_event(s: dict[str, object]) -> None:
    res = simulate_scenario(s, check_event)
    span = res.end_time - res.start_time
    total = sum(res.gpu_seconds.values())
    assert total == pytest.approx(res.cluster.total_gpus * span, abs=1e-6)
    # The timeline's step function integrates to the same GPU-seconds per state.
    points = res.timeline
    integral: Counter[str] = Counter()
    for a, b in zip(points, points[1:], strict=False):
        assert a.total == res.cluster.total_gpus
        dt = b.t - a.t
        for name in ("training", "lent", "running", "protect", "sleep", "free"):
            integral[name] += getattr(a, name) * dt
    for name in integral:
        state = GpuState[name.upper()]
        assert integral[name] == pytest.approx(res.state_seconds(state), abs=1e-6)
    if points:
        assert points[-1].t == res.end_time
    # Every job and task finishes: nothing is lost between the pools.
    assert all(r.completion is not None for r in res.jobs)
    assert all(r.end is not None for r in res.inference)
