"""Erlang B, warm replicas and the per-service demand forecast (``policies.forecast``)."""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deepboot.core.errors import ConfigError
from deepboot.policies import forecast as fc
from deepboot.policies.forecast import (
    ArrivalHistory,
    ForecastConfig,
    constant_rate,
    erlang_b,
    forecast,
    horizon_bins,
    last_value,
    replicas_for,
)

# A small season so that histories stay short: 10 bins of 60 s.
SMALL = ForecastConfig(bin_s=60.0, halflife_s=120.0, season_s=600.0, smooth_s=60.0)


def make_history(counts: list[int] | tuple[int, ...], bin_s: float = 60.0) -> ArrivalHistory:
    """A history of ``counts`` ending at ``len(counts) x bin_s``."""
    return ArrivalHistory(bin_s, tuple(counts), len(counts) * bin_s)


def explicit_b(n: int, a: Fraction) -> float:
    """Erlang B by its closed form (a^n / n!) / sum_k (a^k / k!), in exact rationals."""
    terms = [a**k / math.factorial(k) for k in range(n + 1)]
    return float(terms[-1] / sum(terms))


# --- Erlang B ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("servers", "offered", "expected", "rel"),
    [
        (1, 1.0, 0.5, 1e-15),
        (2, 1.0, 0.2, 1e-15),
        (5, 3.0, 0.1101, 1e-3),
        (10, 5.0, 0.01838, 1e-3),
        (0, 7.0, 1.0, 0.0),
        (3, 0.0, 0.0, 0.0),
        (0, 0.0, 1.0, 0.0),
    ],
    ids=["B(1,1)", "B(2,1)", "B(5,3)", "B(10,5)", "no-servers", "no-load", "nothing"],
)
def test_erlang_b_table_values(servers: int, offered: float, expected: float, rel: float) -> None:
    assert erlang_b(servers, offered) == pytest.approx(expected, rel=rel, abs=0.0)


@given(st.integers(0, 40), st.fractions(0, 60, max_denominator=8))
def test_erlang_b_matches_the_closed_form(servers: int, offered: Fraction) -> None:
    assert erlang_b(servers, float(offered)) == pytest.approx(
        explicit_b(servers, offered), rel=1e-12, abs=1e-300
    )


@given(st.integers(0, 200), st.floats(1e-6, 500.0))
def test_erlang_b_falls_with_servers(servers: int, offered: float) -> None:
    b0, b1 = erlang_b(servers, offered), erlang_b(servers + 1, offered)
    assert 0.0 <= b1 < b0 <= 1.0 or b1 == b0 == 0.0  # both underflowed


