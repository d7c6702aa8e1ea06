"""Per-job resize modes (issue 46, part 5): the workload columns, what the simulator
charges each mode, what a policy sees, and results unchanged without the columns."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deepboot.core import ClusterSpec, ClusterState, JobMode, TrainingJobSpec, Workload
from deepboot.core.errors import InputError
from deepboot.core.placement import Allocation
from deepboot.perf.catalog import load_catalog
from deepboot.perf.restart import (
    AfeRestartCost,
    FlatRestartCost,
    RestartDelays,
    job_resize_cost,
    job_restart_delay,
)
from deepboot.policies import registry
from deepboot.sim.config import SimConfig
from deepboot.sim.philly import write_workload_csv
from deepboot.sim.run import simulate
from deepboot.sim.workload import DEEPBOOT_COLUMNS, POLLUX_COLUMNS, load_workload
from tests.sim.test_engine import GreedyFixed, TinyApp, make_workload
from tests.sim.test_golden import make_workload as golden_workload

APPS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
POLLUX_HEADER = ",".join(POLLUX_COLUMNS)
DEEPBOOT_HEADER = ",".join(DEEPBOOT_COLUMNS)
TINY = AfeRestartCost(table={"tiny": RestartDelays(cold=40.0, afe=4.0)})
"""Cold 40 s, AFE 4 s for the tiny application."""


def make_csv(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "w.csv"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


# ------------------------------------------------------------------ the loader


def test_resize_columns_fill_the_spec(tmp_path: Path) -> None:
    path = make_csv(
        tmp_path,
        POLLUX_HEADER + ",resize,restart_cost",
        "a,0,cifar10,2,256,restart,12.5",
        "b,1,cifar10,2,256,restart,",
        "c,2,cifar10,2,256,afe,",
        "d,3,cifar10,2,256,,",
        "e,4,cifar10,2,256, Restart ,0",
    )
    jobs = {j.name: j for j in load_workload(path, APPS).training}
    assert (jobs["a"].resize, jobs["a"].restart_cost) == ("restart", 12.5)
    assert (jobs["b"].resize, jobs["b"].restart_cost) == ("restart", None)
    assert (jobs["c"].resize, jobs["c"].restart_cost) == ("afe", None)
    assert jobs["d"] == TrainingJobSpec("d", 3.0, "cifar10", 2, 256)  # empty: the defaults
    assert (jobs["e"].resize, jobs["e"].restart_cost) == ("restart", 0.0)


def test_either_column_alone_in_either_order_after_any_header(tmp_path: Path) -> None:
    only = make_csv(tmp_path, POLLUX_HEADER + ",resize", "a,0,cifar10,2,256,restart")
    assert load_workload(only, APPS).training[0].resize == "restart"
    swapped = make_csv(
        tmp_path,
        DEEPBOOT_HEADER + ",restart_cost,resize",
        "a,0,cifar10,2,256,4.0,-1,30,restart",
        "i,5,infer-bert-1,1,1,7.0,530,,",
    )
    w = load_workload(swapped, APPS)
    assert (w.training[0].resize, w.training[0].restart_cost) == ("restart", 30.0)
    assert len(w.inference) == 1


@pytest.mark.parametrize(
    ("header", "row", "line", "field", "message"),
    [
        (",resize", "a,0,cifar10,2,256,cold", 3, "resize", "'cold' is not a resize mode"),
        (",resize,restart_cost", "a,0,cifar10,2,256,restart,-1", 3, "restart_cost", "non-neg"),
        (",resize,restart_cost", "a,0,cifar10,2,256,restart,soon", 3, "restart_cost", "number"),
        (",resize,restart_cost", "a,0,cifar10,2,256,restart,inf", 3, "restart_cost", "finite"),
        (",resize,restart_cost", "a,0,cifar10,2,256,restart,2e9", 3, "restart_cost", "limit"),
        (",restart_cost", "a,0,cifar10,2,256,10", 3, "restart_cost", "resize=restart rows"),
        (",resize,restart_cost", "a,0,cifar10,2,256,afe,10", 3, "restart_cost", "resize=restart"),
        (",resize,resize", "a,0,cifar10,2,256,afe,afe", 1, "resize", "appears twice"),
        (",resize,cost", "a,0,cifar10,2,256,afe,1", 1, "resize", "unknown header"),
    ],
    ids=[
        "bad-mode",
        "negative-cost",
        "non-numeric-cost",
        "infinite-cost",
        "cost-over-limit",
        "cost-without-mode",
        "cost-on-afe-row",
        "column-twice",
        "unknown-column",
    ],
)
def test_bad_resize_values_name_the_file_line_and_column(
    tmp_path: Path, header: str, row: str, line: int, field: str, message: str
) -> None:
    path = make_csv(
        tmp_path, POLLUX_HEADER + header, "ok,0,cifar10,1,128" + "," * header.count(","), row
    )
    with pytest.raises(InputError, match=message) as info:
        load_workload(path, APPS)
    assert (info.value.path, info.value.line, info.value.field) == (str(path), line, field)


def test_an_inference_row_leaves_the_resize_columns_empty(tmp_path: Path) -> None:
    path = make_csv(
        tmp_path,
        DEEPBOOT_HEADER + ",resize",
        "a,0,cifar10,2,256,4.0,-1,restart",
        "i,5,infer-bert-1,1,1,7.0,530,restart",
    )
    with pytest.raises(InputError, match="empty for an inference row") as info:
        load_workload(path, APPS)
    assert (info.value.line, info.value.field) == (3, "resize")


def test_the_spec_refuses_what_the_loader_refuses() -> None:
    with pytest.raises(ValueError, match="resize must be one of afe, restart"):
        TrainingJobSpec("a", 0.0, "cifar10", 1, 128, resize="cold")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="finite number of seconds"):
        TrainingJobSpec("a", 0.0, "cifar10", 1, 128, resize="restart", restart_cost=-1.0)
    with pytest.raises(ValueError, match="for resize='restart' jobs only"):
        TrainingJobSpec("a", 0.0, "cifar10", 1, 128, restart_cost=5.0)


def test_written_workloads_keep_the_resize_columns(tmp_path: Path) -> None:
    jobs = [
        TrainingJobSpec("a", 0.0, "cifar10", 2, 256, resize="restart", restart_cost=12.5),
        TrainingJobSpec("b", 1.0, "bert", 1, 12, resize="restart"),
        TrainingJobSpec("c", 2.0, "ncf", 1, 32768),
    ]
    path = tmp_path / "out.csv"
    write_workload_csv(path, jobs)
    assert load_workload(path, APPS).training == tuple(jobs)
    plain = tmp_path / "plain.csv"
    write_workload_csv(plain, [jobs[2]])
    assert plain.read_text().splitlines()[0] == POLLUX_HEADER  # no columns when unused


# ------------------------------------------------------------------ the cost of a change


def test_each_mode_is_charged_its_own_delay() -> None:
    afe = TrainingJobSpec("a", 0.0, "bert", 2, 24)
    restart = dataclasses.replace(afe, resize="restart")
    own = dataclasses.replace(afe, resize="restart", restart_cost=7.0)
    model = AfeRestartCost()  # bert: cold 103, AFE 5
    for old, new, first, afe_s in [(0, 2, True, 103.0), (2, 1, False, 5.0), (2, 4, False, 54.0)]:
        assert job_restart_delay(model, afe, old, new, first) == afe_s
        assert job_restart_delay(model, restart, old, new, first) == 103.0
        assert job_restart_delay(model, own, old, new, first) == 7.0
    assert job_restart_delay(FlatRestartCost(30.0), restart, 2, 1, False) == 30.0
    assert job_resize_cost(model, afe) is None
    assert job_resize_cost(model, restart) == 103.0
    assert job_resize_cost(model, own) == 7.0
    assert job_resize_cost(AfeRestartCost(afe=False), restart) == 103.0


@dataclasses.dataclass
class Recording:
    """GreedyFixed (1 GPU before 300 s, 2 after) that keeps each job's last view."""

    seen: dict[str, float | None] = dataclasses.field(default_factory=dict)
    name: str = "recording"
    job_mode: JobMode = JobMode.FIXED

    def allocate(self, state: ClusterState, rng: np.random.Generator) -> Allocation:
        for job in state.jobs:
            self.seen[job.name] = job.restart_cost
        inner = GreedyFixed(replicas=lambda s: 1 if s.now < 300 else 2)
        return inner.allocate(state, rng)


