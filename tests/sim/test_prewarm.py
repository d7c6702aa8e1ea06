"""Pre-warmed replicas (``WarmReplica``) in the simulator, on hand-computable cases.

Nothing in the package makes a ``WarmReplica`` yet, so :class:`Prewarm` adds
hand-written operations to the control loop's steps. See ``test_inference_builders``
for the tiny application; replicas of model ``tiny`` start in 5 s, of ``small`` in
2 s. ATS-I restricted to the inference pool places a task on its first FREE GPU.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_inference_builders import TINY_COLD, Greedy, TinyApp, job, task

from deepboot.core import (
    ClusterSpec,
    GpuState,
    InferenceTaskSpec,
    Placement,
    ServiceSpec,
    TrainingJobSpec,
    Workload,
)
from deepboot.core.errors import InvalidDecisionError
from deepboot.perf.restart import FlatRestartCost
from deepboot.policies import inference
from deepboot.scheduler import Event, EventKind, Preempt, Resize, Scheduler
from deepboot.scheduler.control import ControlLoop, Retry, Snapshot, Step, validate_warm_replicas
from deepboot.scheduler.operations import AnyOperation, EvictReplica, Reclaim, WarmReplica
from deepboot.sim.config import SimConfig
from deepboot.sim.engine import Simulation

ONE_POOL = inference.create("ats-i", use_training_pool=False)
TINY, SMALL = "infer-tiny-1", "infer-small-1"
A, B = (1, 0), (1, 1)
"""The inference node's two GPUs (shape 2x2, one inference node)."""

Plan = Callable[[Snapshot, Step], "tuple[AnyOperation, ...] | None"]
"""Operations to append to a step, given its snapshot and the step; None: not in this
step (try the next one)."""


class Prewarm(ControlLoop):
    """The simulator's control loop, plus hand-written operations: the first step at
    or after each planned time for which ``plan(snapshot, step)`` is not None gets
    those operations appended (before the loop validates the step, as a pre-warming
    policy inside the loop would)."""

    def __init__(self, base: ControlLoop, plans: Sequence[tuple[float, Plan]]) -> None:
        super().__init__(base.training, base.inference, base.settings)
        self.plans = sorted(plans, key=lambda p: p[0])

    def _dispatch(
        self, event: Event, snap: Snapshot, rng: np.random.Generator, cursor: Retry | None
    ) -> Step:
        out = super()._dispatch(event, snap, rng, cursor)
        if not self.plans or self.plans[0][0] > snap.now:
            return out
        extra = self.plans[0][1](snap, out)
        if extra is None:
            return out
        self.plans.pop(0)
        return dataclasses.replace(out, ops=(*out.ops, *extra))


def warm(gpu: tuple[int, int], service: str, until: float) -> Plan:
    return lambda snap, step: (WarmReplica(gpu, service, until),)


StateLog = list[tuple[float, GpuState]]

LATE = [task("late-small", 500.0, 1.0, SMALL), task("late-tiny", 500.0, 1.0)]
"""Tasks that keep a run going (an idle run's protect expiries are moot) and make
both services known to it (a service with no task is unknown to the simulator)."""


def simulate(
    tasks: Sequence[InferenceTaskSpec],
    plans: Sequence[tuple[float, Plan]],
    jobs: Sequence[TrainingJobSpec] = (),
    services: Sequence[ServiceSpec] = (),
    watch: tuple[int, int] = B,
    **config: object,
) -> tuple[Simulation, StateLog]:
    """Run with the plans; returns the run and ``watch``'s state after each event
    time where it changed."""
    work = Workload("w", tuple(jobs), tuple(sorted(tasks, key=lambda t: t.submit_time)))
    work = dataclasses.replace(work, services=tuple(services))
    sim = Simulation(
        work,
        ClusterSpec.parse("2x2", 1),
        Scheduler(Greedy(want=4)),
        {"tiny": TinyApp()},
        SimConfig(
            restart=FlatRestartCost(30.0),
            cold_start=TINY_COLD,
            check_invariants=True,
            **config,  # type: ignore[arg-type]
        ),
        inference_policy=ONE_POOL,
    )
    sim.loop = Prewarm(sim.loop, plans)
    log: StateLog = []

    def on_event(now: float, event: Event, s: Simulation) -> None:
        state = s.board.get(watch).state
        if log and log[-1][0] == now:
            log.pop()
        if not log or log[-1][1] is not state:
            log.append((now, state))

    sim.run(on_event=on_event)
    return sim, log


