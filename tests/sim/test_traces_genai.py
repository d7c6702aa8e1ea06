"""The Alibaba GenAI loader (deepboot.sim.traces.genai) on files the tests write, and on
the real trace when ../shared/traces is present."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from trace_files import (
    GENAI_DIR,
    LOAD_HEADER,
    day_of_requests,
    genai_file,
    genai_row,
    loads_file,
    write,
)

from deepboot.core.errors import ConfigError, InputError
from deepboot.core.servicefile import dump_services, load_services
from deepboot.sim.traces.common import GENAI_SOURCE
from deepboot.sim.traces.genai import (
    MIN_DURATION_S,
    GenaiConfig,
    Status,
    Window,
    genai_stream,
    read_load_latencies,
    read_requests,
)


def stream(path: Path, **config: object) -> object:
    cold = config.pop("cold_start_s", 10.0)
    conf = GenaiConfig(cold_start_s=cold, **config)  # type: ignore[arg-type]
    return genai_stream(read_requests(path), conf, np.random.default_rng(0))


def test_every_status_is_read() -> None:
    assert {s.value for s in Status} == {"SUCCEED", "FAILED", "PENDING", "PROCESSING"}


@pytest.mark.parametrize(
    ("drop_failed", "kept_statuses"),
    [(False, {"SUCCEED", "FAILED", "PROCESSING"}), (True, {"SUCCEED", "PROCESSING"})],
    ids=["failed-kept", "failed-dropped"],
)
def test_rows_by_status(tmp_path: Path, drop_failed: bool, kept_statuses: set[str]) -> None:
    rows = [
        genai_row("2024-11-15 00:00:00", "SUCCEED", "20.0", "A"),
        genai_row("2024-11-15 00:00:10", "FAILED", "3.0", "A"),
        genai_row("2024-11-15 00:00:20", "PENDING", "0.0", "A"),
        genai_row("2024-11-15 00:00:30", "PROCESSING", "40.0", "A"),
    ]
    s = stream(genai_file(tmp_path / "t.csv", rows), drop_failed=drop_failed)
    durations = {"SUCCEED": 20.0, "FAILED": 3.0, "PROCESSING": 40.0}
    assert sorted(r.duration for r in s.requests) == sorted(durations[k] for k in kept_statuses)
    failed = "dropped" if drop_failed else "kept"
    assert f"1 FAILED {failed}" in s.summary
    assert "1 PENDING dropped" in s.summary and "1 PROCESSING kept" in s.summary


def test_empty_model_dropped_and_zero_duration_set_to_the_minimum(tmp_path: Path) -> None:
    rows = [
        genai_row("2024-11-15 00:00:00", "SUCCEED", "0.0", "A"),
        genai_row("2024-11-15 00:00:05", "SUCCEED", "12.0", ""),
        genai_row("2024-11-15 00:00:09", "SUCCEED", "7.0", "A"),
    ]
    s = stream(genai_file(tmp_path / "t.csv", rows))
    assert [(r.time, r.duration) for r in s.requests] == [(0.0, MIN_DURATION_S), (9.0, 7.0)]
    assert "1 more without a model dropped" in s.summary
    assert f"1 zero durations set to {MIN_DURATION_S:g} s" in s.summary


def test_busiest_window_slides_over_arrivals_and_times_are_compressed(tmp_path: Path) -> None:
    s = stream(
        day_of_requests(tmp_path / "t.csv"),
        window=Window(busiest_hours=2),
        compress=4,
    )
    # The burst starts at 2024-11-16 10:00:00: the window starts at that arrival.
    assert "2024-11-16 10:00:00 + 2 h (busiest)" in s.summary
    assert s.requests[0].time == 0
    assert [r.time for r in s.requests[:3]] == [0, 30, 60]  # 2 minutes / 4
    assert s.requests[-1].time == 63 * 60 / 4  # PROCESSING at 11:03, within 2 h
    assert len(s.requests) == 30 + 2  # burst, FAILED, PROCESSING (PENDING dropped)


def test_busiest_window_ties_go_to_the_earliest(tmp_path: Path) -> None:
    rows = [genai_row(f"2024-11-15 0{h}:00:00", model="A") for h in (1, 3, 5)]
    s = stream(genai_file(tmp_path / "t.csv", rows), window=Window(busiest_hours=1))
    assert "2024-11-15 01:00:00 + 1 h (busiest)" in s.summary
    assert len(s.requests) == 1


def test_window_from_a_start_for_some_hours(tmp_path: Path) -> None:
    start = (np.datetime64("2024-11-16T10:10:00") - np.datetime64("1970-01-01")) / np.timedelta64(
        1, "s"
    )
    s = stream(day_of_requests(tmp_path / "t.csv"), window=Window(start=float(start), hours=0.25))
    assert [r.time for r in s.requests] == [0, 120, 240, 360, 480, 600, 720, 840]


def test_top_models_and_the_merged_rest(tmp_path: Path) -> None:
    rows = [genai_row(f"2024-11-15 00:00:{i:02d}", model="big") for i in range(5)]
    rows += [genai_row(f"2024-11-15 00:01:{i:02d}", model="mid") for i in range(3)]
    rows += [genai_row("2024-11-15 00:02:00", model=m) for m in ("x1", "x2")]
    s = stream(genai_file(tmp_path / "t.csv", rows), top=2)
    assert [spec.name for spec in s.services] == ["big", "mid", "other"]
    assert sum(r.service == "other" for r in s.requests) == 2
    merged = next(n for n in s.notes if "merges" in n)
    assert "cold starts are hidden" in merged and "x1, x2" in merged


@pytest.mark.parametrize(
    ("models", "names"),
    [
        (["M 1/a"], ["M_1_a"]),
        (["_lead"], ["m_lead"]),
        (["a b", "a/b"], ["a_b", "a_b-2"]),
        (["x" * 80], ["x" * 63]),
        (["émodel"], ["m_model"]),
    ],
    ids=["spaces-slash", "leading-underscore", "collision", "too-long", "not-ascii"],
)
def test_model_ids_become_valid_unique_service_names(
    tmp_path: Path, models: list[str], names: list[str]
) -> None:
    rows = [
        genai_row(f"2024-11-15 00:00:{i:02d}", model=m)
        for i, m in enumerate(models * 2 + models[:1])  # the first model is the busiest
    ]
    s = stream(genai_file(tmp_path / "t.csv", rows))
    assert [spec.name for spec in s.services] == names
    assert [spec.model for spec in s.services] == models
    for name, model in zip(names, models, strict=True):
        assert f"service {name!r} is checkpoint_model_version_id {model!r}" in s.notes


def test_a_kept_model_called_other_does_not_take_the_merged_name(tmp_path: Path) -> None:
    rows = [genai_row(f"2024-11-15 00:00:{i:02d}", model="other") for i in range(3)]
    rows += [genai_row("2024-11-15 00:01:00", model="small")]
    s = stream(genai_file(tmp_path / "t.csv", rows), top=1)
    assert [spec.name for spec in s.services] == ["other", "other-2"]


def test_cold_starts_drawn_from_the_loads_by_seed(tmp_path: Path) -> None:
    trace = read_requests(day_of_requests(tmp_path / "t.csv"))
    loads = read_load_latencies(loads_file(tmp_path / "l.csv", [1000.0, 2500.0, 40000.0]))
    assert loads == [1.0, 2.5, 40.0]

    def colds(seed: int) -> list[float | None]:
        s = genai_stream(trace, GenaiConfig(), np.random.default_rng(seed), loads)
        return [spec.cold_start_s for spec in s.services]

    assert colds(1) == colds(1)
    assert set(colds(1)) <= {1.0, 2.5, 40.0}
    assert any(colds(1) != colds(seed) for seed in range(2, 6))
    with pytest.raises(ConfigError, match="cold start"):
        genai_stream(trace, GenaiConfig(), np.random.default_rng(0), None)


def test_the_services_file_round_trips_with_its_credit(tmp_path: Path) -> None:
    s = stream(day_of_requests(tmp_path / "t.csv"), top=2)
    assert s.notes[0] == GENAI_SOURCE and "CC-BY-4.0" in s.summary
    path = tmp_path / "s.toml"
    path.write_text(dump_services(s.services, s.notes), encoding="utf-8")
    assert load_services(path) == s.services
    assert path.read_text().startswith(f"# {GENAI_SOURCE}\n")


@pytest.mark.parametrize(
    ("row", "column", "words"),
    [
        (genai_row("15/11/2024 00:00"), "gmt_create", "date and time"),
        (genai_row("2024-11-15 00:00:00+08:00"), "gmt_create", "without a zone"),
        (genai_row("2024-11-15 00:00:00", "DONE"), "predict_status", "SUCCEED"),
        (genai_row("2024-11-15 00:00:00", exec_s="-1"), "exec_time_seconds", "[0, 1e+06]"),
        (genai_row("2024-11-15 00:00:00", exec_s="nan"), "exec_time_seconds", "[0"),
        (genai_row("2024-11-15 00:00:00", exec_s=""), "exec_time_seconds", "not a number"),
        (genai_row("2024-11-15 00:00:00", model="M" * 201), "checkpoint_model_version_id", "200"),
        ("2024-11-15 00:00:00,TXT_2_IMG,SUCCEED", "exec_time_seconds", "3 values"),
        (genai_row("2024-11-15 00:00:00") + ",9", "num_lora", "extra"),
    ],
    ids=[
        "bad-time",
        "zone",
        "bad-status",
        "negative-exec",
        "nan-exec",
        "empty-exec",
        "long-model",
        "short-row",
        "long-row",
    ],
)
def test_bad_rows_name_the_line_and_column(
    tmp_path: Path, row: str, column: str, words: str
) -> None:
    path = genai_file(tmp_path / "t.csv", [genai_row("2024-11-15 00:00:00"), "", row])
    with pytest.raises(InputError) as info:
        read_requests(path)
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), 4, column)
    assert words in err.message


@pytest.mark.parametrize(
    ("text", "line", "column"),
    [
        ("", 1, "header"),
        ("gmt_create,predict_status,exec_time_seconds\n", 1, "checkpoint_model_version_id"),
        (LOAD_HEADER + "\n", 1, "gmt_create"),
    ],
    ids=["empty", "header-lacks-model", "another-file"],
)
def test_bad_files(tmp_path: Path, text: str, line: int, column: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as info:
        read_requests(path)
    assert (info.value.line, info.value.field) == (line, column)


def test_bad_load_rows(tmp_path: Path) -> None:
    path = write(tmp_path / "l.csv", LOAD_HEADER, ["1,2000,c", "2,-5,c"])
    with pytest.raises(InputError) as info:
        read_load_latencies(path)
    assert (info.value.line, info.value.field) == (3, "value")


def test_nothing_left_is_a_config_error(tmp_path: Path) -> None:
    path = genai_file(tmp_path / "t.csv", [genai_row("2024-11-15 00:00:00", "PENDING", "0")])
    with pytest.raises(ConfigError, match="no request is left"):
        stream(path)
    with pytest.raises(ConfigError, match="no request arrives"):
        stream(day_of_requests(tmp_path / "d.csv"), window=Window(start=0.0, hours=1))


@pytest.mark.skipif(not GENAI_DIR.is_dir(), reason="../shared/traces is not present")
def test_the_real_trace() -> None:
    trace = read_requests(GENAI_DIR / "lora_request_trace.csv")
    loads = read_load_latencies(GENAI_DIR / "basemodel_update_latency_anon.csv")
    assert len(trace) == 26_823 and len(loads) == 7_531
    statuses = {s: sum(r.status is s for r in trace) for s in Status}
    assert statuses[Status.FAILED] == 398 and statuses[Status.PENDING] == 30
    assert sum(not r.model for r in trace) == 25
    assert all(r.status is Status.PENDING for r in trace if not r.model or r.exec_s == 0)
    config = GenaiConfig(window=Window(busiest_hours=24), compress=3, top=10)
    s = genai_stream(trace, config, np.random.default_rng(1), loads)
    assert len(s.services) == 11 and s.services[-1].name == "other"
    assert all(0 <= r.time < 8 * 3600 for r in s.requests)
    assert "0 zero durations" in s.summary