@given(st.integers(1, 200), st.floats(0.0, 500.0), st.floats(0.0, 500.0))
def test_erlang_b_rises_with_load(servers: int, a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    assert erlang_b(servers, lo) <= erlang_b(servers, hi)


def test_erlang_b_many_servers() -> None:
    # Far beyond any factorial's range; the recursion stays in [0, 1].
    b = erlang_b(20_000, 19_000.0)
    assert 0.0 < b < 0.1
    assert erlang_b(20_000, 100.0) == 0.0  # underflows to 0, not NaN


@pytest.mark.parametrize(
    ("servers", "offered", "match"),
    [
        (-1, 1.0, "servers"),
        (True, 1.0, "servers"),
        (2.0, 1.0, "servers"),
        (1, -0.5, "offered"),
        (1, math.nan, "offered"),
        (1, math.inf, "offered"),
    ],
    ids=["negative-n", "bool-n", "float-n", "negative-a", "nan-a", "inf-a"],
)
def test_erlang_b_rejects(servers: object, offered: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        erlang_b(servers, offered)  # type: ignore[arg-type]


# --- replicas_for ------------------------------------------------------------------


def test_replicas_for_known_value() -> None:
    # B(10, 5) = 0.0184 > 0.01 and B(11, 5) = 0.0083: 11 servers for 99%.
    assert replicas_for(5.0, 0.99) == 11
    assert replicas_for(5.0, 0.99, concurrency=4) == 3
    assert replicas_for(1.0, 0.5) == 1  # 1 - B(1, 1) = 0.5 meets 0.5 exactly


@given(st.floats(0.0, 300.0), st.floats(0.0, 0.999), st.integers(1, 8))
def test_replicas_for_is_the_smallest_that_meets_the_target(
    offered: float, target: float, concurrency: int
) -> None:
    n = replicas_for(offered, target, concurrency)
    if offered == 0.0:
        assert n == 0  # no arrivals to serve (though B(0, 0) = 1 by the recursion)
        return
    assert 1.0 - erlang_b(n * concurrency, offered) >= target
    if n > 0:
        assert 1.0 - erlang_b((n - 1) * concurrency, offered) < target


@given(st.floats(0.0, 300.0), st.floats(0.0, 0.999), st.integers(1, 8))
def test_replicas_for_rounds_slots_up_to_replicas(
    offered: float, target: float, concurrency: int
) -> None:
    slots = replicas_for(offered, target, 1)
    assert replicas_for(offered, target, concurrency) == -(-slots // concurrency)


@pytest.mark.parametrize(
    ("offered", "target"), [(0.0, 0.99), (5.0, 0.0)], ids=["no-load", "no-target"]
)
def test_replicas_for_zero(offered: float, target: float) -> None:
    assert replicas_for(offered, target) == 0


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((1.0, 1.0), "target"),
        ((1.0, -0.1), "target"),
        ((-1.0, 0.9), "offered"),
        ((math.nan, 0.9), "offered"),
        ((1.0, 0.9, 0), "concurrency"),
        ((1.0, 0.9, True), "concurrency"),
    ],
    ids=["target-1", "target-negative", "negative-load", "nan-load", "no-slots", "bool-slots"],
)
def test_replicas_for_rejects(args: tuple[float, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        replicas_for(*args)  # type: ignore[arg-type]


def test_replicas_for_gives_up_past_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fc, "MAX_REPLICAS", 3)
    assert replicas_for(1.0, 0.9) == 3  # within the cap
    with pytest.raises(ValueError, match="more than 3 replicas"):
        replicas_for(50.0, 0.9)


# --- ArrivalHistory and ForecastConfig ----------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"bin_s": 0.0}, "bin_s"),
        ({"bin_s": math.nan}, "bin_s"),
        ({"end": math.inf}, "end"),
        ({"counts": (1, -1)}, r"counts\[1\]"),
        ({"counts": (1, True)}, r"counts\[1\]"),
        ({"counts": (1.0,)}, r"counts\[0\]"),
        ({"counts": [1, 2]}, "tuple"),
    ],
    ids=["zero-bin", "nan-bin", "inf-end", "negative", "bool", "float", "list"],
)
def test_history_rejects(kwargs: dict[str, object], match: str) -> None:
    base: dict[str, object] = {"bin_s": 60.0, "counts": (1, 2), "end": 120.0}
    with pytest.raises(ValueError, match=match):
        ArrivalHistory(**(base | kwargs))  # type: ignore[arg-type]


def test_history_start() -> None:
    assert ArrivalHistory(60.0, (1, 2, 3), 1000.0).start == 820.0
    assert ArrivalHistory(60.0, (), 5.0).start == 5.0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"bin_s": 0.0}, "bin_s"),
        ({"halflife_s": -1.0}, "halflife_s"),
        ({"season_s": 1000.0}, "season_s"),
        ({"season_weight": 1.5}, "season_weight"),
        ({"smooth_s": 90.0}, "smooth_s"),
        ({"smooth_s": 300.0}, "smooth_s"),
        ({"max_ratio": 0.5}, "max_ratio"),
        ({"prior_rate": 0.0}, "prior_rate"),
        ({"bin_s": 0.01, "season_s": 86_400.0, "smooth_s": 0.0}, "bin_s"),
    ],
    ids=[
        "zero-bin",
        "negative-halflife",
        "season-not-whole-bins",
        "weight-above-1",
        "smooth-not-whole-bins",
        "smooth-half-season",
        "ratio-below-1",
        "no-prior",
        "history-too-long",
    ],
)
def test_config_names_the_bad_field(kwargs: dict[str, float], field: str) -> None:
    base = {"bin_s": 60.0, "season_s": 600.0, "smooth_s": 60.0}
    with pytest.raises(ConfigError, match=field):
        ForecastConfig(**(base | kwargs))


