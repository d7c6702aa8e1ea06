"""The discrete-event engine on hand-computable cases.

The tiny application: per-GPU batch m costs 0.01 * m seconds per step, no sync time,
gain 1 (zero gradient variance), 600 units of progress per epoch, 2 epochs. A job
with batch 100 on K GPUs progresses at K units per second.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepboot.core import (
    BatchLimits,
    ClusterSpec,
    ClusterState,
    ConfigError,
    InferenceTaskSpec,
    InvalidDecisionError,
    JobMode,
    Placement,
    SimulationStalledError,
    TrainingJobSpec,
    UnschedulableError,
    Workload,
)
from deepboot.core.placement import Allocation, freeze_allocation
from deepboot.perf.restart import FlatRestartCost
from deepboot.scheduler import Event, EventKind, Scheduler
from deepboot.scheduler.operations import WaitReason
from deepboot.sim.config import SimConfig
from deepboot.sim.engine import Simulation
from deepboot.sim.metrics import JobRecord, SimResult
from deepboot.sim.run import simulate
from deepboot.world.queue import EventQueue


@dataclass
class TinyApp:
    """Hand-computable ground truth (see the module docstring)."""

    name: str = "tiny"
    limits: BatchLimits = BatchLimits(100, 100, 10, 100)
    max_epochs: int = 2
    per_epoch: float = 600.0
    step_per_sample: float = 0.01
    sync: float = 0.0

    def step_time(self, shape: tuple[int, ...], local_bsz: int) -> tuple[float, float]:
        return self.step_per_sample * local_bsz + self.sync, self.sync

    def grad_stats(self, batch_size: int, epoch: int) -> tuple[float, float]:
        return 1.0, 0.0

    def progress_at(self, epoch: int) -> float:
        return self.per_epoch * epoch


@dataclass(frozen=True)
class GreedyFixed:
    """FIXED policy: keep running jobs; start queued ones in order on the first free GPUs.

    ``replicas(state)`` can override how many GPUs every job asks for (default: its
    ``target_num_replicas``); running jobs are resized to it, moving to the lowest
    free GPUs.
    """

    replicas: Callable[[ClusterState], int | None] = lambda state: None
    name: str = "greedy-fixed"
    job_mode: JobMode = JobMode.FIXED

    def allocate(self, state: ClusterState, rng: np.random.Generator) -> Allocation:
        free = dict(state.capacity)
        out: dict[str, Placement] = {}
        want_all = self.replicas(state)
        for job in state.jobs:
            want = want_all or job.target_num_replicas or 1
            if job.placement.num_replicas == want:
                out[job.name] = job.placement
                for n in job.placement.node_ids:
                    free[n] -= 1
        for job in state.jobs:
            if job.name in out:
                continue
            want = want_all or job.target_num_replicas or 1
            if sum(free.values()) < want:
                break
            ids: list[int] = []
            for n in sorted(free):
                take = min(free[n], want - len(ids))
                ids += [n] * take
                free[n] -= take
            out[job.name] = Placement.of(ids)
        return freeze_allocation(out)


@dataclass(frozen=True)
class RandomPolicy:
    """FIXED policy whose choice of which queued job to start uses the generator."""

    name: str = "random"
    job_mode: JobMode = JobMode.FIXED

    def allocate(self, state: ClusterState, rng: np.random.Generator) -> Allocation:
        free = state.total_capacity
        order = rng.permutation(len(state.jobs))
        out: dict[str, Placement] = {}
        node = 0
        for i in order:
            job = state.jobs[int(i)]
            if free and job.placement:
                out[job.name] = job.placement
                free -= job.placement.num_replicas
        used = {n for p in out.values() for n in p.node_ids}
        for i in order:
            job = state.jobs[int(i)]
            if job.name in out:
                continue
            while node in used and node < state.cluster.num_nodes:
                node += 1
            if node >= state.cluster.num_nodes:
                break
            out[job.name] = Placement((node,))
            used.add(node)
        return freeze_allocation(out)


@dataclass(frozen=True)
class DoubleBookAt:
    """Valid (one GPU on node 0 for the first job) until ``when``, then double-books."""

    when: float
    name: str = "double-book"
    job_mode: JobMode = JobMode.FIXED

    def allocate(self, state: ClusterState, rng: np.random.Generator) -> Allocation:
        if state.now < self.when:
            return freeze_allocation({state.jobs[0].name: Placement((0,))})
        return freeze_allocation({j.name: Placement((0, 0)) for j in state.jobs})


def make_job(
    name: str, submit: float = 0.0, replicas: int = 1, batch: int = 100, app: str = "tiny"
) -> TrainingJobSpec:
    return TrainingJobSpec(name, submit, app, replicas, batch)


def make_workload(
    *jobs: TrainingJobSpec, inference: tuple[InferenceTaskSpec, ...] = ()
) -> Workload:
    return Workload("test", tuple(sorted(jobs, key=lambda j: (j.submit_time, j.name))), inference)


@dataclass
class Run:
    result: SimResult
    progress_calls: list[tuple[float, int, int]] = field(default_factory=list)

    def rec(self, name: str) -> JobRecord:
        return next(r for r in self.result.jobs if r.name == name)


def run(
    *jobs: TrainingJobSpec,
    policy: object = None,
    shape: str = "1x1",
    app: TinyApp | None = None,
    **config: object,
) -> Run:
    calls: list[tuple[float, int, int]] = []
    result = simulate(
        make_workload(*jobs),
        ClusterSpec.parse(shape),
        policy or GreedyFixed(),  # type: ignore[arg-type]
        {"tiny": app or TinyApp()},
        SimConfig(**config),  # type: ignore[arg-type]
        on_progress=lambda now, done, total: calls.append((now, done, total)),
    )
    return Run(result, calls)


def test_single_job_jct_includes_tick_alignment_and_restart_delay() -> None:
    r = run(make_job("a", submit=10.0)).rec("a")
    # First tick at 60, 30 s cold start, 1200 s of work at 1 unit/s.
    assert r.first_start == 60.0
    assert r.completion == pytest.approx(1290.0)
    assert r.jct == pytest.approx(1280.0)
    assert r.queue_delay == 50.0
    assert r.restarts == 0
    assert r.restart_s == 30.0
    assert r.gpu_seconds == pytest.approx(1230.0)


def test_gpus_of_a_finished_job_are_reused_at_the_next_tick_only() -> None:
    out = run(make_job("a"), make_job("b"))
    assert out.rec("a").completion == pytest.approx(1290.0)
    # b waits for the tick after a's completion (1320), then 30 + 1200 s.
    assert out.rec("b").first_start == 1320.0
    assert out.rec("b").completion == pytest.approx(2550.0)
    assert out.rec("b").queue_delay == 1320.0
    assert out.result.rounds == len(range(60, 2550, 60))


def test_resize_costs_a_restart_and_changes_the_rate() -> None:
    policy = GreedyFixed(replicas=lambda s: 1 if s.now < 300 else 2)
    r = run(make_job("a", replicas=2), policy=policy, shape="1x2").rec("a")
    # 1 GPU from 90 to 300: 210 units; resize at 300 (restart to 330), then 2 units/s
    # for the remaining 990 units: 495 s.
    assert r.restarts == 1
    assert r.restart_s == 60.0
    assert r.completion == pytest.approx(825.0)
    assert r.gpu_seconds == pytest.approx(240.0 + 2 * 525.0)


def test_preempted_job_keeps_progress_and_pays_a_new_start() -> None:
    # The policy runs the job, takes it away between 300 and 600, then gives it back.
    policy = GreedyFixed(replicas=lambda s: 1)

    @dataclass(frozen=True)
    class Pause:
        name: str = "pause"
        job_mode: JobMode = JobMode.FIXED

        def allocate(self, state: ClusterState, rng: np.random.Generator) -> Allocation:
            if 300 <= state.now < 600:
                return freeze_allocation({})
            return policy.allocate(state, rng)

    r = run(make_job("a"), policy=Pause()).rec("a")
    # 90..300: 210 units. Preempted 300..600. Resume at 600, restart to 630, 990 s.
    assert r.restarts == 1
    assert r.restart_s == 60.0
    assert r.completion == pytest.approx(1620.0)


def test_idle_time_is_skipped_to_the_first_tick_after_a_submission() -> None:
    out = run(make_job("a", submit=0.0), make_job("b", submit=5000.0), shape="1x2")
    assert out.rec("b").first_start == 5040.0
    assert out.rec("b").completion == pytest.approx(5040.0 + 1230.0)
    ticks = [c[0] for c in out.progress_calls]
    assert 3000.0 not in ticks  # nothing was active then
    assert ticks == sorted(set(ticks))
    assert all(t % 60.0 == 0 for t in ticks)


def test_job_submitted_exactly_at_a_tick_is_scheduled_at_that_tick() -> None:
    assert run(make_job("a", submit=120.0)).rec("a").first_start == 120.0


def test_on_progress_reports_monotone_counts_once_per_tick() -> None:
    out = run(make_job("a"), make_job("b"), make_job("c", submit=100.0), shape="1x2")
    calls = out.progress_calls
    assert [c[2] for c in calls] == [3] * len(calls)
    assert [c[1] for c in calls] == sorted(c[1] for c in calls)
    assert calls[-1][1] == 3
    assert len(calls) == len({c[0] for c in calls})


def test_round_epoch_times_rounds_each_crossing_like_the_reference() -> None:
    # 101 units per epoch at 2 units/s (50.5 s) on 1 GPU with a batch of 50.
    app = TinyApp(per_epoch=101.0, limits=BatchLimits(50, 50, 10, 100))
    job = make_job("a", batch=50)
    exact = run(job, app=app).rec("a")
    rounded = run(job, app=app, round_epoch_times=True).rec("a")
    assert exact.completion == pytest.approx(90.0 + 101.0)
    # Crossings at 120 + round(20.5) = 140 and 180 + round(10.5) = 190 (half to even).
    assert rounded.completion == 190.0


def test_restart_cost_model_is_configurable() -> None:
    r = run(make_job("a"), restart=FlatRestartCost(0.0)).rec("a")
    assert r.completion == pytest.approx(1260.0)
    assert r.restart_s == 0.0


def test_max_time_cuts_the_run_short() -> None:
    out = run(make_job("a"), make_job("b"), max_time=2000.0)
    assert out.rec("a").completion is not None
    assert out.rec("b").completion is None
    assert out.rec("b").first_start == 1320.0
    s = out.result.summary("greedy", "test")
    assert s["training"]["completed"] == 1
    assert out.result.end_time <= 2000.0


def test_unknown_application_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="unknown application 'bogus'.*known: tiny"):
        run(make_job("a", app="bogus"))


def test_invalid_decision_is_rejected_before_anything_is_applied() -> None:
    wl = make_workload(make_job("a", replicas=2), make_job("b", replicas=2))
    sim = Simulation(
        wl,
        ClusterSpec.parse("1x3"),
        Scheduler(DoubleBookAt(when=120.0)),
        {"tiny": TinyApp()},
        SimConfig(),
    )
    with pytest.raises(InvalidDecisionError, match="double-booked"):
        sim.run()
    a, b = sim.jobs
    assert a.placement == Placement((0,))
    assert not b.placement
    assert b.num_restarts is None


def test_inference_tasks_are_ignored_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    task = InferenceTaskSpec("i0", 5.0, "infer-tiny-1", "tiny", 10.0, 1)
    wl = make_workload(make_job("a"), inference=(task, task))
    with caplog.at_level("WARNING"):
        result = simulate(
            wl, ClusterSpec.parse("1x1"), GreedyFixed(), {"tiny": TinyApp()}, SimConfig()
        )
    assert len([r for r in caplog.records if "inference" in r.getMessage()]) == 1
    assert result.jobs[0].completion == pytest.approx(1290.0)


def test_inference_nodes_get_no_training_capacity() -> None:
    seen: list[dict[int, int]] = []

    @dataclass(frozen=True)
    class Spy:
        name: str = "spy"
        job_mode: JobMode = JobMode.FIXED

        def allocate(self, state: ClusterState, rng: np.random.Generator) -> Allocation:
            seen.append(dict(state.capacity))
            return GreedyFixed().allocate(state, rng)

    wl = make_workload(make_job("a"))
    res = simulate(
        wl,
        ClusterSpec.parse("2x2", inference_nodes=1),
        Spy(),
        {"tiny": TinyApp()},
        SimConfig(lending=False),
    )
    # Without lending, training sees only the training pool.
    assert seen[0] == {0: 2, 1: 0}
    cluster = res.summary("spy", "w")["cluster"]
    assert (cluster["nodes"], cluster["gpus_per_node"], cluster["inference_nodes"]) == (2, 2, 1)
    assert cluster["lent_gpu_s"] == 0.0


def test_runs_are_deterministic_for_a_seed() -> None:
    jobs = [make_job(f"j{i}", submit=float(13 * i)) for i in range(8)]

    def once(seed: int) -> tuple[object, ...]:
        res = run(*jobs, policy=RandomPolicy(), shape="3x1", seed=seed).result
        s = res.summary("random", "w")
        del s["wall_s"], s["scheduler"]["decision_ms_median"], s["scheduler"]["decision_ms_max"]
        return res.jobs, s

    assert once(7) == once(7)


def test_summary_schema_and_values() -> None:
    out = run(make_job("a"), make_job("b"))
    s = out.result.summary("greedy", "wl")
    assert list(s) == [
        "policy",
        "workload",
        "cluster",
        "training",
        "inference",
        "scheduler",
        "wall_s",
    ]
    assert list(s["training"]) == [
        "jobs",
        "completed",
        "avg_jct_s",
        "median_jct_s",
        "p99_jct_s",
        "makespan_s",
        "avg_queue_s",
        "restarts",
        "restart_s",
        "max_job_restarts",
        "max_job_restart_s",
    ]
    assert list(s["scheduler"]) == ["rounds", "decision_ms_median", "decision_ms_max"]
    t = s["training"]
    assert (t["jobs"], t["completed"], t["restarts"]) == (2, 2, 0)
    assert t["avg_jct_s"] == pytest.approx((1290.0 + 2550.0) / 2)
    assert t["median_jct_s"] == pytest.approx((1290.0 + 2550.0) / 2)
    assert t["makespan_s"] == pytest.approx(2550.0)
    assert t["avg_queue_s"] == pytest.approx((60.0 + 1320.0) / 2)
    assert t["restart_s"] == pytest.approx(60.0)
    # Each job's first start costs 30 s and neither restarts.
    assert (t["max_job_restarts"], t["max_job_restart_s"]) == (0, pytest.approx(30.0))
    assert s["scheduler"]["rounds"] == out.result.rounds == len(out.result.decision_ms)
    assert s["policy"] == "greedy" and s["workload"] == "wl"


def test_empty_workload_gives_an_empty_summary() -> None:
    res = simulate(make_workload(), ClusterSpec.parse("1x1"), GreedyFixed(), {}, SimConfig())
    s = res.summary("greedy", "none")
    assert s["training"]["jobs"] == 0 and s["training"]["avg_jct_s"] == 0.0
    assert s["scheduler"]["rounds"] == 0


def test_event_queue_breaks_ties_by_priority_then_insertion() -> None:
    q = EventQueue()
    q.push(60.0, Event(EventKind.TICK))
    q.push(60.0, Event(EventKind.JOB_SUBMITTED, "late"))
    q.push(60.0, Event(EventKind.JOB_FINISHED, "x"))
    q.push(30.0, Event(EventKind.TICK))
    q.push(60.0, Event(EventKind.JOB_SUBMITTED, "early"))
    q.push(60.0, Event(EventKind.JOB_SUBMITTED, "a"))
    order = [q.pop() for _ in range(len(q))]
    assert order == [
        (30.0, Event(EventKind.TICK)),
        (60.0, Event(EventKind.JOB_FINISHED, "x")),
        (60.0, Event(EventKind.JOB_SUBMITTED, "late")),
        (60.0, Event(EventKind.JOB_SUBMITTED, "early")),
        (60.0, Event(EventKind.JOB_SUBMITTED, "a")),
        (60.0, Event(EventKind.TICK)),
    ]
    assert q.peek_time() == float("inf")


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ConfigError, match="interval"):
        SimConfig(interval=0.0)
    with pytest.raises(ConfigError, match="max_time"):
        SimConfig(max_time=-1.0)
    cfg = SimConfig(app_max_replicas={"x": 2})
    with pytest.raises(TypeError):
        cfg.app_max_replicas["x"] = 3  # type: ignore[index]


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.0, 3000.0), st.sampled_from([1, 2, 4])),
        min_size=1,
        max_size=6,
    )
)
def test_non_preemptive_runs_obey_the_closed_form_bounds(rows: list[tuple[float, int]]) -> None:
    jobs = [make_job(f"j{i}", submit=t, replicas=k) for i, (t, k) in enumerate(rows)]
    out = run(*jobs, shape="1x4")
    ordered = sorted(jobs, key=lambda j: (j.submit_time, j.name))
    for spec, rec in zip(ordered, out.result.jobs, strict=True):
        assert rec.name == spec.name
        assert rec.first_start is not None and rec.completion is not None
        assert rec.first_start >= spec.submit_time
        assert rec.first_start % 60.0 == 0.0
        # Batch 100 on k GPUs: k units/s after a 30 s start, 1200 units in all.
        k = spec.num_replicas
        assert rec.completion == pytest.approx(rec.first_start + 30.0 + 1200.0 / k)
        assert rec.gpu_seconds == pytest.approx(k * (rec.completion - rec.first_start))
        assert rec.restarts == 0


@pytest.mark.parametrize("mode", list(JobMode), ids=[m.name for m in JobMode])
def test_every_job_mode_runs_to_completion(mode: JobMode) -> None:
    @dataclass(frozen=True)
    class Moded:
        job_mode: JobMode
        name: str = "moded"

        def allocate(self, state: ClusterState, rng: np.random.Generator) -> Allocation:
            return GreedyFixed(replicas=lambda s: 1).allocate(state, rng)

    r = run(make_job("a"), policy=Moded(mode)).rec("a")
    assert r.completion == pytest.approx(1290.0)


def test_a_waiting_job_says_why() -> None:
    # One GPU: the greedy policy starts "a"; "b" waits, not selected.
    wl = make_workload(make_job("a"), make_job("b", submit=1.0))
    sim = Simulation(
        wl, ClusterSpec.parse("1x1"), Scheduler(GreedyFixed()), {"tiny": TinyApp()}, SimConfig()
    )
    seen: dict[str, object] = {}

    def spy(now: float, event: Event, s: Simulation) -> None:
        if event.kind is EventKind.TICK and now == 60.0:
            seen.update({n: s.wait_reason(n) for n in ("a", "b")})

    sim.run(on_event=spy)
    assert seen == {"a": None, "b": WaitReason.NOT_SELECTED}


@pytest.mark.parametrize(
    ("shape", "inference_nodes", "lending", "message"),
    [
        ("1x1", 0, False, r"on 2 GPUs \(its requested size\), and training may use at most 1"),
        ("2x1", 1, False, r"at most 1: 1 GPU of the training pool \(lending is off\)"),
        ("2x1", 1, True, r"at most 2: 1 GPU of the training pool plus 1 lendable"),
    ],
    ids=["cluster", "training-pool", "with-lending"],
)
def test_a_job_larger_than_any_allocation_is_refused_before_the_run(
    shape: str, inference_nodes: int, lending: bool, message: str
) -> None:
    wl = make_workload(make_job("a"), make_job("c", 2.0, replicas=3 if lending else 2))
    cluster = ClusterSpec.parse(shape, inference_nodes)
    with pytest.raises(UnschedulableError, match=message):
        Simulation(
            wl, cluster, Scheduler(GreedyFixed()), {"tiny": TinyApp()}, SimConfig(lending=lending)
        )


@dataclass(frozen=True)
class Never:
    """Places nothing, ever."""

    name: str = "never"
    job_mode: JobMode = JobMode.ADAPTIVE

    def allocate(self, state: ClusterState, rng: np.random.Generator) -> Allocation:
        return freeze_allocation({})


def test_a_run_that_stops_making_progress_ends_with_a_clear_error() -> None:
    wl = make_workload(make_job("a"), make_job("b", submit=5.0))
    sim = Simulation(
        wl,
        ClusterSpec.parse("1x2"),
        Scheduler(Never()),
        {"tiny": TinyApp()},
        SimConfig(stall_ticks=5),
    )
    with pytest.raises(SimulationStalledError, match=r"no progress for 5 ticks at 300 s: 2 jobs"):
        sim.run()
    assert sim.now == 300.0  # bounded by ticks, not by wall time


def test_a_clock_that_cannot_advance_is_an_error() -> None:
    wl = make_workload(make_job("a", submit=1e18))
    sim = Simulation(
        wl, ClusterSpec.parse("1x1"), Scheduler(GreedyFixed()), {"tiny": TinyApp()}, SimConfig()
    )
    with pytest.raises(SimulationStalledError, match="clock cannot advance"):
        sim.run()
