"""The Azure LLM loader (deepboot.sim.traces.azure_llm) and the QPS rate shape
(deepboot.sim.traces.rateshape) on files the tests write, and on the real traces when
../shared/traces is present."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from trace_files import AZURE_DIR, GENAI_DIR, azure_file, qps_file

from deepboot.core.errors import ConfigError, InputError
from deepboot.runtime.client.rateprofile import RateProfile
from deepboot.sim.traces.azure_llm import (
    AzureConfig,
    CostModel,
    azure_stream,
    read_requests,
    tile_period,
)
from deepboot.sim.traces.common import AZURE_SOURCE
from deepboot.sim.traces.rateshape import rate_shape, read_qps, write_profile

TRACE = [
    ("2023-11-16 18:00:00.5000000", 100, 10),
    ("2023-11-16 18:00:01.0000000", 2000, 200),
    ("2023-11-16 18:10:00.0000000", 0, 1),
    ("2023-11-16 18:30:00.2500000", 50, 0),
    ("2023-11-16 18:59:30.5000000", 10, 5),
]


def azure(tmp_path: Path, **config: object) -> object:
    trace = read_requests(azure_file(tmp_path / "conv.csv", TRACE))
    return azure_stream(trace, AzureConfig(**config), np.random.default_rng(0))  # type: ignore[arg-type]


def test_durations_follow_the_cost_model(tmp_path: Path) -> None:
    cost = CostModel(prefill_s_per_token=0.001, decode_s_per_token=0.02, overhead_s=0.5)
    s = azure(tmp_path, cost=cost)
    expected = [0.5 + 0.001 * c + 0.02 * g for _, c, g in TRACE]
    assert [r.duration for r in s.requests] == pytest.approx(expected)
    assert [r.time for r in s.requests] == pytest.approx([0, 0.5, 599.5, 1799.75, 3570])
    (spec,) = s.services
    assert (spec.name, spec.concurrency, spec.cold_start_s) == ("llm-conv", 8, 20.0)
    assert s.notes[0] == AZURE_SOURCE and AZURE_SOURCE in s.summary


def test_zero_costs_give_the_minimum_duration(tmp_path: Path) -> None:
    s = azure(tmp_path, cost=CostModel(0, 0, 0))
    assert all(r.duration == 0.001 for r in s.requests)
    assert "5 zero durations" in s.summary


def test_tiles_rotate_the_trace_by_seeded_shifts(tmp_path: Path) -> None:
    trace = read_requests(azure_file(tmp_path / "conv.csv", TRACE))
    period = tile_period([r.arrival for r in trace])
    assert period == pytest.approx(3570 * 5 / 4)

    def times(seed: int) -> list[float]:
        s = azure_stream(trace, AzureConfig(hours=3), np.random.default_rng(seed))
        return [r.time for r in s.requests]

    first = times(0)
    assert first == times(0) and first != times(1)
    assert first[:5] == pytest.approx([0, 0.5, 599.5, 1799.75, 3570])
    tiles = [sum(k * period <= t < (k + 1) * period for t in first) for k in range(3)]
    assert tiles == [5, 5, len(first) - 10]  # the third tile is cut at 3 h
    assert all(t < 3 * 3600 for t in first) and first == sorted(first)


def test_the_cap_keeps_the_earliest_and_says_so(tmp_path: Path) -> None:
    s = azure(tmp_path, hours=10, max_requests=7)
    assert len(s.requests) == 7
    assert "CAPPED at --max-requests 7" in s.summary and "of the 10 h asked" in s.summary
    uncapped = azure(tmp_path, hours=10)
    assert s.requests == uncapped.requests[:7]


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("2023-11-16 18:00:00,x,1", "ContextTokens"),
        ("2023-11-16 18:00:00,1,-1", "GeneratedTokens"),
        ("2023-11-16 18:00:00,1.5,1", "ContextTokens"),
        ("2023-11-16 18:00:00,1,10000001", "GeneratedTokens"),
        ("18:00 16/11/2023,1,1", "TIMESTAMP"),
        ("2023-11-16 18:00:00,1", "GeneratedTokens"),
    ],
    ids=["text", "negative", "fraction", "too-many", "bad-time", "short"],
)
def test_bad_azure_rows(tmp_path: Path, row: str, column: str) -> None:
    path = tmp_path / "conv.csv"
    path.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n{row}\n", encoding="utf-8")
    with pytest.raises(InputError) as info:
        read_requests(path)
    assert (info.value.path, info.value.line, info.value.field) == (str(path), 2, column)


def test_azure_config_ranges() -> None:
    for bad in ({"concurrency": 0}, {"service": "a b"}, {"hours": 0.0}, {"cold_start_s": -1.0}):
        with pytest.raises(ConfigError):
            AzureConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        CostModel(decode_s_per_token=-0.1)


@pytest.mark.skipif(not AZURE_DIR.is_dir(), reason="../shared/traces is not present")
def test_the_real_azure_trace() -> None:
    trace = read_requests(AZURE_DIR / "AzureLLMInferenceTrace_conv.csv")
    assert len(trace) == 19_366
    s = azure_stream(trace, AzureConfig(), np.random.default_rng(0))
    mean = sum(r.duration for r in s.requests) / len(s.requests)
    assert 2.0 < mean < 3.5  # the documented ~2.7 s
    capped = azure_stream(trace, AzureConfig(hours=24), np.random.default_rng(0))
    assert len(capped.requests) == 200_000 and "CAPPED" in capped.summary


# ------------------------------------------------------------------ rate shape

GEN, API = "Generative Requests", "API Requests"


def samples(tmp_path: Path) -> Path:
    rows = [(1000.0 + 10 * i, 1.0, GEN) for i in range(60)]  # 6 per 60 s window
    rows += [(1000.0 + 120 + 10 * i, 2.0, GEN) for i in range(6)]  # window 2 busier
    rows += [(1000.0 + 30, 5.0, API), (1000.0 + 605, 9.0, GEN)]  # last: partial window
    return qps_file(tmp_path / "qps.csv", rows)


def test_rate_shape_sums_windows_and_scales_the_peak(tmp_path: Path) -> None:
    shape = rate_shape(read_qps(samples(tmp_path), GEN), peak_rps=9.0, window_s=60)
    assert len(shape.rates) == 10  # 605 s of samples: 10 whole windows
    assert shape.rates[2] == 9.0
    assert shape.rates[0] == pytest.approx(9.0 * 6 / 18)
    assert shape.times == tuple(60.0 * j for j in range(11))
    assert shape.left_out_s == 5.0
    path = tmp_path / "profile.csv"
    write_profile(path, shape)
    profile = RateProfile.load(path)  # the layout 'deepboot load' reads
    assert profile.duration == 600
    assert profile.expected_requests() == pytest.approx(shape.expected_requests())
    assert path.read_text().splitlines()[-1] == "600,0"
    assert "CC-BY-4.0" in shape.summary()


def test_rate_shape_all_types_and_compression(tmp_path: Path) -> None:
    qps = read_qps(samples(tmp_path))
    assert qps.types == {GEN: 67, API: 1}
    shape = rate_shape(qps, peak_rps=1.0, window_s=60, compress=6)
    assert shape.times[1] == 10.0 and max(shape.rates) == 1.0
    assert shape.rates[0] == pytest.approx(11 / 18)  # the API sample counts too


def test_rate_shape_refusals(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'Generative Requests' \\(67\\)"):
        read_qps(samples(tmp_path), "Nope")
    qps = read_qps(samples(tmp_path))
    with pytest.raises(ConfigError, match="less than one window"):
        rate_shape(qps, 1.0, 3600)
    with pytest.raises(ConfigError, match="at least 1 s"):
        rate_shape(qps, 1.0, 60, compress=100)
    with pytest.raises(ConfigError, match="peak"):
        rate_shape(qps, math.nan, 60)
    zero = read_qps(qps_file(tmp_path / "z.csv", [(0, 0.0, GEN), (100, 0.0, GEN)]))
    with pytest.raises(ConfigError, match="sum to 0"):
        rate_shape(zero, 1.0, 10)


@pytest.mark.parametrize(
    ("row", "column"),
    [("x,1,c,GEN", "timestamp_anon"), ("1,-1,c,GEN", "value"), ("1,inf,c,GEN", "value")],
    ids=["bad-time", "negative", "infinite"],
)
def test_bad_qps_rows(tmp_path: Path, row: str, column: str) -> None:
    path = tmp_path / "qps.csv"
    path.write_text(f"timestamp_anon,value,container_ip,request_type\n1,1,c,GEN\n{row}\n")
    with pytest.raises(InputError) as info:
        read_qps(path)
    assert (info.value.line, info.value.field) == (3, column)


@pytest.mark.skipif(not GENAI_DIR.is_dir(), reason="../shared/traces is not present")
def test_the_real_qps_shape() -> None:
    shape = rate_shape(read_qps(GENAI_DIR / "qps.csv"), peak_rps=20, window_s=600)
    assert len(shape.rates) == 133 and max(shape.rates) == 20
    assert 24_000 < shape.samples < 24_627
