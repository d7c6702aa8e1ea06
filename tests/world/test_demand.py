"""The simulator's binned arrivals for the SLO forecast (deepboot.world.demand)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepboot.world.demand import DemandLedger


def test_complete_bins_only_with_quiet_bins_as_zeros() -> None:
    d = DemandLedger(60.0, keep=5)
    for t in (0.0, 10.0, 70.0, 250.0):
        d.arrived("a", t)
    h = d.histories(260.0)["a"]  # bins 0..3 complete; bin 4 (240-300) in progress
    assert (h.bin_s, h.end, h.counts) == (60.0, 240.0, (2, 1, 0, 0))
    assert d.histories(1000.0)["a"].counts == (0,) * 5  # bins 11..15: the last keep, quiet
    assert d.histories(30.0)["a"].counts == ()


def test_mean_run_times() -> None:
    d = DemandLedger(60.0, keep=3)
    d.ran("a", 2.0)
    d.ran("a", 4.0)
    assert d.loads()["a"].duration_s == 3.0


@settings(max_examples=100, derandomize=True)
@given(st.lists(st.floats(0.0, 3000.0), max_size=40).map(sorted), st.floats(0.0, 4000.0),
       st.integers(1, 80))  # fmt: skip
def test_counts_match_counting_by_hand(times: list[float], now: float, keep: int) -> None:
    d = DemandLedger(60.0, keep)
    for t in times:
        if t <= now:
            d.arrived("a", t)
    h = d.histories(now).get("a")
    current = int(now // 60.0)
    first = max(current - keep, 0)
    expected = tuple(sum(1 for t in times if t <= now and int(t // 60.0) == b)
                     for b in range(first, current))  # fmt: skip
    if h is None:
        assert not any(t <= now for t in times)
        return
    # The history starts at the service's first arrival's bin (or keep bins back).
    assert h.counts == expected[len(expected) - len(h.counts) :]
    assert sum(expected) == sum(h.counts)
    assert h.end == current * 60.0


def test_bad_bins_are_refused() -> None:
    with pytest.raises(ValueError):
        DemandLedger(0.0, 3)


@settings(max_examples=60, derandomize=True)
@given(st.lists(st.tuples(st.floats(0.0, 600.0), st.booleans()), max_size=30))
def test_handed_histories_are_reused_only_while_nothing_changed(
    steps: list[tuple[float, bool]],
) -> None:
    """Asked again in the same bin with no arrival since, a service's history is the
    same object; whatever happened, it equals what a fresh ledger fed the same
    arrivals hands out (the memo never serves a stale history)."""
    d = DemandLedger(20.0, keep=6)
    fed: list[float] = []
    now = 0.0
    for dt, arrive in steps:
        now += dt / 10.0
        if arrive:
            d.arrived("a", now)
            fed.append(now)
        first = d.histories(now)
        again = d.histories(now)
        assert first.keys() == again.keys()
        for name in first:
            assert again[name] is first[name]
        fresh = DemandLedger(20.0, keep=6)
        for t in fed:
            fresh.arrived("a", t)
        assert fresh.histories(now) == first
