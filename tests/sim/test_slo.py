"""Per-request SLO accounting (deepboot.sim.slo_accounting): attainment, the worst window, and
the summary fields every run reports."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepboot.sim.metrics import InferenceRecord
from deepboot.sim.slo_accounting import met, slo_summary, worst_window


def rec(submit: float, delay: float | None, service: str = "a") -> InferenceRecord:
    start = None if delay is None else submit + delay
    return InferenceRecord(
        name=f"t{submit}",
        service=service,
        model="m",
        submit=submit,
        start=start,
        end=None if start is None else start + 1.0,
        cold=False,
        delay=delay,
    )


def test_met_is_a_start_within_the_wait_and_a_never_started_request_misses() -> None:
    assert met(rec(0.0, 1.0), 1.0)  # exactly the SLO: met
    assert not met(rec(0.0, 1.0000001), 1.0)
    assert not met(rec(0.0, None), 1e9)


def _brute_worst(submits: list[float], hits: list[bool], window: float, least: int) -> float | None:
    shares = []
    for t in submits:
        inside = [h for s, h in zip(submits, hits, strict=True) if t <= s < t + window]
        if len(inside) >= least:
            shares.append(sum(inside) / len(inside))
    return min(shares) if shares else None


@settings(max_examples=200, derandomize=True)
@given(
    st.lists(st.tuples(st.integers(0, 3000), st.booleans()), min_size=0, max_size=60).map(sorted),
    st.integers(1, 8),
)
def test_worst_window_equals_checking_every_window(
    rows: list[tuple[int, bool]], least: int
) -> None:
    submits = [float(t) for t, _ in rows]
    hits = [h for _, h in rows]
    assert worst_window(submits, hits, 600.0, least) == _brute_worst(submits, hits, 600.0, least)


def test_a_burst_of_misses_is_the_worst_window_whatever_the_grid() -> None:
    # 30 requests met, then 20 late ones 590..609 s, straddling the 600 s grid line.
    records = [rec(float(i), 0.0) for i in range(30)]
    records += [rec(590.0 + i, 5.0) for i in range(20)]
    out = slo_summary(records, {"a": 1.0}, {"a": 0.99})
    assert out["slo_worst_window"] == 0.0  # the window starting at 590 s holds only them
    assert out["slo_attainment"] == pytest.approx(30 / 50)


def test_summary_counts_late_unstarted_and_per_service() -> None:
    records = [
        rec(0.0, 0.5, "a"),  # met (a: 1 s)
        rec(1.0, 3.0, "a"),  # late
        rec(2.0, 20.0, "b"),  # met (b: 30 s)
        rec(3.0, None, "b"),  # never started: a miss, not late
    ]
    out = slo_summary(records, {"a": 1.0, "b": 30.0}, {"a": 0.99, "b": 0.9})
    assert out["slo_attainment"] == 0.5
    assert (out["requests_late"], out["requests_unstarted"], out["requests_dropped"]) == (1, 1, 0)
    assert out["max_delay_s"] == 20.0
    assert out["p50_delay_s"] == 3.0
    assert list(out["per_service"]) == ["a", "b"]
    assert out["per_service"]["b"] == {
        "requests": 2,
        "slo_wait_s": 30.0,
        "slo_target": 0.9,
        "slo_attainment": 0.5,
        "slo_worst_window": None,
        "p99_delay_s": 20.0,
        "requests_late": 0,
    }


def test_no_request_is_full_attainment() -> None:
    out = slo_summary([], {}, {})
    assert out["slo_attainment"] == 1.0 and out["slo_worst_window"] is None
    assert out["per_service"] == {}