def test_config_bins() -> None:
    assert (SMALL.season_bins, SMALL.smooth_bins, SMALL.level_bins) == (10, 1, 16)
    assert SMALL.history_bins == 26
    assert ForecastConfig().season_bins == 288


@pytest.mark.parametrize(
    ("horizon_s", "expected"),
    [(60.0, 1), (61.0, 2), (1.0, 1), (600.0, 10)],
    ids=["one", "just-over", "under-one", "ten"],
)
def test_horizon_bins(horizon_s: float, expected: int) -> None:
    assert horizon_bins(horizon_s, 60.0) == expected


@pytest.mark.parametrize("horizon_s", [0.0, -1.0, math.nan, 1e12], ids=str)
def test_horizon_rejects(horizon_s: float) -> None:
    with pytest.raises(ValueError, match="horizon"):
        forecast(make_history([1]), horizon_s, SMALL)


def test_forecast_rejects_other_bins() -> None:
    with pytest.raises(ValueError, match="30 s"):
        forecast(make_history([1], bin_s=30.0), 60.0, SMALL)


# --- forecast ----------------------------------------------------------------------


def test_empty_history_forecasts_nothing() -> None:
    f = forecast(make_history([]), 180.0, SMALL)
    assert (f.rate, f.peak, f.bins, f.seasonal) == (0.0, 0.0, (0.0, 0.0, 0.0), False)


@pytest.mark.parametrize("bins", [3, 10, 11, 40], ids=lambda n: f"{n}-bins")
def test_constant_history_forecasts_its_rate(bins: int) -> None:
    f = forecast(make_history([6] * bins), 180.0, SMALL)
    assert f.seasonal is (bins > SMALL.season_bins)
    assert len(f.bins) == 3
    for value in f.bins:
        assert value == pytest.approx(0.1, rel=1e-12)


def test_step_up_is_followed_at_the_halflife() -> None:
    # 0 for a long time, then 10 per bin: after one half-life (2 bins) the level has
    # gone half of the way (of the weights in its 16-bin window).
    flat = replace(SMALL, season_weight=0.0)
    rates = [forecast(make_history([0] * 30 + [10] * k), 60.0, flat).rate for k in range(9)]
    assert rates[0] == 0.0
    assert all(a < b for a, b in zip(rates, rates[1:], strict=False))
    assert rates[2] == pytest.approx(0.5 * 10 / 60 / (1 - 2**-8), rel=1e-9)
    assert rates[8] == pytest.approx(15 / 16 * 10 / 60 / (1 - 2**-8), rel=1e-9)


# A longer season for the periodic cases: 20 bins, 14 of night (0) then 6 of day (6
# per bin); the level reads 8 bins (half-life 60 s), the seasonal window +-1 bin.
PERIODIC = ForecastConfig(bin_s=60.0, halflife_s=60.0, season_s=1200.0, smooth_s=60.0)


def periodic(days: int, hour: int = 0) -> list[int]:
    """``days`` whole seasons of the square wave, then ``hour`` bins of the next."""
    day = [0] * 14 + [6] * 6
    return (day * (days + 1))[: days * 20 + hour]


