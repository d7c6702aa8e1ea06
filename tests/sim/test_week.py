"""A week of a large cluster (``deepboot.sim.week``, ``deepboot workload week``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from deepboot.cli.main import main as cli
from deepboot.core.errors import ConfigError
from deepboot.perf.apps import load_apps
from deepboot.sim.philly import JobConfig, read_philly
from deepboot.sim.week import WeekConfig, busiest_days, nominal_gpu_seconds, training_week
from deepboot.sim.workload import load_workload

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
GENAI = TRACES / "inference" / "alibaba-genai-2026"
needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces is absent")


def test_a_request_on_more_gpus_costs_more_gpu_seconds_for_a_job_that_scales_poorly() -> None:
    app = load_apps()["cifar10"]
    one = nominal_gpu_seconds(app, JobConfig(1, 128), node_gpus=4)
    eight = nominal_gpu_seconds(app, JobConfig(8, 128), node_gpus=4)
    assert 0 < one < eight


def test_the_busiest_days_are_found_by_whole_days() -> None:
    from datetime import datetime, timedelta

    day0 = datetime(2017, 10, 1, 5)
    times = [
        day0 + timedelta(days=d, hours=h) for d, n in ((0, 1), (2, 5), (3, 4)) for h in range(n)
    ]
    assert busiest_days(times, 2) == datetime(2017, 10, 3)
    assert busiest_days(times, 30) == datetime(2017, 10, 1)
    with pytest.raises(ConfigError):
        busiest_days([], 1)


def test_bad_knobs_are_refused() -> None:
    for bad in ({"days": 0}, {"load": 0.0}, {"load": 5.0}, {"training_gpus": 0}):
        with pytest.raises(ConfigError):
            WeekConfig(**bad)  # type: ignore[arg-type]


@needs_traces
def test_a_week_reaches_its_load_within_its_days_and_repeats_by_seed() -> None:
    trace = read_philly(TRACES / "philly.csv")
    apps = load_apps()
    cfg = WeekConfig(days=2, training_gpus=64, load=0.5)
    week = training_week(trace, apps, cfg, np.random.default_rng(3))
    assert 0.5 <= week.load < 0.52
    times = [j.submit_time for j in week.jobs]
    assert times == sorted(times) and times[0] >= 0 and times[-1] < 2 * 86_400
    assert week.capacity_gpu_hours == 64 * 48
    again = training_week(trace, apps, cfg, np.random.default_rng(3))
    assert again.jobs == week.jobs
    total = sum(
        nominal_gpu_seconds(apps[j.application], JobConfig(j.num_replicas, j.batch_size), 4)
        for j in week.jobs
    )
    assert total / 3600 == pytest.approx(week.nominal_gpu_hours)


@needs_traces
def test_the_command_writes_a_loadable_week_and_counts_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "w.csv"
    code = cli(
        [
            "workload", "week", "--philly", str(TRACES / "philly.csv"),
            "--genai", str(GENAI / "lora_request_trace.csv"),
            "--load-latency", str(GENAI / "basemodel_update_latency_anon.csv"),
            "--cluster", "8x4", "--inference-nodes", "4", "--days", "1", "--load", "0.3",
            "--peak-busy", "0.5", "--seed", "2", "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    said = capsys.readouterr().out
    assert "training:" in said and "inference:" in said and "requests" in said
    apps = load_apps()
    from deepboot.sim.services import read_services_file

    services = read_services_file(out.with_suffix(".toml"))
    workload = load_workload(out, apps.keys(), {n: a.limits for n, a in apps.items()}, services)
    assert workload.training and workload.inference
    assert all(s.model_gb == 28.0 for s in services.specs.values())


def test_the_command_names_a_bad_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli(
        ["workload", "week", "--philly", "a.csv", "--genai", "b.csv", "--load-latency", "c.csv",
         "--days", "40", "--out", str(tmp_path / "w.csv")]
    )  # fmt: skip
    assert code != 0
    assert "--days" in capsys.readouterr().err
