"""Inference is never starved (hypothesis, random mixed workloads, lending on).

No inference task waits longer than its cold start while any inference-pool GPU is
FREE, SLEEP or LENT: after every event, either no task is queued or every
inference-pool GPU is RUNNING or PROTECT; and a task's delay is its time in the
queue plus its cold start (0 for a warm reuse).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_inference_builders import SERVICES, TINY_COLD, Greedy, job, run, task

from deepboot.core import GpuState, Pool
from deepboot.policies import inference
from deepboot.policies.lending import LendReserveConfig
from deepboot.policies.lifecycle import LifecycleConfig
from deepboot.scheduler import Event, EventKind
from deepboot.sim.engine import Simulation

SERVABLE = frozenset({GpuState.FREE, GpuState.SLEEP, GpuState.LENT})
"""Inference-pool states a waiting task could be placed on at once."""

RESERVE = LendReserveConfig(enabled=True, target=0.5, window_s=300.0)
"""A reserve that keeps replicas back often on these short scenarios."""

scenarios = st.fixed_dictionaries(
    {
        "jobs": st.lists(st.floats(0.0, 900.0), max_size=4),
        # Long, dense tasks on a small inference pool, so that tasks do queue.
        "tasks": st.lists(
            st.tuples(st.floats(0.0, 600.0), st.floats(1.0, 300.0), st.sampled_from(SERVICES)),
            min_size=1,
            max_size=25,
        ),
        "shape": st.sampled_from([("2x2", 1), ("3x1", 1), ("3x2", 1)]),
        "want": st.integers(1, 6),
        "lifecycle": st.sampled_from([LifecycleConfig(), LifecycleConfig(factor=8.0)]),
        "reserve": st.sampled_from([LendReserveConfig(), RESERVE]),
        "policy": st.sampled_from(["ats-i", "ats-i-pack", "random", "lyra"]),
        "use_training_pool": st.booleans(),
    }
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios)
def test_no_task_waits_while_an_inference_gpu_is_free_sleep_or_lent(s: dict) -> None:  # type: ignore[type-arg]
    placed_at: dict[str, float] = {}
    queued: set[str] = set()

    def check(now: float, event: Event, sim: Simulation) -> None:
        waiting = sim.waiting()
        if waiting:
            servable = [
                g.gpu_id
                for g in sim.board.views()
                if g.pool is Pool.INFERENCE and g.state in SERVABLE
            ]
            assert not servable, f"{waiting} wait at {now} while {servable} could serve"
        queued.update(waiting)
        if event.kind is EventKind.INFERENCE_ARRIVAL and event.job not in waiting:
            placed_at.setdefault(event.job, now)

    shape, inference_nodes = s["shape"]
    res = run(
        [job(f"j{i}", submit=t) for i, t in enumerate(s["jobs"])],
        [task(f"t{i}", t, d, service=svc) for i, (t, d, svc) in enumerate(s["tasks"])],
        shape=shape,
        inference_nodes=inference_nodes,
        policy=Greedy(want=s["want"]),
        inference_policy=inference.create(s["policy"], use_training_pool=s["use_training_pool"]),
        lifecycle=s["lifecycle"],
        lend_reserve=s["reserve"],
        lending=True,
        on_event=check,
    )
    for r in res.inference:
        assert r.start is not None and r.delay is not None
        cold = TINY_COLD[r.model] if r.cold else 0.0
        if r.name not in queued:
            # Placed at its arrival: it waits for its cold start at most.
            assert placed_at[r.name] == r.submit
            assert abs(r.delay - cold) < 1e-9
        else:
            assert r.delay > cold