def by_name(sim: Simulation) -> dict[str, tuple[float | None, bool, float | None]]:
    assert sim.serving is not None
    return {r.name: (r.start, r.cold, r.delay) for r in sim.serving.records()}


F, R, P, S, L = GpuState.FREE, GpuState.RUNNING, GpuState.PROTECT, GpuState.SLEEP, GpuState.LENT


def test_a_prewarmed_replica_loads_then_protects_until_its_until_then_sleeps() -> None:
    # A small task at 10 is the trigger (on A); B warms for tiny 10..15, PROTECT to 50.
    # A later task keeps the run going past 50 (an idle run's expiries are moot).
    tasks = [task("x", 10.0, 1.0, SMALL), task("y", 100.0, 1.0, SMALL), *LATE]
    sim, log = simulate(tasks, [(10.0, warm(B, TINY, 50.0))])
    assert log[:3] == [(10.0, R), (15.0, P), (50.0, S)]
    # The warm-up is no task: no record, no cold start counted; no reclaim. The late
    # tiny task reuses the warm replica from SLEEP.
    assert by_name(sim) == {
        "x": (12.0, True, 2.0),
        "y": (100.0, False, 0.0),
        "late-small": (500.0, False, 0.0),
        "late-tiny": (500.0, False, 0.0),
    }
    assert sim.serving is not None and sim.serving.reclaim_times == []
    assert sim.serving.tasks["late-tiny"].gpu == B


@pytest.mark.parametrize(
    ("until", "expect"),
    [(15.0, [(10.0, R), (15.0, S)]), (0.0, [(10.0, R), (15.0, S)])],
    ids=["until-at-ready", "until-past"],
)
def test_a_prewarmed_replica_whose_until_has_passed_sleeps_once_ready(
    until: float, expect: StateLog
) -> None:
    _, log = simulate([task("x", 10.0, 1.0, SMALL), *LATE], [(10.0, warm(B, TINY, until))])
    assert log[:2] == expect


@pytest.mark.parametrize(
    ("concurrency", "arrivals"),
    [(1, [12.0]), (2, [11.0, 12.0]), (4, [12.0, 14.0, 15.0])],
    ids=["concurrency-1", "concurrency-2", "concurrency-4-one-at-ready"],
)
def test_requests_during_the_load_use_the_prewarmed_replica_without_a_cold_start(
    concurrency: int, arrivals: list[float]
) -> None:
    services = [
        ServiceSpec(TINY, "tiny", cold_start_s=5.0, concurrency=concurrency),
        ServiceSpec(SMALL, "small", cold_start_s=2.0),
    ]
    tasks = [task("x", 10.0, 1.0, SMALL), *LATE]
    tasks += [task(f"t{i}", at, 20.0) for i, at in enumerate(arrivals)]
    sim, log = simulate(tasks, [(10.0, warm(B, TINY, 50.0))], services=services)
    got = by_name(sim)
    for i, at in enumerate(arrivals):
        # Warm: it starts when the replica is ready (15) or at once after; delay
        # = ready - arrival; on B, whose REPLICA_WARM does not protect it.
        start = max(at, 15.0)
        assert got[f"t{i}"] == (start, False, start - at)
        assert sim.serving is not None and sim.serving.tasks[f"t{i}"].gpu == B
    # RUNNING from 10 until the last task ends (35 or later), then PROTECT 30 s
    # (hits 0: the lifecycle rule, not the warm-up's until).
    end = max(max(at, 15.0) + 20.0 for at in arrivals)
    assert log[:3] == [(10.0, R), (end, P), (end + 30.0, S)]


def test_a_request_after_the_load_gets_a_warm_protect_hit() -> None:
    tasks = [task("x", 10.0, 1.0, SMALL), task("t1", 20.0, 5.0), *LATE]
    sim, log = simulate(tasks, [(10.0, warm(B, TINY, 50.0))])
    assert by_name(sim)["t1"] == (20.0, False, 0.0)
    assert sim.serving is not None and sim.serving.tasks["t1"].gpu == B
    # Ready at 15 (PROTECT), reused at 20 (hits 1), ends 25: PROTECT 30 + 15 s.
    assert log[:5] == [(10.0, R), (15.0, P), (20.0, R), (25.0, P), (70.0, S)]


