"""Composing a training workload with inference streams (deepboot.sim.traces.compose) and
the busy fraction it scales to (deepboot.sim.traces.common.window_gpu_seconds)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepboot.core.errors import ConfigError, InputError
from deepboot.core.service import ServiceSpec
from deepboot.core.servicefile import dump_services
from deepboot.sim.traces.common import (
    GENAI_SOURCE,
    Busy,
    Request,
    request_rows,
    window_gpu_seconds,
    write_rows,
)
from deepboot.sim.traces.compose import (
    ComposeConfig,
    Stream,
    compose,
    read_stream,
    read_training,
)
from deepboot.sim.workload import DEEPBOOT_COLUMNS, POLLUX_COLUMNS

# ------------------------------------------------------------------ busy GPU-seconds


def brute_force(
    starts: list[float], durations: list[float], shares: list[float], w: float
) -> list[float]:
    end = max(s + d for s, d in zip(starts, durations, strict=True))
    windows = max(1, int(np.ceil(end / w)))
    return [
        sum(
            max(0.0, min(s + d, (j + 1) * w) - max(s, j * w)) * c
            for s, d, c in zip(starts, durations, shares, strict=True)
        )
        for j in range(windows)
    ]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    runs=st.lists(
        st.tuples(
            st.integers(0, 4000).map(lambda x: x / 4),  # quarter seconds: exact edges too
            st.integers(0, 3000).map(lambda x: x / 4),
            st.sampled_from([1.0, 0.5, 0.125]),
        ),
        min_size=1,
        max_size=30,
    ),
    window=st.sampled_from([10.0, 60.0, 600.0]),
)
def test_window_gpu_seconds_is_the_overlap_of_each_run(
    runs: list[tuple[float, float, float]], window: float
) -> None:
    starts, durations, shares = (list(x) for x in zip(*runs, strict=True))
    got = window_gpu_seconds(np.array(starts), np.array(durations), np.array(shares), 0.0, window)
    want = brute_force(starts, durations, shares, window)
    n = min(len(got), len(want))
    assert got[:n] == pytest.approx(want[:n], abs=1e-9)
    assert all(x == pytest.approx(0, abs=1e-9) for x in [*got[n:], *want[n:]])


def test_busy_fractions() -> None:
    busy = Busy.of(np.array([60.0, 240.0, 0.0]), window_s=60, gpus=4)
    assert (busy.peak, busy.mean, busy.peak_window, busy.windows) == (1.0, 300 / 720, 1, 3)


# ------------------------------------------------------------------ files


def training_file(path: Path, rows: list[str], header: tuple[str, ...] = POLLUX_COLUMNS) -> Path:
    path.write_text("\n".join([",".join(header), *rows]) + "\n", encoding="utf-8")
    return path


def stream_files(
    tmp: Path, stem: str, specs: list[ServiceSpec], requests: list[Request]
) -> tuple[Path, Path]:
    csv_path, toml_path = tmp / f"{stem}.csv", tmp / f"{stem}.toml"
    write_rows(csv_path, request_rows(requests))
    toml_path.write_text(dump_services(specs, [GENAI_SOURCE, "a note"]), encoding="utf-8")
    return csv_path, toml_path


def a_stream(tmp: Path, stem: str = "s", prefix: str = "", n: int = 60) -> Stream:
    specs = [
        ServiceSpec(f"{prefix}a", "A", cold_start_s=5.0),
        ServiceSpec(f"{prefix}b", "B", cold_start_s=5.0, concurrency=2),
    ]
    requests = [Request(100.0 + 30 * i, specs[i % 2].name, 20.0 + i % 7) for i in range(n)]
    csv_path, toml_path = stream_files(tmp, stem, specs, requests)
    return read_stream(csv_path, specs, toml_path)


TRAINING = ["cifar10-0,50,cifar10,6,2048", "ncf-1,70,ncf,1,32768", "bert-2,900,bert,8,384"]


def test_streams_start_with_the_first_training_job(tmp_path: Path) -> None:
    training = read_training(training_file(tmp_path / "t.csv", TRAINING))
    stream = a_stream(tmp_path)
    result = compose(training, [stream], ComposeConfig(8), np.random.default_rng(0))
    assert result.scale == 1.0
    infer = [row for row in result.rows if row[2].startswith("infer-")]
    assert len(infer) == len(stream.requests)
    assert [float(row[1]) for row in infer][:3] == [50.0, 80.0, 110.0]
    assert result.rows[0][0] == "cifar10-0"  # training first at equal times
    assert all(len(row) == len(DEEPBOOT_COLUMNS) for row in result.rows)
    assert result.notes[0] == GENAI_SOURCE and "s.toml: a note" in result.notes
    assert GENAI_SOURCE in result.summary


@pytest.mark.parametrize("target", [0.05, 0.2, 0.9], ids=["thin", "near", "replicate"])
def test_scaling_reaches_the_target_peak(tmp_path: Path, target: float) -> None:
    training = read_training(training_file(tmp_path / "t.csv", TRAINING))
    stream = a_stream(tmp_path, n=200)
    config = ComposeConfig(4, peak_busy=target, window_s=600)
    result = compose(training, [stream], config, np.random.default_rng(3))
    # One request moves a window by at most 27 s / (600 s x 4 GPUs).
    assert result.busy.peak == pytest.approx(target, abs=27 / 2400 + 1e-9)
    n = sum(row[2].startswith("infer-") for row in result.rows)
    assert (n < 200) if target == 0.05 else (n > 200 if target == 0.9 else True)
    again = compose(training, [stream], config, np.random.default_rng(3))
    assert again.rows == result.rows
    other = compose(training, [stream], config, np.random.default_rng(4))
    assert other.rows != result.rows


def test_clashing_service_names_are_refused(tmp_path: Path) -> None:
    training = read_training(training_file(tmp_path / "t.csv", TRAINING))
    one, two = a_stream(tmp_path, "one"), a_stream(tmp_path, "two")
    with pytest.raises(ConfigError, match="'a' is in both .*one.toml and .*two.toml"):
        compose(training, [one, two], ComposeConfig(8), np.random.default_rng(0))
    three = a_stream(tmp_path, "three", prefix="x-")
    result = compose(training, [one, three], ComposeConfig(8), np.random.default_rng(0))
    assert [s.name for s in result.services] == ["a", "b", "x-a", "x-b"]


def test_the_request_cap(tmp_path: Path) -> None:
    training = read_training(training_file(tmp_path / "t.csv", TRAINING))
    config = ComposeConfig(1, peak_busy=4.0, max_requests=100)
    with pytest.raises(ConfigError, match="--max-requests"):
        compose(training, [a_stream(tmp_path)], config, np.random.default_rng(0))


def test_training_file_inference_rows_are_dropped(tmp_path: Path) -> None:
    rows = [f"{r},-1,-1" for r in TRAINING] + ["inference-1,60,infer-bert-1,1,1,4.0,5"]
    training = read_training(training_file(tmp_path / "t.csv", rows, DEEPBOOT_COLUMNS))
    assert len(training.rows) == 3 and training.inference_rows == 1
    result = compose(training, [a_stream(tmp_path)], ComposeConfig(8), np.random.default_rng(0))
    assert "1 inference rows of the training file dropped" in result.summary


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("x,1,cifar10,0,2048", "num_replicas"),
        ("x,1,cifar10,6,1.5", "batch_size"),
        ("x,-1,cifar10,6,2048", "time"),
        ("cifar10-0,1,cifar10,6,2048", "name"),
        ("x,1,,6,2048", "application"),
    ],
    ids=["zero-replicas", "fraction-batch", "negative-time", "duplicate-name", "no-app"],
)
def test_bad_training_rows(tmp_path: Path, row: str, column: str) -> None:
    path = training_file(tmp_path / "t.csv", [TRAINING[0], row])
    with pytest.raises(InputError) as info:
        read_training(path)
    assert (info.value.path, info.value.line, info.value.field) == (str(path), 3, column)


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("q,1,infer-zzz,1,1,3,1", "application"),
        ("q,1,a,1,1,3,1", "application"),
        ("q,1,infer-a,2,1,3,1", "num_replicas"),
        ("q,1,infer-a,1,1,0,1", "duration"),
        ("q,x,infer-a,1,1,3,1", "time"),
    ],
    ids=["unknown-service", "training-row", "two-gpus", "zero-duration", "bad-time"],
)
def test_bad_stream_rows(tmp_path: Path, row: str, column: str) -> None:
    path = tmp_path / "s.csv"
    path.write_text(",".join(DEEPBOOT_COLUMNS) + "\nq0,0,infer-a,1,1,3,1\n" + row + "\n")
    specs = [ServiceSpec("a", "A", cold_start_s=1.0)]
    with pytest.raises(InputError) as info:
        read_stream(path, specs, tmp_path / "missing.toml")
    assert (info.value.line, info.value.field) == (3, column)


def test_composed_files_load_in_the_simulator(tmp_path: Path) -> None:
    services_mod = pytest.importorskip("deepboot.sim.services")
    from deepboot.perf.catalog import load_catalog
    from deepboot.sim.workload import load_workload

    training = read_training(training_file(tmp_path / "t.csv", TRAINING))
    result = compose(
        training, [a_stream(tmp_path)], ComposeConfig(8, peak_busy=0.3), np.random.default_rng(0)
    )
    out, services = tmp_path / "w.csv", tmp_path / "w.toml"
    write_rows(out, result.rows)
    services.write_text(dump_services(result.services, result.notes), encoding="utf-8")
    apps = load_catalog()
    workload = load_workload(
        out, apps.keys(), {n: a.limits for n, a in apps.items()},
        services_mod.read_services_file(services),
    )  # fmt: skip
    assert len(workload.training) == 3
    assert len(workload.inference) == sum(r[2].startswith("infer-") for r in result.rows)


# ------------------------------------------------------------------ the copies' delays


def copies_by_request(
    tmp: Path, times: list[float], config: ComposeConfig, seed: int = 0
) -> dict[int, list[float]]:
    """Compose a one-service stream whose request ``i`` arrives at ``times[i]`` and runs
    ``10 + i`` s (its duration names it), and give each request's arrivals, every copy
    and the original, measured from the first training job (50 s)."""
    specs = [ServiceSpec("a", "A", cold_start_s=5.0)]
    requests = [Request(t, "a", 10.0 + i) for i, t in enumerate(times)]
    csv_path, toml_path = stream_files(tmp, "gaps", specs, requests)
    training = read_training(training_file(tmp / "t.csv", TRAINING))
    result = compose(
        training, [read_stream(csv_path, specs, toml_path)], config, np.random.default_rng(seed)
    )
    arrivals: dict[int, list[float]] = {i: [] for i in range(len(times))}
    for row in result.rows:
        if row[2].startswith("infer-"):
            arrivals[round(float(row[5])) - 10].append(float(row[1]) - 50.0)
    return arrivals


@pytest.mark.parametrize(
    "times",
    [[0.0, 100.0, 200.0], [300.0, 310.0, 460.0, 475.0, 900.0, 1210.0]],
    ids=["three-100s-apart", "irregular"],
)
def test_copies_arrive_within_the_mean_gap_of_n_minus_1_gaps(
    tmp_path: Path, times: list[float]
) -> None:
    gap = (times[-1] - times[0]) / (len(times) - 1)  # 100 s for three 100 s apart, not 66.7
    config = ComposeConfig(1, peak_busy=0.6, window_s=3600)
    arrivals = copies_by_request(tmp_path, times, config)
    for i, got in arrivals.items():
        start = times[i] - times[0]
        delays = sorted(a - start for a in got)
        assert len(delays) >= 8  # replicated about 10 times
        assert delays[0] == 0.0 and all(0 < d < gap for d in delays[1:])  # original first
        # Copy k >= 1 is delayed by gap x frac(w + k x golden): the delays over the gap
        # are a Weyl set for some w (so they use this gap, not (last - first) / n), and
        # spread over it (a golden Weyl set of 8+ points leaves no hole of a third).
        golden = (5**0.5 - 1) / 2
        fractions = sorted(d / gap for d in delays[1:])
        candidates = (
            sorted((w + k * golden) % 1.0 for k in range(1, len(fractions) + 1))
            for w in ((f - golden) % 1.0 for f in fractions)
        )
        assert any(c == pytest.approx(fractions, abs=1e-4) for c in candidates)
        assert fractions[-1] > 2 / 3


def test_a_stream_arriving_at_once_spreads_its_copies_over_a_window(tmp_path: Path) -> None:
    config = ComposeConfig(1, peak_busy=0.5, window_s=600)
    arrivals = copies_by_request(tmp_path, [500.0, 500.0, 500.0], config)
    every = [a for got in arrivals.values() for a in got]
    assert len(every) > 3 * 8  # replicated
    assert all(0.0 <= a < 600 for a in every)  # within the window
    assert len(set(every)) > len(every) - 3  # no synchronised duplicates (originals aside)
    for got in arrivals.values():
        assert got.count(0.0) == 1 and max(got) > 300  # spread over the window