def test_periodic_history_sees_the_ramp_coming() -> None:
    # 12 bins into the night the level is exactly 0 and so was the level a season
    # ago (ratio 1); yesterday's bins 12-14 ramped up: windows 11-13, 12-14, 13-15
    # hold 0, 6 and 12 arrivals, and half of each goes into the forecast.
    history = make_history(periodic(3, hour=12))
    f = forecast(history, 180.0, PERIODIC)
    assert f.seasonal
    assert f.bins == pytest.approx((0.0, 0.5 * 2 / 60, 0.5 * 4 / 60), rel=1e-12, abs=0.0)
    assert f.rate == 0.0 and f.peak == f.bins[2]
    flat = forecast(history, 180.0, replace(PERIODIC, season_weight=0.0))
    assert flat.bins == (0.0, 0.0, 0.0) and not flat.seasonal


def test_during_the_day_the_level_leads() -> None:
    # 4 bins into the day: the level is rising to 6 per bin, yesterday stays at 6.
    f = forecast(make_history(periodic(2, hour=18)), 120.0, PERIODIC)
    level = forecast(
        make_history(periodic(2, hour=18)), 120.0, replace(PERIODIC, season_weight=0.0)
    )
    assert 0.0 < level.rate < 0.1
    assert f.rate > level.rate  # yesterday at this time (and the ratio) pulls it up


def test_without_a_full_season_the_periodic_history_is_flat() -> None:
    f = forecast(make_history(periodic(0, hour=20)), 180.0, PERIODIC)
    assert not f.seasonal and f.bins == (f.rate,) * 3


@pytest.mark.parametrize(
    ("today", "ratio"),
    [(4, None), (40, 4.0), (0, 0.25)],
    ids=["scaled-by-level", "clamped-above", "clamped-below"],
)
def test_seasonal_term_is_scaled_to_todays_level(today: int, ratio: float | None) -> None:
    # Two seasons at 2 per bin, then the level's 8 bins at ``today``: yesterday's
    # value, 2, is scaled by (today + prior) / (2 + prior), clamped to [1/4, 4].
    f = forecast(make_history([2] * 40 + [today] * 8), 60.0, PERIODIC)
    prior = PERIODIC.prior_rate
    now, then = today / 60.0, 2.0 / 60.0
    if ratio is None:
        ratio = (now + prior) / (then + prior)
    assert f.rate == pytest.approx(0.5 * now + 0.5 * then * ratio, rel=1e-12, abs=1e-18)


@given(st.lists(st.integers(0, 50), max_size=60), st.integers(1, 25))
def test_forecast_reads_only_its_history_window(counts: list[int], horizon: int) -> None:
    history = make_history(counts)
    f = forecast(history, horizon * 60.0, SMALL)
    keep = SMALL.history_bins
    if len(counts) >= keep:
        short = ArrivalHistory(60.0, tuple(counts[-keep:]), history.end)
        assert forecast(short, horizon * 60.0, SMALL) == f
    assert len(f.bins) == horizon
    assert f.rate == f.bins[0] and f.peak == max(f.bins)
    assert all(v >= 0.0 and math.isfinite(v) for v in f.bins)
    assert f.peak <= 4.0 * max(counts, default=0) / 60.0  # never beyond the clamp


def test_horizon_past_a_season_repeats_it() -> None:
    f = forecast(make_history(periodic(3, hour=2)), 45 * 60.0, PERIODIC)
    assert f.seasonal and f.bins[:5] == f.bins[20:25] == f.bins[40:45]


# --- baselines ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("counts", "last", "mean"),
    [([], 0.0, 0.0), ([3], 3 / 60, 3 / 60), ([1, 2, 6], 6 / 60, 9 / 180)],
    ids=["empty", "one", "three"],
)
def test_baselines(counts: list[int], last: float, mean: float) -> None:
    history = make_history(counts)
    lv, cr = last_value(history, 120.0), constant_rate(history, 120.0)
    assert (lv.rate, lv.peak, lv.bins) == (last, last, (last, last))
    assert (cr.rate, cr.peak, cr.bins) == (mean, mean, (mean, mean))