def test_a_request_at_the_ready_time_reuses_it_as_a_protect_hit() -> None:
    # REPLICA_WARM runs before an arrival at the same instant (events.py).
    tasks = [task("x", 10.0, 1.0, SMALL), task("t1", 15.0, 5.0), *LATE]
    sim, log = simulate(tasks, [(10.0, warm(B, TINY, 50.0))])
    assert by_name(sim)["t1"] == (15.0, False, 0.0)
    # PROTECT at 15 and reused at once (no change seen after the events at 15); the
    # hit makes its protect time 30 + 15 s after it ends at 20.
    assert log[:3] == [(10.0, R), (20.0, P), (65.0, S)]
    assert EventKind.INFERENCE_DONE.priority < EventKind.REPLICA_WARM.priority
    assert EventKind.REPLICA_WARM.priority < EventKind.INFERENCE_ARRIVAL.priority


def test_a_prewarm_evicts_another_services_sleeping_replica_first() -> None:
    # x (small) on A runs 2..3, PROTECT to 33, SLEEP. t1 (tiny) at 41 cold-starts on
    # B; in the same step A is evicted and warmed for tiny (ready 46): t2 joins it.
    tasks = [task("x", 0.0, 1.0, SMALL), task("t1", 41.0, 1.0), task("t2", 43.0, 1.0), *LATE]
    plan: Plan = lambda snap, step: (EvictReplica(A), WarmReplica(A, TINY, 100.0))  # noqa: E731
    sim, log = simulate(tasks, [(41.0, plan)], watch=A)
    assert sim.board.evictions >= 1
    got = by_name(sim)
    assert got["t1"] == (46.0, True, 5.0)
    assert got["t2"] == (46.0, False, 3.0)
    assert sim.serving is not None and sim.serving.tasks["t2"].gpu == A
    # t2 ends at 47: PROTECT by the lifecycle rule (30 s), not until the warm-up's 100.
    assert log[:6] == [(0.0, R), (3.0, P), (33.0, S), (41.0, R), (47.0, P), (77.0, S)]


def test_a_proactive_reclaim_is_counted_apart_and_the_job_shrinks() -> None:
    # j0 borrows both inference GPUs at the tick at 60; x (small) at 100 reclaims
    # one; when x ends (103) the other is reclaimed ahead of demand and warmed for
    # tiny (ready 108); t1 (tiny) at 105 joins it.
    def plan(snap: Snapshot, step: Step) -> tuple[AnyOperation, ...]:
        lent = next(g for g in snap.gpus if g.state is GpuState.LENT)
        view = next(j for j in snap.jobs if j.name == "j0")
        ids = list(view.placement.node_ids)
        ids.remove(lent.node_id)
        shrink = Resize("j0", view.placement, Placement.of(ids))
        return (
            Reclaim(lent.gpu_id, "j0", proactive=True),
            shrink,
            WarmReplica(lent.gpu_id, TINY, 200.0),
        )

    tasks = [task("x", 100.0, 1.0, SMALL), task("t1", 105.0, 5.0), *LATE]
    sim, _ = simulate(tasks, [(101.0, plan)], jobs=[job("j0")])
    assert sim.serving is not None
    assert sim.serving.reclaim_times == [100.0, 103.0]
    assert sim.serving.proactive_reclaim_times == [103.0]
    assert by_name(sim)["t1"] == (108.0, False, 3.0)
    assert sim.jobs[0].completion is not None


def test_an_illegal_prewarm_applies_nothing_of_its_step() -> None:
    tasks = [task("x", 10.0, 1.0, SMALL), *LATE]
    plans = [(10.0, lambda snap, step: (WarmReplica(B, TINY, 50.0), WarmReplica(B, TINY, 50.0)))]
    with pytest.raises(InvalidDecisionError, match=r"GPU \(1, 1\): it is RUNNING, not FREE"):
        simulate(tasks, plans)


def test_a_prewarm_over_max_replicas_is_refused_by_the_world() -> None:
    services = [
        ServiceSpec(TINY, "tiny", cold_start_s=5.0, max_replicas=1),
        ServiceSpec(SMALL, "small", cold_start_s=2.0),
    ]
    tasks = [task("x", 10.0, 30.0)]  # tiny: A is its one replica
    with pytest.raises(InvalidDecisionError, match="max_replicas is 1"):
        simulate(tasks, [(10.0, warm(B, TINY, 50.0))], services=services)


# -- property: random pre-warms keep the books ------------------------------------------

SERVICES = (TINY, "infer-tiny-2", SMALL)

