"""The simulator on a cluster of several GPU types (issue 50): a job runs at its
type's speed, keeps one model per type, pays a restart from nothing to change type,
and a type-unaware allocator's placements are cut to one type; on one type nothing
changes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from deepboot.core import ClusterSpec, ClusterState, JobMode, Placement, TrainingJobSpec, Workload
from deepboot.core.placement import Allocation
from deepboot.perf.catalog import load_catalog
from deepboot.perf.gputypes import apps_for_cluster
from deepboot.perf.profiles import load_profiles
from deepboot.perf.restart import AfeRestartCost, RestartDelays
from deepboot.policies import registry
from deepboot.scheduler import Scheduler
from deepboot.sim.config import SimConfig
from deepboot.sim.engine import Simulation
from deepboot.sim.run import simulate
from tests.perf.builders import validation_csv, write_typed_profiles
from tests.sim.test_golden import make_workload

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"

# Progress slow enough that the toy job runs for hours.
SLOW = {
    8: validation_csv([(1e5, 10, 0.5, 2.0, 4.0), (2e5, 20, 0.6, 1.0, 8.0)]),
    16: validation_csv([(1.1e5, 6, 0.5, 4.0, 6.0), (2.1e5, 11, 0.6, 3.0, 12.0)]),
}


@dataclass
class Script:
    """Places job ``a`` where ``plan(now)`` says (a type-unaware allocator)."""

    plan: Callable[[float], Placement]
    job_mode: JobMode = JobMode.ADAPTIVE
    name: str = "script"

    def allocate(self, state: ClusterState, rng: np.random.Generator) -> Allocation:
        return {"a": self.plan(state.now)} if state.jobs else {}


def _plan(now: float) -> Placement:
    if now < 120:
        return Placement((0,))  # t4
    if now < 240:
        return Placement((0, 0))  # t4, grown
    if now < 360:
        return Placement((1, 1))  # fast: a change of type
    return Placement((0, 1, 1))  # mixed: cut to fast, its majority; no change


def test_a_job_runs_at_its_types_speed_and_restarts_cold_to_change_type(tmp_path: Path) -> None:
    base_dir, typed_dir = write_typed_profiles(tmp_path, SLOW)
    cluster = ClusterSpec.parse("t4:1x4,fast:1x4")
    apps, typed = apps_for_cluster(cluster.gpu_types, load_profiles(base_dir), typed_dir)
    restart = AfeRestartCost(table={"toy": RestartDelays(cold=50.0, afe=5.0)})
    wl = Workload("w", (TrainingJobSpec("a", 0.0, "toy", 1, 8),))
    sim = Simulation(
        wl,
        cluster,
        Scheduler(Script(_plan)),
        apps,
        SimConfig(interval=60.0, max_time=480.0, restart=restart),
        typed_apps=typed,
    )
    sim.run()
    job = sim.jobs[0]
    assert job.placement == Placement((1, 1)) and job.gpu_type == "fast"
    # Cold first start 50 s; growing 1 -> 2 by AFE 5 + 45 x 1/2; to the other type
    # cold again (no worker survives it); the cut mixed placement changes nothing.
    assert job.restart_seconds == pytest.approx(50.0 + 27.5 + 50.0)
    assert job.num_restarts == 2
    # One model per type: the t4 points measured 1 and 2 GPUs, fast's 2.
    assert {k[1] for k in job._profiles["t4"]} == {1, 2}
    assert {k[1] for k in job._profiles["fast"]} == {2}
    fast_step = typed["fast"]["toy"].step_time((2,), job.atomic_bsz)  # type: ignore[index]
    assert job._profiles["fast"][(1, 2, job.atomic_bsz)] == fast_step


def test_on_a_faster_type_a_job_finishes_sooner(tmp_path: Path) -> None:
    base_dir, typed_dir = write_typed_profiles(tmp_path, SLOW)
    base = load_profiles(base_dir)
    wl = Workload("w", (TrainingJobSpec("a", 0.0, "toy", 1, 8),))
    done = {}
    for node in (0, 1):
        cluster = ClusterSpec.parse("t4:1x4,fast:1x4")
        apps, typed = apps_for_cluster(cluster.gpu_types, base, typed_dir)
        result = simulate(
            wl,
            cluster,
            Script(lambda now, node=node: Placement((node,))),  # type: ignore[misc]
            apps,
            SimConfig(interval=60.0),
            typed_apps=typed,
        )
        done[node] = result.jobs[0].completion
    assert done[0] is not None and done[1] is not None
    assert done[1] < 0.6 * done[0]  # fast is 2x: about half, plus the same restart


@pytest.mark.parametrize("policy", ["pollux", "tiresias"])
def test_one_named_type_runs_exactly_as_the_untyped_cluster(policy: str) -> None:
    runs = []
    for shape in ("4x4", "t4:4x4"):
        cluster = ClusterSpec.parse(shape)
        apps, typed = apps_for_cluster(cluster.gpu_types, load_catalog(), None)
        result = simulate(
            make_workload(),
            cluster,
            registry.create(policy),
            apps,
            SimConfig(interval=60.0, seed=0),
            typed_apps=typed,
        )
        runs.append([(r.name, r.first_start, r.completion, r.restarts) for r in result.jobs])
    assert runs[0] == runs[1]


@pytest.mark.skipif(not (TRACES / "hetero").is_dir(), reason="../shared/traces is absent")
def test_pollux_on_sias_cluster_runs_every_job_on_one_type() -> None:
    cluster = ClusterSpec.parse("t4:6x4,rtx:3x8,a100:2x8")
    apps, typed = apps_for_cluster(
        cluster.gpu_types, load_profiles(TRACES / "profiles"), TRACES / "hetero" / "profiles"
    )
    from deepboot.sim.workload import load_workload

    wl = load_workload(TRACES / "hetero" / "workloads" / "saturn" / "workload-1.csv", apps.keys())
    wl = Workload(wl.name, wl.training[:40])
    types = cluster.node_types()
    seen: list[set[str | None]] = []

    def watch(now: float, event: object, sim: Simulation) -> None:
        seen.extend({types[n] for n in j.placement.node_ids} for j in sim.jobs if j.placement)

    result = simulate(
        wl,
        cluster,
        registry.create("pollux"),
        apps,
        SimConfig(interval=60.0, seed=0),
        on_event=watch,
        typed_apps=typed,
    )
    assert all(len(s) == 1 for s in seen)
    assert {t for s in seen for t in s} == {"t4", "rtx", "a100"}
    assert all(r.completion is not None for r in result.jobs)


def test_one_model_for_every_type_keeps_each_configurations_first_measurement(
    tmp_path: Path,
) -> None:
    base_dir, typed_dir = write_typed_profiles(tmp_path, SLOW)
    cluster = ClusterSpec.parse("t4:1x4,fast:1x4")
    apps, typed = apps_for_cluster(cluster.gpu_types, load_profiles(base_dir), typed_dir)
    wl = Workload("w", (TrainingJobSpec("a", 0.0, "toy", 1, 8),))
    config = SimConfig(interval=60.0, max_time=480.0, model_per_type=False)
    sim = Simulation(wl, cluster, Scheduler(Script(_plan)), apps, config, typed_apps=typed)
    sim.run()
    job = sim.jobs[0]
    assert job.gpu_type == "fast"  # it runs at fast's speed ...
    assert set(job._profiles) == {None}  # ... but keeps one profile, t4's points first
    t4 = typed["t4"]["toy"]  # type: ignore[index]
    for (_nodes, replicas, atomic), times in job._profile.items():
        if replicas == 1:
            assert times == t4.step_time((1,), atomic)


def test_a_slowdown_divides_the_progress_rate() -> None:
    wl = Workload("w", (TrainingJobSpec("a", 0.0, "cifar10", 1, 128),))
    spans = []
    for slowdowns in ({}, {"cifar10": 1.8}):
        result = simulate(
            wl,
            ClusterSpec.parse("1x4"),
            Script(lambda now: Placement((0,))),
            load_catalog(),
            SimConfig(interval=60.0, slowdowns=slowdowns, max_time=50_000.0),
        )
        record = result.jobs[0]
        assert record.completion is not None and record.first_start is not None
        spans.append(record.completion - record.first_start - record.restart_s)
    assert spans[1] / spans[0] == pytest.approx(1.8, rel=1e-3)
