"""SLO-guarded lending's pure part (deepboot.policies.slo): each service's need from
its forecast, the regimes, the guaranteed floor, and the oracle's exact demand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepboot.core.errors import ConfigError
from deepboot.core.service import ServiceSpec
from deepboot.policies.forecast import ArrivalHistory, ForecastConfig, replicas_for
from deepboot.policies.lending import ServiceLoad
from deepboot.policies.slo import (
    DemandSchedule,
    ServiceNeed,
    SloConfig,
    demand_schedule,
    horizon,
    host_starts,
    idle_need,
    paced,
    service_needs,
)

ON = SloConfig(enabled=True)


def spec(name: str = "s", **kw: object) -> ServiceSpec:
    kw.setdefault("cold_start_s", 8.0)
    return ServiceSpec(name, "m", **kw)  # type: ignore[arg-type]


def steady(rate_per_bin: int, bins: int = 24) -> ArrivalHistory:
    return ArrivalHistory(bin_s=60.0, counts=(rate_per_bin,) * bins, end=bins * 60.0)


def test_the_horizon_covers_a_cold_start_a_resize_and_an_interval() -> None:
    assert horizon(spec(cold_start_s=8.0), 60.0, ON) == 8.0 + 30.0 + 60.0
    assert horizon(spec(cold_start_s=8.0), 60.0, SloConfig(True, horizon_s=600.0)) == 600.0
    assert horizon(spec(cold_start_s=8.0), 60.0, SloConfig(True, horizon_s=10.0)) == 98.0


def test_a_steady_service_needs_erlang_b_replicas_in_the_prewarm_regime() -> None:
    # 6 arrivals a minute = 0.1/s, 20 s each: 2 Erlangs.
    needs = service_needs(
        {"s": spec()}, {"s": steady(6)}, {"s": ServiceLoad(0.1, 20.0)}, 7200.0, 60.0, ON
    )
    expected = replicas_for(0.1 * 20.0, 0.99)
    assert expected > 2
    assert needs == {"s": ServiceNeed(warm=expected, hold=expected)}


def test_the_relaxed_regime_holds_only_the_guaranteed() -> None:
    """(Its shared idle GPUs are :func:`idle_need`'s, below.)"""
    relaxed = spec(slo_wait_s=20.0, guaranteed_replicas=1)  # wait >= the 8 s cold start
    loads = {"s": ServiceLoad(0.1, 20.0)}
    needs = service_needs({"s": relaxed}, {"s": steady(6)}, loads, 7200.0, 60.0, ON)
    assert needs == {"s": ServiceNeed(warm=1, hold=1)}  # a reactive reclaim meets 20 s
    # A reclaim that takes 15 s: 8 + 15 > 20, so the forecast need is kept from
    # lending (loaded or FREE) but only the guaranteed replica is pre-warmed.
    slow = SloConfig(True, reclaim_s=15.0)
    needs = service_needs({"s": relaxed}, {"s": steady(6)}, loads, 7200.0, 60.0, slow)
    assert needs["s"].warm == 1 and needs["s"].hold == replicas_for(2.0, 0.99)


def test_the_target_override_and_max_replicas() -> None:
    loads = {"s": ServiceLoad(0.1, 20.0)}
    low = service_needs({"s": spec()}, {"s": steady(6)}, loads, 0, 60, SloConfig(True, 0.5))
    assert low["s"].warm == replicas_for(2.0, 0.5) < replicas_for(2.0, 0.99)
    capped = service_needs({"s": spec(max_replicas=2)}, {"s": steady(6)}, loads, 0, 60, ON)
    assert capped["s"].warm == 2


def test_quiet_or_unknown_services_need_only_their_guarantee() -> None:
    services = {"a": spec("a"), "b": spec("b", guaranteed_replicas=2), "c": spec("c")}
    histories = {"a": steady(0)}
    assert service_needs(services, histories, {}, 0.0, 60.0, ON) == {"b": ServiceNeed(2, 2)}
    # Disabled: the guarantee still holds, the forecast is not read.
    off = service_needs(services, {"c": steady(6)}, {}, 0.0, 60.0, SloConfig())
    assert off == {"b": ServiceNeed(2, 2)}


def test_the_default_duration_stands_in_before_a_task_finished() -> None:
    cfg = SloConfig(True, default_duration_s=20.0)
    needs = service_needs({"s": spec()}, {"s": steady(6)}, {}, 0.0, 60.0, cfg)
    assert needs["s"].warm == replicas_for(2.0, 0.99)


def test_the_oracle_holds_the_exact_peak_over_the_horizon() -> None:
    schedule = demand_schedule([(100.0, 50.0), (120.0, 10.0), (400.0, 5.0)])
    cfg = SloConfig(True, oracle={"s": schedule})
    times = (0.0, 10.0, 30.0, 200.0)
    at = {t: service_needs({"s": spec()}, {}, {}, t, 60.0, cfg) for t in times}
    assert at[0.0] == {}  # horizon 98 s: nothing before 100 s
    assert at[10.0] == {"s": ServiceNeed(1, 1)}  # 10..108 s: the first request only
    assert at[30.0] == {"s": ServiceNeed(2, 2)}  # 30..128 s: two overlap from 120 s
    assert at[200.0] == {}  # nothing between 200 and 298 s


def test_demand_schedule_hands_a_replica_over_at_the_same_instant() -> None:
    s = demand_schedule([(0.0, 10.0), (10.0, 5.0), (12.0, 1.0)], concurrency=1)
    assert s.peak(0.0, 20.0) == 2  # 12..13 overlaps 10..15
    assert s.peak(0.0, 11.0) == 1  # 0..10 then 10..15: never two
    assert demand_schedule([(0.0, 1.0), (0.0, 1.0), (0.0, 1.0)], 2).peak(0.0, 0.0) == 2


@settings(max_examples=150, derandomize=True)
@given(
    st.lists(st.tuples(st.integers(0, 200), st.integers(1, 50)), max_size=25),
    st.integers(1, 3),
    st.integers(0, 250),
    st.integers(0, 60),
)
def test_demand_schedule_peak_matches_counting(
    reqs: list[tuple[int, int]], conc: int, start: int, width: int
) -> None:
    schedule = demand_schedule([(float(a), float(d)) for a, d in reqs], conc)
    brute = 0
    # The demand changes only at arrivals and ends: check those inside, and the start.
    points = {start} | {a for a, _ in reqs} | {a + d for a, d in reqs}
    for t in (p for p in points if start <= p <= start + width):
        inflight = sum(1 for a, d in reqs if a <= t < a + d)
        brute = max(brute, -(-inflight // conc))
    assert schedule.peak(float(start), float(start + width)) == brute


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(ConfigError, match="target"):
        SloConfig(True, target=1.0)
    with pytest.raises(ConfigError, match="horizon_s"):
        SloConfig(True, horizon_s=0.0)
    with pytest.raises(ConfigError, match="resize_s"):
        SloConfig(True, resize_s=float("nan"))


def test_an_empty_schedule_needs_nothing() -> None:
    assert DemandSchedule((), ()).peak(0.0, 1e9) == 0


def test_the_relaxed_services_share_an_idle_pool_sized_by_erlang_b() -> None:
    """Two relaxed services, 0.1/s each, 20 s tasks after an 8 s cold start: 2 x 0.1
    x 28 = 5.6 Erlangs pooled, Erlang B at idle_target; a pre-warm service adds
    nothing, and neither does a relaxed one without arrivals."""
    services = {
        "r1": spec("r1", slo_wait_s=20.0),
        "r2": spec("r2", slo_wait_s=20.0),
        "p": spec("p"),  # 1 s < 8 s: pre-warm
        "quiet": spec("quiet", slo_wait_s=20.0),
    }
    hist = {"r1": steady(6), "r2": steady(6), "p": steady(60)}
    loads = {n: ServiceLoad(0.1, 20.0) for n in services}
    assert idle_need(services, hist, loads, 60.0, ON) == replicas_for(5.6, 0.75) == 6
    assert idle_need(services, hist, loads, 60.0, SloConfig(True, idle_target=0.9)) == (
        replicas_for(5.6, 0.9)
    )
    assert idle_need(services, hist, loads, 60.0, SloConfig(False)) == 0
    oracle = SloConfig(True, oracle={"r1": DemandSchedule((0.0,), (1,))})
    assert idle_need(services, hist, loads, 60.0, oracle) == 0  # the oracle holds exactly
    # Concurrency 2: each replica takes two requests at once, half the GPU-seconds.
    halved = {"r1": spec("r1", slo_wait_s=20.0, concurrency=2)}
    assert idle_need(halved, hist, loads, 60.0, ON) == replicas_for(1.4, 0.75)


def test_the_idle_pool_counts_the_relaxed_replicas_serving_as_its_servers() -> None:
    """Erlang B's 6 servers for 5.6 Erlangs are busy and idle ones together, and a
    replica that ends its task rejoins the pool: with 4 relaxed replicas serving, 2
    idle GPUs make the 6. The pre-warm service's replicas are not the pool's."""
    services = {
        "r1": spec("r1", slo_wait_s=20.0),
        "r2": spec("r2", slo_wait_s=20.0),
        "p": spec("p"),
    }
    hist = {"r1": steady(6), "r2": steady(6), "p": steady(60)}
    loads = {n: ServiceLoad(0.1, 20.0) for n in services}
    servers = replicas_for(5.6, 0.75)
    assert idle_need(services, hist, loads, 60.0, ON, serving={"r1": 3, "r2": 1}) == servers - 4
    assert idle_need(services, hist, loads, 60.0, ON, serving={"p": 5}) == servers
    assert idle_need(services, hist, loads, 60.0, ON, serving={"r1": 9}) == 0  # never below 0


def test_relaxed_services_take_no_share_of_a_full_pool() -> None:
    """When the pre-warm needs exceed the pool, a relaxed service's forecast does not
    compete for it (it would hold only its guarantee anyway)."""
    services = {"p": spec("p"), "r": spec("r", slo_wait_s=20.0)}
    hist = {"p": steady(6), "r": steady(60)}
    loads = {n: ServiceLoad(0.1, 20.0) for n in services}
    needs = service_needs(services, hist, loads, 7200.0, 60.0, ON, capacity=3)
    assert needs == {"p": ServiceNeed(3, 3)}


def test_host_starts_name_the_services_whose_model_a_node_holds_and_that_start_faster() -> None:
    services = {
        "a": spec("a"),  # model "m", 8 s cold
        "quick": spec("quick", cold_start_s=0.4),  # its cold start beats the host start
        "other": ServiceSpec("other", "n", cold_start_s=8.0),  # model "n": nowhere
        "unsized": spec("unsized"),  # no host start known
    }
    host = {"a": 0.6, "quick": 0.6, "other": 0.6}
    assert host_starts(services, {3: frozenset({"m"})}, host) == {"a": 0.6}
    assert host_starts(services, {}, host) == {}  # no cache, or nothing in it


def test_a_host_start_within_the_slo_turns_a_prewarm_service_relaxed() -> None:
    """1 s SLO, 8 s cold start: pre-warm, Erlang B replicas held loaded. Its model in
    a node's memory, 0.6 s host start: a reclaim when the request comes meets 1 s,
    so nothing is held for it but its share of the relaxed services' idle pool,
    sized with the host start (0.1/s x (0.6 + 20) s), and its horizon shortens."""
    services = {"s": spec(guaranteed_replicas=1)}
    hist, loads = {"s": steady(6)}, {"s": ServiceLoad(0.1, 20.0)}
    cold = service_needs(services, hist, loads, 7200.0, 60.0, ON)
    assert cold["s"].warm == replicas_for(2.0, 0.99) > 1
    starts = {"s": 0.6}
    warm = service_needs(services, hist, loads, 7200.0, 60.0, ON, starts=starts)
    assert warm == {"s": ServiceNeed(warm=1, hold=1)}
    assert idle_need(services, hist, loads, 60.0, ON) == 0
    assert idle_need(services, hist, loads, 60.0, ON, starts) == replicas_for(0.1 * 20.6, 0.75)
    assert horizon(services["s"], 60.0, ON, starts) == 0.6 + 30.0 + 60.0
    # A host start that still misses the SLO (2 s > 1 s) keeps it pre-warmed.
    slow = service_needs(services, hist, loads, 7200.0, 60.0, ON, starts={"s": 2.0})
    assert slow["s"].warm == cold["s"].warm


def test_the_forecast_is_paced_to_the_loops_interval() -> None:
    # At the simulator's 60 s ticks nothing changes (its results stay as they were).
    assert paced(ON, 60.0) is ON
    # At the runtime's 5 s ticks: bins of one interval, a half-life of five; the
    # season stays a day (whole bins), its smoothing window half an hour.
    fast = paced(ON, 5.0).forecast
    assert (fast.bin_s, fast.halflife_s) == (5.0, 25.0)
    assert (fast.season_s, fast.smooth_s) == (86_400.0, 1800.0)
    assert fast.level_bins == ON.forecast.level_bins  # the same shape, in ticks
    # An interval that does not divide the day still gives a valid forecast.
    odd = paced(ON, 7.0).forecast
    assert odd.bin_s == 7.0 and odd.season_s % 7.0 == 0 and odd.smooth_s % 7.0 == 0
    # A forecast set on purpose is left alone.
    mine = SloConfig(enabled=True, forecast=ForecastConfig(bin_s=30.0, halflife_s=90.0))
    assert paced(mine, 5.0) is mine


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 50), min_size=1, max_size=30), min_size=1, max_size=6),
    st.sampled_from([60.0, 98.0, 600.0]),
)
def test_the_remembered_peak_is_the_forecast_peak_of_that_very_history(
    series: list[list[int]], horizon_s: float
) -> None:
    """The memo is keyed by a history's identity: each history, and an equal copy made
    after it, gets its own forecast's peak, even once the memo evicts (size 2 here)."""
    from deepboot.policies.forecast import forecast
    from deepboot.policies.slo import _PeakMemo

    memo = _PeakMemo(2)
    config = ForecastConfig(bin_s=60.0, halflife_s=300.0)
    histories = [ArrivalHistory(60.0, tuple(c), 60.0 * len(c)) for c in series]
    for h in histories + histories[::-1]:
        copy = ArrivalHistory(h.bin_s, tuple(h.counts), h.end)
        for x in (h, copy, h):
            assert memo(x, horizon_s, config) == forecast(x, horizon_s, config).peak
