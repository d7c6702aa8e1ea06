"""Burstiness (issue 45): measured from one-second counts, counted as 1 when it is
within the noise of Poisson arrivals, and sized for with Hayward's approximation."""

from __future__ import annotations

import numpy as np
import pytest

from deepboot.policies.burstiness import (
    POISSON,
    blocking,
    burstiness,
    replicas_for_bursts,
)
from deepboot.policies.forecast import erlang_b, replicas_for
from deepboot.sim.traces.bursty import BurstyConfig, bursty_stream
from deepboot.world.demand import DemandLedger


def _history(times: list[float], bin_s: float = 60.0, end: float | None = None):  # type: ignore[no-untyped-def]
    ledger = DemandLedger(bin_s, 100_000)
    for t in times:
        ledger.arrived("s", t)
    last = max(times) if times else 0.0
    return ledger.histories(end if end is not None else last + 2 * bin_s).get("s")


def _stream(rps: float, dispersion: float, hours: float, seed: int) -> list[float]:
    config = BurstyConfig(mean_rps=rps, dispersion=dispersion, hours=hours)
    return [r.time for r in bursty_stream(config, np.random.default_rng(seed)).requests]


def test_the_ledger_keeps_one_second_counts_squared_and_the_busiest_second() -> None:
    # Bin 0 (60 s): 3 arrivals in second 5, 1 in second 7; bin 1: 2 in second 61.
    h = _history([5.1, 5.2, 5.9, 7.0, 61.0, 61.5], end=120.0)
    assert h.counts == (4, 2)
    assert h.squares == (3 * 3 + 1, 2 * 2)
    assert h.peaks == (3, 2)


def test_a_second_still_open_counts_once_it_has_ended() -> None:
    ledger = DemandLedger(10.0, 100)
    ledger.arrived("s", 3.2)
    ledger.arrived("s", 3.4)
    assert ledger.histories(3.5) == {"s": ledger.histories(3.5)["s"]}
    assert ledger.histories(10.0)["s"].squares == (4,)  # second 3 ended before 10


@pytest.mark.parametrize("rps", [0.05, 0.5, 2.6, 20.0])
@pytest.mark.parametrize("bin_s", [30.0, 60.0])
def test_poisson_arrivals_are_sized_as_poisson(rps: float, bin_s: float) -> None:
    """Every seed of 20, at every rate and bin: the measured dispersion is within its
    noise, so the sizing is Erlang B's (the goldens' workloads are Poisson-like)."""
    for seed in range(20):
        b = burstiness(_history(_stream(rps, 1.0, 1.0, seed), bin_s))
        assert b.peakedness == 1.0, (seed, b)
        assert abs(b.measured - 1.0) < 0.25, (seed, b)


@pytest.mark.parametrize("dispersion", [3.0, 10.0, 30.0])
def test_bursty_arrivals_are_measured_as_generated(dispersion: float) -> None:
    b = burstiness(_history(_stream(2.6, dispersion, 8.0, 3)))
    assert b.peakedness == b.measured
    assert abs(b.measured - dispersion) < 0.15 * dispersion, b
    assert b.peak_per_s > 2.6 * dispersion


def test_a_ramp_is_not_burstiness() -> None:
    """The rate moves from bin to bin (0.1/s to 10/s): pooled within bins, the
    dispersion stays Poisson's (over the whole history it would be ~100)."""
    rng = np.random.default_rng(5)
    times: list[float] = []
    for b in range(120):
        rate = 0.1 if b % 2 else 10.0
        n = rng.poisson(rate * 60)
        times += sorted(rng.uniform(b * 60, (b + 1) * 60, n).tolist())
    assert burstiness(_history(times)).peakedness == 1.0


def test_no_counts_or_few_arrivals_count_as_poisson() -> None:
    assert burstiness(None) == POISSON
    few = burstiness(_history([1.0, 1.0, 1.0, 1.0]))
    assert few.peakedness == 1.0 and few.peak_per_s == 4


def test_hayward_reduces_to_erlang_b_at_peakedness_one() -> None:
    for n in range(0, 12):
        assert blocking(n, 3.7) == erlang_b(n, 3.7)
    for a in (0.3, 2.6, 10.4, 60.0):
        for c in (1, 2):
            assert replicas_for_bursts(a, 0.99, c, 1.0) == replicas_for(a, 0.99, c)


def test_hayward_holds_more_for_burstier_traffic_and_meets_its_target() -> None:
    needs = [replicas_for_bursts(5.2, 0.99, 1, z) for z in (1.0, 3.0, 10.0, 30.0)]
    assert needs == sorted(needs) and needs[0] < needs[-1]
    for z, n in zip((3.0, 10.0, 30.0), needs[1:], strict=True):
        assert 1 - blocking(n, 5.2, z) >= 0.99 > 1 - blocking(n - 1, 5.2, z)


def test_the_guard_sizes_a_bursty_service_above_a_poisson_one() -> None:
    """One path for the guard and for status: service_needs and demand_views hold
    Hayward's count for the bursty stream, Erlang B's for the same mean rate
    without bursts, and Erlang B's for the bursty one with the sizing turned off."""
    import dataclasses

    from deepboot.core.service import ServiceSpec
    from deepboot.policies.lending import ServiceLoad
    from deepboot.policies.slo import SloConfig, demand_views, service_needs

    spec = ServiceSpec("s", "m", cold_start_s=30.0, slo_wait_s=1.0, max_replicas=1000)
    services = {"s": spec}
    loads = {"s": ServiceLoad(0.0, 2.0)}
    config = SloConfig(enabled=True)

    def sized(dispersion: float, cfg: SloConfig = config) -> tuple[int, int]:
        h = _history(_stream(2.6, dispersion, 2.0, 11))
        now = h.end
        need = service_needs(services, {"s": h}, loads, now, 60.0, cfg)["s"].warm
        view = demand_views(services, {"s": h}, loads, 60.0, cfg)["s"]
        return need, view.sized

    poisson, bursty = sized(1.0), sized(10.0)
    assert poisson[0] == poisson[1] and bursty[0] == bursty[1]
    assert bursty[0] > poisson[0] + 5
    off = sized(10.0, dataclasses.replace(config, burst_sizing=False))
    assert off[0] < bursty[0] and abs(off[0] - poisson[0]) <= 2
