"""Philly workload generator: determinism, window, model mix, errors."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from deepboot.core.errors import ConfigError, InputError
from deepboot.sim.philly import (
    PHILLY_COLUMNS,
    PHILLY_MODEL_TABLE,
    JobConfig,
    PhillyConfig,
    PhillyJob,
    busiest_start_hour,
    generate_from_jobs,
    generate_from_philly,
    read_philly,
    write_workload_csv,
)
from deepboot.sim.workload import load_workload

APPS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces is absent")
CONFIGS = {c.model: set(c.configs) for cls in PHILLY_MODEL_TABLE for c in cls.choices}


def make_job(
    clock: str = "03:00:00", gpu_hours: float = 0.5, duration: float = 600.0, line: int = 2
) -> PhillyJob:
    """A Philly row submitted on 2017-10-09 at ``clock`` with ``gpu_hours`` GPU-hours."""
    ts = datetime.fromisoformat(f"2017-10-09 {clock}")
    return PhillyJob(line, ts, duration, 1, gpu_hours * 3600, "c0")


@pytest.fixture(scope="module")
def philly() -> list[PhillyJob]:
    if not TRACES.is_dir():
        pytest.skip("../shared/traces is absent")
    return read_philly(TRACES / "philly.csv")


@needs_traces
def test_same_seed_same_workload_other_seed_differs(philly: list[PhillyJob]) -> None:
    a = generate_from_jobs(philly, 40, 8, np.random.default_rng(7))
    b = generate_from_jobs(philly, 40, 8, np.random.default_rng(7))
    c = generate_from_jobs(philly, 40, 8, np.random.default_rng(8))
    assert a == b
    assert a != c


@needs_traces
@pytest.mark.parametrize(("jobs", "hours"), [(160, 8), (24, 2), (5, 0.5)], ids=str)
def test_count_window_order_and_names(philly: list[PhillyJob], jobs: int, hours: float) -> None:
    out = generate_from_jobs(philly, jobs, hours, np.random.default_rng(1))
    assert len(out) == jobs
    times = [j.submit_time for j in out]
    assert times == sorted(times)
    assert all(0 <= t < hours * 3600 for t in times)
    assert [j.name for j in out] == [f"{j.application}-{i}" for i, j in enumerate(out)]
    for j in out:
        assert JobConfig(j.num_replicas, j.batch_size) in CONFIGS[j.application]


@needs_traces
def test_model_mix_is_plausible(philly: list[PhillyJob]) -> None:
    mix: Counter[str] = Counter()
    for seed in range(4):
        mix.update(
            j.application for j in generate_from_jobs(philly, 160, 8, np.random.default_rng(seed))
        )
    reference: Counter[str] = Counter()
    for n in range(1, 9):
        w = load_workload(TRACES / "workloads" / "pollux" / f"workload-{n}.csv", APPS)
        reference.update(j.application for j in w.training)
    assert set(mix) == set(APPS)

    def share(counts: Counter[str], *models: str) -> float:
        return sum(counts[m] for m in models) / sum(counts.values())

    # Short jobs dominate Philly; the reference workloads have ~78% cifar10+ncf.
    for models in [("cifar10", "ncf"), ("deepspeech2", "bert"), ("yolov3", "imagenet")]:
        assert abs(share(mix, *models) - share(reference, *models)) < 0.08, models
    # Within a class the two models are drawn 50/50.
    assert 0.35 < mix["ncf"] / (mix["ncf"] + mix["cifar10"]) < 0.65


@pytest.mark.parametrize(
    ("gpu_hours", "models"),
    [
        (0.2, {"cifar10", "ncf"}),
        (3.0, {"deepspeech2", "bert"}),
        (40.0, {"yolov3"}),
        (400.0, {"imagenet"}),
    ],
    ids=["under-1h", "under-10h", "under-100h", "under-1000h"],
)
def test_gpu_time_class_maps_to_models(gpu_hours: float, models: set[str]) -> None:
    trace = [make_job(f"03:{m:02d}:00", gpu_hours) for m in range(30)]
    out = generate_from_jobs(trace, 30, 1, np.random.default_rng(0), PhillyConfig(start_hour=3))
    assert {j.application for j in out} == models


def test_filters_short_and_huge_jobs_and_folds_days() -> None:
    keep = make_job("03:10:00", 0.5)
    too_short = make_job("03:20:00", 0.5, duration=30)
    too_big = make_job("03:30:00", 2000.0)
    other_day = PhillyJob(5, datetime.fromisoformat("2017-11-01 03:40:00"), 600, 1, 1800, "c")
    out_of_window = make_job("05:00:00", 0.5)
    trace = [keep, too_short, too_big, other_day, out_of_window]
    out = generate_from_jobs(trace, 2, 1, np.random.default_rng(0), PhillyConfig(start_hour=3))
    assert sorted(j.submit_time for j in out) == [600.0, 2400.0]
    with pytest.raises(ConfigError, match="only 2 Philly jobs"):
        generate_from_jobs(trace, 3, 1, np.random.default_rng(0), PhillyConfig(start_hour=3))


def test_window_wraps_around_midnight() -> None:
    trace = [make_job("23:30:00"), make_job("00:30:00"), make_job("12:00:00")]
    out = generate_from_jobs(trace, 2, 2, np.random.default_rng(0), PhillyConfig(start_hour=23))
    assert [j.submit_time for j in out] == [1800.0, 5400.0]


@pytest.mark.parametrize(
    ("clocks", "hours", "expected"),
    [
        (["07:10:00", "07:20:00", "12:00:00"], 1, 7),
        (["23:10:00", "00:20:00", "00:30:00", "12:00:00"], 2, 23),
        (["05:00:00", "17:00:00"], 1, 5),
    ],
    ids=["single-peak", "wraps-midnight", "tie-goes-to-earliest"],
)
def test_busiest_start_hour(clocks: list[str], hours: float, expected: int) -> None:
    seconds = [make_job(c).second_of_day for c in clocks]
    assert busiest_start_hour(seconds, hours) == expected


@pytest.mark.parametrize(
    ("jobs", "hours", "words"),
    [(0, 8, "--jobs"), (5, 0, "--hours"), (5, 25, "--hours")],
    ids=["zero-jobs", "zero-hours", "more-than-a-day"],
)
def test_bad_arguments(jobs: int, hours: float, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        generate_from_jobs([make_job()], jobs, hours, np.random.default_rng(0))


def test_bad_config() -> None:
    with pytest.raises(ConfigError, match="start hour"):
        PhillyConfig(start_hour=24)
    with pytest.raises(ConfigError, match="ascending"):
        PhillyConfig(table=tuple(reversed(PHILLY_MODEL_TABLE)))


def test_written_workload_loads_back(tmp_path: Path) -> None:
    trace = [make_job(f"03:{m:02d}:{m % 7:02d}", 0.1 * (m + 1) ** 2) for m in range(40)]
    jobs = generate_from_jobs(trace, 25, 1, np.random.default_rng(3), PhillyConfig(start_hour=3))
    path = tmp_path / "gen.csv"
    write_workload_csv(path, jobs)
    assert path.read_text().splitlines()[0] == "name,time,application,num_replicas,batch_size"
    assert list(load_workload(path, APPS).training) == jobs


HEADER = ",".join(PHILLY_COLUMNS)
GOOD = "2017-10-09 07:01:55,66.0,1,66.0,11cb48"
PHILLY_ERRORS = [
    ("bad-timestamp", "yesterday,66.0,1,66.0,c", "timestamp", "not a timestamp"),
    ("non-numeric-duration", "2017-10-09 07:01:55,long,1,66.0,c", "duration", "not a number"),
    ("negative-gpu-time", "2017-10-09 07:01:55,66.0,1,-1,c", "gpu_time", "non-negative"),
    ("zero-gpus", "2017-10-09 07:01:55,66.0,0,0,c", "num_gpus", "positive"),
    ("fractional-gpus", "2017-10-09 07:01:55,66.0,1.5,66,c", "num_gpus", "integer"),
    ("too-few-columns", "2017-10-09 07:01:55,66.0,1", "gpu_time", "3 values"),
    # Valid ranges (module doc of deepboot.sim.philly): refused since issue 9.
    ("duration-over-a-year", "2017-10-09 07:01:55,4e7,1,66.0,c", "duration", "365 days"),
    ("duration-1e308", "2017-10-09 07:01:55,1e308,1,66.0,c", "duration", "exceeds the limit"),
    ("gpu-time-absurd", "2017-10-09 07:01:55,66.0,1,1e300,c", "gpu_time", "exceed the limit"),
    ("gpus-absurd", "2017-10-09 07:01:55,66.0,100000,66.0,c", "num_gpus", "limit of 4096"),
    # Already refused before; kept as regressions.
    ("negative-duration", "2017-10-09 07:01:55,-5,1,66.0,c", "duration", "non-negative"),
    ("nan-duration", "2017-10-09 07:01:55,nan,1,66.0,c", "duration", "non-negative"),
    ("inf-gpu-time", "2017-10-09 07:01:55,66.0,1,inf,c", "gpu_time", "non-negative"),
    ("negative-gpus", "2017-10-09 07:01:55,66.0,-2,66.0,c", "num_gpus", "positive"),
    ("empty-gpus", "2017-10-09 07:01:55,66.0,,66.0,c", "num_gpus", "not an integer"),
]


@pytest.mark.parametrize(
    ("row", "field", "words"),
    [case[1:] for case in PHILLY_ERRORS],
    ids=[case[0] for case in PHILLY_ERRORS],
)
def test_malformed_philly_row(tmp_path: Path, row: str, field: str, words: str) -> None:
    path = tmp_path / "philly.csv"
    path.write_text(f"{HEADER}\n{GOOD}\n\n{row}\n", encoding="utf-8")
    with pytest.raises(InputError) as info:
        generate_from_philly(path, 1, 8, np.random.default_rng(0))
    assert (info.value.path, info.value.line, info.value.field) == (str(path), 4, field)
    assert words in info.value.message


@pytest.mark.parametrize(
    ("text", "words"),
    [("", "empty"), (HEADER + "\n", "no rows"), ("a,b,c\n" + GOOD + "\n", "expected header")],
    ids=["empty", "header-only", "wrong-header"],
)
def test_bad_philly_file(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "philly.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match=words) as info:
        read_philly(path)
    assert (info.value.line, info.value.field) == (1, "header")


def test_blank_lines_before_the_header_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "philly.csv"
    path.write_text(f"\n \n{HEADER}\n{GOOD}\n", encoding="utf-8")
    assert [job.line for job in read_philly(path)] == [4]
    path.write_text(f"\n\na,b\n{GOOD}\n", encoding="utf-8")
    with pytest.raises(InputError, match="expected header") as info:
        read_philly(path)
    assert (info.value.line, info.value.field) == (3, "header")


def test_missing_philly_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="file not found"):
        read_philly(tmp_path / "philly.csv")


@needs_traces
def test_shipped_demo_workload_is_our_generator_output(
    philly: list[PhillyJob], tmp_path: Path
) -> None:
    shipped = Path(__file__).resolve().parents[2] / "examples" / "demo-24.csv"
    regenerated = tmp_path / "demo-24.csv"
    write_workload_csv(regenerated, generate_from_jobs(philly, 24, 2, np.random.default_rng(1)))
    assert regenerated.read_bytes() == shipped.read_bytes()
