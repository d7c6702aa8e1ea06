"""The inference pool in the simulator, on hand-computable cases.

See ``test_inference_builders`` for the tiny application: a job with batch 100 on K
GPUs progresses K units per second; replicas of model ``tiny`` start in 5 s, of
``small`` in 2 s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from test_inference_builders import Greedy, TinyApp, job, run, task

from deepboot.core import BatchLimits, ClusterState, GpuState, JobMode, Pool
from deepboot.core.placement import Allocation
from deepboot.perf.restart import AfeRestartCost, RestartDelays
from deepboot.policies import inference
from deepboot.policies.lifecycle import LifecycleConfig
from deepboot.scheduler import Event, EventKind
from deepboot.sim.engine import Simulation
from deepboot.sim.metrics import SimResult, TimelinePoint

ONE_POOL = inference.create("ats-i", use_training_pool=False)
"""ATS-I restricted to the inference pool, so a 1-GPU inference node is all it has."""


def states_at(result: SimResult, t: float) -> TimelinePoint:
    """The timeline's counts in force at time ``t``."""
    return [p for p in result.timeline if p.t <= t][-1]


def by_name(result: SimResult) -> dict[str, tuple[float | None, bool, float | None]]:
    return {r.name: (r.start, r.cold, r.delay) for r in result.inference}


def test_cold_start_then_warm_reuse_and_the_protect_rule() -> None:
    tasks = [
        task("t1", 10.0, 20.0),  # cold: 5 s start-up, runs 15..35, PROTECT 30 s (to 65)
        task("t2", 50.0, 5.0),  # warm from PROTECT: hits 1, runs 50..55, PROTECT 45 s
        task("t3", 99.0, 1.0),  # warm from PROTECT: hits 2, runs 99..100, PROTECT 60 s
        task("t4", 170.0, 1.0),  # SLEEP since 160: warm from SLEEP, hits reset
    ]
    res = run(tasks=tasks, shape="2x1", inference_policy=ONE_POOL, check_invariants=True)
    assert by_name(res) == {
        "t1": (15.0, True, 5.0),
        "t2": (50.0, False, 0.0),
        "t3": (99.0, False, 0.0),
        "t4": (170.0, False, 0.0),
    }
    assert [r.end for r in res.inference] == [35.0, 55.0, 100.0, 171.0]
    assert states_at(res, 159.0).protect == 1
    assert states_at(res, 160.0).sleep == 1
    assert states_at(res, 170.0).running == 1
    s = res.summary("greedy", "w")["inference"]
    assert s == {
        "tasks": 4,
        "completed": 4,
        "cold_starts": 1,
        "warm_hits": 3,
        "avg_delay_s": pytest.approx(1.25),
        "p99_delay_s": pytest.approx(5.0 - 0.03 * 5.0),
        # One request of four waited its cold start (5 s) past the 1 s default SLO.
        "slo_attainment": 0.75,
        "slo_worst_window": None,  # 4 requests: no 10-minute window holds 20
        "requests_late": 1,
        "requests_unstarted": 0,
        "requests_dropped": 0,
        "p50_delay_s": 0.0,
        "max_delay_s": 5.0,
        "reclaims_proactive": 0,
        "reclaims_reactive": 0,
        "per_service": {
            "infer-tiny-1": {
                "requests": 4,
                "slo_wait_s": 1.0,
                "slo_target": 0.99,
                "slo_attainment": 0.75,
                "slo_worst_window": None,
                "p99_delay_s": pytest.approx(5.0 - 0.03 * 5.0),
                "requests_late": 1,
            }
        },
    }


@pytest.mark.parametrize(
    ("second", "lifecycle", "delay"),
    [
        # Another service: A stays PROTECT until 130, then it is evicted; 2 s start-up.
        ("infer-small-1", LifecycleConfig(), 132.0 - 10.0),
        # The same service reuses A's replica warm the moment A ends.
        ("infer-tiny-1", LifecycleConfig(), 100.0 - 10.0),
        # No lifecycle: A's replica sleeps at once and is evicted at 100.
        ("infer-small-1", LifecycleConfig(enabled=False), 102.0 - 10.0),
        # Protect time scaled by 2: PROTECT until 160.
        ("infer-small-1", LifecycleConfig(factor=2.0), 162.0 - 10.0),
    ],
    ids=["evict-after-protect", "warm-when-free", "no-lifecycle", "protect-factor-2"],
)
def test_a_task_waits_fifo_until_a_gpu_can_take_it(
    second: str, lifecycle: LifecycleConfig, delay: float
) -> None:
    waiting: list[tuple[float, tuple[str, ...]]] = []

    def spy(now: float, event: Event, sim: Simulation) -> None:
        waiting.append((now, sim.waiting()))

    tasks = [task("a", 0.0, 95.0), task("b", 10.0, 5.0, service=second)]
    res = run(
        tasks=tasks,
        shape="2x1",
        inference_policy=ONE_POOL,
        lifecycle=lifecycle,
        on_event=spy,
        check_invariants=True,
    )
    assert by_name(res)["b"][2] == pytest.approx(delay)
    assert ("b",) in [w for t, w in waiting if t == 10.0]
    assert waiting[-1][1] == ()