scenarios = st.fixed_dictionaries(
    {
        # Bursts: (time, duration, service, tasks, seconds between them), so that
        # tasks often arrive while a replica warmed at the burst's start loads.
        "bursts": st.lists(
            st.tuples(
                st.floats(0.0, 600.0),
                st.floats(1.0, 60.0),
                st.sampled_from(SERVICES),
                st.integers(1, 3),
                st.floats(0.0, 3.0),
            ),
            min_size=1,
            max_size=8,
        ),
        # (time, GPU, service, protect seconds after the warm-up, reclaim if LENT)
        "warms": st.lists(
            st.tuples(
                st.floats(0.0, 600.0),
                st.sampled_from([A, B]),
                st.sampled_from(SERVICES),
                st.floats(-30.0, 120.0),
                st.booleans(),
            ),
            max_size=8,
        ),
        "jobs": st.lists(st.floats(0.0, 300.0), max_size=2),
        "lending": st.booleans(),
    }
)


def legal_or_nothing(gpu: tuple[int, int], service: str, hold: float, reclaim: bool) -> Plan:
    """A pre-warm of ``gpu`` (reclaiming it first when LENT and ``reclaim``, evicting
    a SLEEP replica first), or nothing when the validator refuses it; not in a round
    nor in a step whose own operations name the GPU or its job (the snapshot would no
    longer say what they apply to)."""

    def plan(snap: Snapshot, step: Step) -> tuple[AnyOperation, ...] | None:
        view = next(g for g in snap.gpus if g.gpu_id == gpu)
        named = {getattr(op, "gpu", None) for op in step.ops}
        named |= {getattr(op, "job", None) for op in step.ops}
        if step.round or gpu in named or (view.job is not None and view.job in named):
            return None
        ops: list[AnyOperation] = []
        if view.state is GpuState.SLEEP:
            ops.append(EvictReplica(gpu))
        elif view.state is GpuState.LENT and reclaim and view.job is not None:
            held = next(j for j in snap.jobs if j.name == view.job).placement
            ids = list(held.node_ids)
            ids.remove(gpu[0])
            shrink = Resize(view.job, held, Placement.of(ids)) if ids else Preempt(view.job, held)
            ops += [Reclaim(gpu, view.job, proactive=True), shrink]
        ops.append(WarmReplica(gpu, service, snap.now + hold))
        try:
            validate_warm_replicas((*step.ops, *ops), snap.gpus, snap.services)
        except InvalidDecisionError:
            return ()
        return tuple(ops)

    return plan


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios)
def test_random_prewarms_conserve_gpus_and_serve_every_task(s: dict[str, Any]) -> None:
    bursts: list[tuple[float, float, str, int, float]] = s["bursts"]
    warms: list[tuple[float, tuple[int, int], str, float, bool]] = s["warms"]
    submits: list[float] = s["jobs"]
    tasks = [
        task(f"t{i}-{k}", at + k * gap, d, service=svc)
        for i, (at, d, svc, n, gap) in enumerate(bursts)
        for k in range(n)
    ]
    plans = [
        (at, legal_or_nothing(gpu, svc, hold, reclaim)) for at, gpu, svc, hold, reclaim in warms
    ]
    jobs = [job(f"j{i}", submit=t) for i, t in enumerate(submits)]
    services = [ServiceSpec(n, n.split("-")[1], cold_start_s=TINY_COLD[n.split("-")[1]])
                for n in SERVICES]  # fmt: skip
    sim, _ = simulate(tasks, plans, jobs, services, lending=s["lending"])
    start, end = sim.board.span
    total = sum(sim.board.gpu_seconds().values())
    assert total == pytest.approx(sim.cluster.total_gpus * (end - start), abs=1e-6)
    integral: Counter[str] = Counter()
    for a, b in zip(sim.timeline, sim.timeline[1:], strict=False):
        for name in ("training", "lent", "running", "protect", "sleep", "free"):
            integral[name] += getattr(a, name) * (b.t - a.t)
    for name, value in integral.items():
        assert value == pytest.approx(sim.board.gpu_seconds()[GpuState[name.upper()]], abs=1e-6)
    assert sim.serving is not None
    records = sim.serving.records()
    assert all(r.end is not None for r in records)
    assert all(j.completion is not None for j in sim.jobs)
    for r in records:
        assert r.start is not None and r.delay is not None and r.delay >= 0.0
        assert not math.isnan(r.start)
    assert len(sim.serving.proactive_reclaim_times) <= len(sim.serving.reclaim_times)