@pytest.mark.parametrize(
    ("spec", "restart_s", "seen"),
    [
        # First start cold (40 s); the grow 1 -> 2 at 300 s costs AFE 4 + 36 * 1/2 = 22 s.
        ({}, 62.0, None),
        # Every change is a full restart: 40 + 40.
        ({"resize": "restart"}, 80.0, 40.0),
        # Its own restart cost on every change, the first start included.
        ({"resize": "restart", "restart_cost": 7.0}, 14.0, 7.0),
    ],
    ids=["afe", "restart", "restart-own-cost"],
)
def test_a_restart_job_pays_a_full_restart_on_every_change(
    spec: dict[str, Any], restart_s: float, seen: float | None
) -> None:
    job = TrainingJobSpec("a", 0.0, "tiny", 2, 100, **spec)
    policy = Recording()
    result = simulate(
        make_workload(job),
        ClusterSpec.parse("1x2"),
        policy,
        {"tiny": TinyApp()},
        SimConfig(restart=TINY),
    )
    (rec,) = result.jobs
    assert rec.restarts == 1
    assert rec.restart_s == pytest.approx(restart_s)
    assert policy.seen == {"a": seen}
    # 1 unit/s on 1 GPU from the 60 s tick plus the first delay to 300 s; then the
    # resize's delay, and 2 units/s for the rest of the 1200 units.
    first = spec.get("restart_cost", 40.0)
    done_by_300 = 300.0 - 60.0 - first
    assert rec.completion == pytest.approx(300.0 + restart_s - first + (1200 - done_by_300) / 2)