def test_evicting_another_services_sleep_replica_is_a_cold_start() -> None:
    tasks = [task("a", 0.0, 1.0), task("b", 100.0, 3.0, service="infer-small-1")]
    res = run(tasks=tasks, shape="2x1", inference_policy=ONE_POOL, check_invariants=True)
    assert by_name(res)["b"] == (102.0, True, 2.0)
    assert res.summary("g", "w")["inference"]["cold_starts"] == 2


@dataclass
class CapacitySpy:
    """Greedy, recording the capacity of every round."""

    seen: list[tuple[float, dict[int, int]]]
    name: str = "spy"
    job_mode: JobMode = JobMode.FIXED_BATCH

    def allocate(self, state: ClusterState, rng: np.random.Generator) -> Allocation:
        self.seen.append((state.now, dict(state.capacity)))
        return Greedy().allocate(state, rng)


@pytest.mark.parametrize(
    ("lending", "at_60", "at_120"),
    [(True, {0: 2, 1: 1}, {0: 2, 1: 2}), (False, {0: 2, 1: 0}, {0: 2, 1: 0})],
    ids=["lending", "no-lending"],
)
def test_capacity_lends_free_and_sleep_inference_gpus_only_when_lending(
    lending: bool, at_60: dict[int, int], at_120: dict[int, int]
) -> None:
    seen: list[tuple[float, dict[int, int]]] = []
    # The task's replica is RUNNING then PROTECT at 60 (not lendable), SLEEP at 120.
    tasks = [task("t", 40.0, 10.0)]
    res = run(
        [job("a")],
        tasks,
        policy=CapacitySpy(seen),
        lending=lending,
        inference_policy=ONE_POOL,
        check_invariants=True,
    )
    rounds = dict(seen)
    assert rounds[60.0] == at_60
    assert rounds[120.0] == at_120
    lent = res.summary("g", "w")["cluster"]["lent_gpu_s"]
    assert (lent > 0) is lending
    assert res.reclaim_times == ()


def test_reclaim_shrinks_the_job_at_once_with_the_afe_scale_down_cost() -> None:
    """2 training + 2 inference GPUs; the job (batch 120, 600 units) takes all 4.

    Tick 60: 4 GPUs, cold start 30 s; from 90 it runs at 1 / 0.3 units/s. The task at
    200 reclaims one lent GPU: AFE scale-down 3 s, then 1 / 0.4 units/s on 3 GPUs.
    At 240 the replica is PROTECT (ends 215, protected to 245): the job keeps 3.
    """
    app = TinyApp(limits=BatchLimits(100, 1200, 10, 100), per_epoch=300.0)
    restart = AfeRestartCost(table={"tiny": RestartDelays(cold=30.0, afe=3.0)})
    res = run(
        [job("a", batch=120)],
        [task("t", 200.0, 10.0)],
        restart=restart,
        apps={"tiny": app},
        check_invariants=True,
    )
    rec = res.jobs[0]
    done_at_200 = (200.0 - 90.0) / 0.3
    expected = 203.0 + (600.0 - done_at_200) * 0.4
    assert rec.completion == pytest.approx(expected)
    assert (rec.restarts, rec.restart_s) == (1, pytest.approx(33.0))
    assert res.reclaim_times == (200.0,)
    assert by_name(res)["t"] == (205.0, True, 5.0)
    cluster = res.summary("g", "w")["cluster"]
    assert cluster["reclaims"] == 1
    assert cluster["lent_gpu_s"] == pytest.approx(2 * 140.0 + (expected - 200.0))
    assert states_at(res, 200.0).lent == 1 and states_at(res, 200.0).running == 1


def test_without_the_task_the_job_keeps_four_gpus() -> None:
    app = TinyApp(limits=BatchLimits(100, 1200, 10, 100), per_epoch=300.0)
    restart = AfeRestartCost(table={"tiny": RestartDelays(cold=30.0, afe=3.0)})
    res = run([job("a", batch=120)], restart=restart, apps={"tiny": app})
    assert res.jobs[0].completion == pytest.approx(90.0 + 600.0 * 0.3)
    assert res.jobs[0].restarts == 0


def test_a_finished_jobs_gpus_go_free_at_its_completion() -> None:
    # The job ends at 90 + 1200 / 4 = 390 (4 GPUs); the task at 395 finds FREE GPUs
    # without waiting for the tick at 420 and reclaims nothing.
    res = run([job("a")], [task("t", 395.0, 1.0)], check_invariants=True)
    assert res.jobs[0].completion == pytest.approx(390.0)
    assert res.reclaim_times == ()
    assert states_at(res, 391.0).free == 4


@pytest.mark.parametrize("policy", ["ats-i", "random", "lyra"])
def test_every_inference_policy_serves_every_task_deterministically(policy: str) -> None:
    jobs = [job(f"j{i}", submit=30.0 * i) for i in range(3)]
    tasks = [
        task(f"t{i}", 7.0 * i, 3.0 + i % 4, service=f"infer-{'tiny' if i % 2 else 'small'}-1")
        for i in range(40)
    ]

    def once() -> SimResult:
        return run(jobs, tasks, shape="3x2", inference_policy=inference.create(policy), seed=3)

    a, b = once(), once()
    assert all(r.end is not None for r in a.inference)
    assert all(r.completion is not None for r in a.jobs)
    assert (a.jobs, a.inference, a.timeline, a.reclaim_times) == (
        b.jobs,
        b.inference,
        b.timeline,
        b.reclaim_times,
    )


def test_lyra_reclaims_a_whole_inference_node() -> None:
    # Training holds both GPUs of the inference node; one task takes the node back.
    res = run(
        [job("a")],
        [task("t", 100.0, 5.0)],
        inference_policy=inference.create("lyra"),
        check_invariants=True,
    )
    assert res.reclaim_times == (100.0, 100.0)
    at = states_at(res, 100.0)
    assert (at.lent, at.running, at.free) == (0, 1, 1)


def test_utilisation_counts_busy_gpu_seconds_per_pool() -> None:
    # One task: RUNNING 5 + 10 s on the single inference GPU; the run spans 0..15.
    res = run(tasks=[task("t", 0.0, 10.0)], shape="2x1", inference_policy=ONE_POOL)
    assert (res.start_time, res.end_time) == (0.0, 15.0)
    s = res.summary("g", "w")["cluster"]
    assert s["util_inference_pool"] == pytest.approx(1.0)
    assert s["util_training_pool"] == 0.0
    assert res.state_seconds(GpuState.FREE, Pool.TRAINING) == pytest.approx(15.0)


def test_inference_placement_events_are_ordered_before_the_tick() -> None:
    kinds = [EventKind.JOB_FINISHED, EventKind.INFERENCE_DONE, EventKind.PROTECT_EXPIRED]
    arrival = EventKind.INFERENCE_ARRIVAL.priority
    assert all(k.priority < arrival < EventKind.TICK.priority for k in kinds)


def test_rollback_restores_every_slot_a_job_changes() -> None:
    from deepboot.core import Placement, TrainingJobSpec
    from deepboot.perf.restart import FlatRestartCost
    from deepboot.sim.job import GroundTruth, SimJob

    spec = TrainingJobSpec("a", 0.0, "tiny", 1, 100)
    j = SimJob(spec, GroundTruth(TinyApp()), JobMode.ADAPTIVE)
    j.reallocate(Placement((0, 0)), 60.0, FlatRestartCost(30.0))
    j.advance(300.0)

    def snapshot() -> dict[str, object]:
        out = {name: getattr(j, name) for name in SimJob.__slots__}
        out["_profile"] = dict(j._profile)
        return out

    before = snapshot()
    cp = j.checkpoint()
    j.reallocate(Placement((0, 0, 1)), 300.0, FlatRestartCost(30.0))
    j.advance(900.0)
    assert snapshot() != before
    j.rollback(cp)
    assert snapshot() == before


def test_max_time_leaves_unfinished_tasks_without_an_end() -> None:
    tasks = [task("a", 0.0, 50.0), task("b", 10.0, 5.0, service="infer-small-1")]
    res = run(tasks=tasks, shape="2x1", inference_policy=ONE_POOL, max_time=40.0)
    assert by_name(res) == {"a": (5.0, True, 5.0), "b": (None, False, None)}
    assert [r.end for r in res.inference] == [None, None]
    s = res.summary("g", "w")["inference"]
    assert (s["tasks"], s["completed"], s["cold_starts"], s["avg_delay_s"]) == (2, 0, 1, 5.0)
    assert res.timeline[-1].t == res.end_time == 10.0


@pytest.mark.parametrize("reserve", [False, True], ids=["lend-all", "reserve"])
def test_the_lending_reserve_keeps_a_busy_services_replica_warm(reserve: bool) -> None:
    # A task of one service every 90 s: its replica is SLEEP by every tick. DeepBoot
    # lends it, so the next task reclaims a GPU (a cold start and a training
    # resize); the reserve (rate over the last 120 s: mean >= 0.5 per interval, so
    # P[no arrival] < 0.8) keeps it back, and every later task reuses it warm.
    from deepboot.policies.lending import LendReserveConfig

    tasks = [task(f"t{k}", 10.0 + 90.0 * k, 1.0) for k in range(8)]
    res = run(
        [job("j")],
        tasks,
        shape="2x2",
        policy=Greedy(want=4),
        inference_policy=ONE_POOL,
        lend_reserve=LendReserveConfig(enabled=reserve, target=0.8, window_s=120.0),
        max_time=900.0,
        check_invariants=True,
    )
    s = res.summary("greedy", "w")
    if reserve:
        assert (s["cluster"]["reclaims"], s["inference"]["cold_starts"]) == (0, 1)
        assert s["training"]["max_job_restarts"] == 0
    else:
        assert s["cluster"]["reclaims"] == s["inference"]["cold_starts"] - 1 == 7
        assert s["training"]["max_job_restarts"] >= 7