# ------------------------------------------------------------------ results unchanged


def run_records(workload: Workload, policy: str, **params: str) -> list[tuple[Any, ...]]:
    result = simulate(
        workload,
        ClusterSpec.parse("4x4"),
        registry.create(policy, **params),
        load_catalog(),
        SimConfig(restart=AfeRestartCost()),
    )
    return [(r.name, r.first_start, r.completion, r.restarts, r.restart_s) for r in result.jobs]


@pytest.mark.parametrize("policy", ["deepboot", "pollux"])
def test_results_are_unchanged_without_restart_jobs(tmp_path: Path, policy: str) -> None:
    workload = golden_workload()
    base = run_records(workload, policy)
    # The same jobs through the columns, all AFE (explicitly or empty): the same run.
    lines = [POLLUX_HEADER + ",resize,restart_cost"]
    lines += [
        f"{j.name},{j.submit_time:g},{j.application},{j.num_replicas},{j.batch_size},"
        + ("afe," if i % 2 else ",")
        for i, j in enumerate(workload.training)
    ]
    loaded = load_workload(make_csv(tmp_path, *lines), APPS)
    assert loaded.training == workload.training
    assert run_records(loaded, policy) == base
    # With no job carrying a cost, ignoring per-job costs changes nothing either.
    assert run_records(workload, policy, per_job_delta="false") == base


@pytest.mark.parametrize("policy", ["deepboot", "pollux"])
def test_restart_jobs_pay_cold_delays_and_a_policy_weighs_those_above_its_delta(
    policy: str,
) -> None:
    workload = golden_workload()
    marked = dataclasses.replace(
        workload,
        training=tuple(
            dataclasses.replace(j, resize="restart") if i % 2 else j
            for i, j in enumerate(workload.training)
        ),
    )
    base = run_records(workload, policy)
    mixed = run_records(marked, policy)
    uniform = run_records(marked, policy, per_job_delta="false")
    assert mixed != base
    restarts = [
        sum(
            rec[3]
            for rec, spec in zip(run, marked.training, strict=True)
            if spec.resize == "restart"
        )
        for run in (mixed, uniform)
    ]
    if policy == "deepboot":
        # Cold delays of 18-35 s against DeepBoot's 10 s delta: its restart jobs are
        # resized less often when the policy sees their cost.
        assert restarts[0] < restarts[1]
    else:
        # The marked jobs' cold delays (24 and 18 s) are below Pollux's 30 s, the least
        # it charges any job: the same run.
        assert mixed == uniform
    # Every restart job's changes cost its cold delay whatever the policy weighs.
    cold = {j.name: AfeRestartCost().delays(j.application).cold for j in marked.training}
    for (name, _, _, restarts, restart_s), spec in zip(uniform, marked.training, strict=True):
        if spec.resize == "restart":
            assert restart_s == pytest.approx(cold[name] * (restarts + 1))
