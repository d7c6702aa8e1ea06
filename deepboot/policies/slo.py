"""SLO-guarded lending: how many replicas of each service to hold, from its forecast.

A request meets its service's SLO (``slo_wait_s``, :mod:`deepboot.sim.slo_accounting`) when a
ready replica takes it within that wait. Two regimes (docs/slo.md):

* **pre-warm** (``slo_wait_s`` < the service's cold start): only a replica already
  loaded and idle meets it. A request that finds every replica busy does not queue
  behind them, it overflows to a cold start and misses: a loss system, so the
  replicas to hold for ``slo_target`` of requests to find one idle are Erlang B's
  (:func:`~deepboot.policies.forecast.replicas_for`) at the offered load
  ``forecast peak rate x mean task duration``. The control loop keeps that many
  loaded (idle ones are not lent) and pre-warms the missing ones ahead of demand,
  reclaiming lent GPUs if it must.
* **relaxed** (``slo_wait_s`` >= the cold start plus ``reclaim_s``): a cold start
  on a free GPU meets it, and so does one on a GPU reclaimed when the request
  arrives (the simulator frees a reclaimed GPU at once: ``reclaim_s`` 0). No
  replica is held for the SLO beyond ``guaranteed_replicas``; what the forecast buys
  here is *when* training gives GPUs back: the relaxed services share a pool of
  idle GPUs (:func:`idle_need`) sized so that ``SloConfig.idle_target`` of their
  cold starts find one, refilled at each tick by proactive reclaims. A reclaim when
  the request arrives shrinks a job mid-interval (a restart the next tick undoes);
  one at the tick is folded into the round's own resize.
* in between (the cold start <= ``slo_wait_s`` < it plus ``reclaim_s``): a cold start
  on a FREE GPU meets it but one behind a reclaim does not, so the forecast need
  is kept from lending, loaded or FREE, but nothing is pre-warmed or reclaimed
  ahead.

The forecast looks ``horizon`` seconds ahead: at least a cold start plus a
training resize plus one scheduling interval (what a reclaim-and-pre-warm needs to
be ready before the demand it answers), and at least ``SloConfig.horizon_s``.
``guaranteed_replicas`` is a floor under any need. Pure: a function of the specs,
the arrival histories and the measured durations.
"""

from __future__ import annotations

import dataclasses
import math
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from deepboot.core.service import ServiceSpec
from deepboot.policies.burstiness import blocking, burstiness, replicas_for_bursts
from deepboot.policies.forecast import (
    ArrivalHistory,
    ForecastConfig,
    forecast,
    replicas_for,
)
from deepboot.policies.lending import ServiceLoad
from deepboot.policies.registration import MAX_DELAY_S, require


@dataclass(frozen=True, slots=True)
class DemandSchedule:
    """A clairvoyant service's exact demand (the ``oracle`` reference): the replicas
    its requests occupy, as a step function of time.

    Attributes:
        times: Ascending times at which the demand changes.
        replicas: Replicas busy from ``times[i]`` until ``times[i + 1]`` (0 before
            the first time).
    """

    times: tuple[float, ...]
    replicas: tuple[int, ...]

    def peak(self, start: float, end: float) -> int:
        """Most replicas busy at any moment of ``[start, end]``."""
        i = bisect_right(self.times, start) - 1
        peak = self.replicas[i] if i >= 0 else 0
        j = i + 1
        while j < len(self.times) and self.times[j] <= end:
            peak = max(peak, self.replicas[j])
            j += 1
        return peak


def _no_schedules() -> Mapping[str, DemandSchedule]:
    return {}


_NONE: Mapping[str, float] = MappingProxyType({})
_NO_COUNTS: Mapping[str, int] = MappingProxyType({})


SLO_FORECAST = ForecastConfig(bin_s=60.0, halflife_s=300.0)
"""The guard's forecast: 60 s bins (one scheduling interval: the world hands the
forecast complete bins only, so a service's first arrival is seen within a minute)
and a 5-minute half-life, so the level follows a ramp within minutes. On the GenAI
trace (docs/benchmarks.md) it keeps 97.3% of requests warm with 8.7 replicas, where
the forecast module's defaults (300 s bins, 30 min) keep 97.8% with 11.3; on
``genai-day.csv`` (a day compressed into 8 hours) it lifts ``--slo`` from 79% to
81-82% attainment and cuts its JCT by 7-11%."""


@dataclass(frozen=True, slots=True)
class SloConfig:
    """Parameters of SLO-guarded lending.

    Attributes:
        enabled: Hold each service's forecast need (off: only ``guaranteed_replicas``).
        target: Overrides every service's ``slo_target`` (None: each its own).
        horizon_s: The forecast horizon's minimum, seconds (None: a cold start plus
            ``resize_s`` plus one interval, per service).
        resize_s: Seconds a training job's resize takes (part of the horizon).
        reclaim_s: Seconds between a reclaim and its GPU being free for a cold start
            (0: the simulator frees it at once). A service whose ``slo_wait_s``
            covers its cold start plus this needs nothing held beyond its
            ``guaranteed_replicas``: a reactive reclaim meets its SLO.
        default_duration_s: A task's run time assumed before any of its service
            finished (the offered load needs one).
        idle_target: In the relaxed regime, the fraction of cold starts that should
            find an idle GPU (a sleeping replica or a FREE GPU) rather than wait on
            a reclaim (:func:`idle_need`). docs/benchmarks.md has the sweep behind
            0.75: the lowest JCT of 0.5-0.99 on small, middle and genai-day.csv's
            relaxed setting; 0.5 reclaims 1.5-2.7x more, 0.99 costs genai-day's
            training 5% JCT.
        forecast: The demand forecast's parameters (:data:`SLO_FORECAST`).
        oracle: Per service, its exact future demand: the ``oracle`` reference holds
            the peak of it over the horizon instead of a forecast (a reference that
            knows every future request, never a deployable policy).
        burst_sizing: Size each service for its measured burstiness (Hayward,
            :mod:`deepboot.policies.burstiness`); off: as if every arrival stream
            were Poisson (Erlang B alone, the sizing before issue 45; for comparison).
    """

    enabled: bool = False
    target: float | None = None
    horizon_s: float | None = None
    resize_s: float = 30.0
    reclaim_s: float = 0.0
    default_duration_s: float = 10.0
    idle_target: float = 0.75
    forecast: ForecastConfig = field(default_factory=lambda: SLO_FORECAST)
    oracle: Mapping[str, DemandSchedule] = field(default_factory=_no_schedules)
    burst_sizing: bool = True

    def __post_init__(self) -> None:
        require(
            self.target is None or 0.0 < self.target < 1.0,
            "target",
            f"must be in (0, 1), or None; got {self.target}",
        )
        require(
            0.0 < self.idle_target < 1.0,
            "idle_target",
            f"must be in (0, 1); got {self.idle_target}",
        )
        require(
            self.horizon_s is None
            or (math.isfinite(self.horizon_s) and 0.0 < self.horizon_s <= MAX_DELAY_S),
            "horizon_s",
            f"must be in (0, {MAX_DELAY_S:g}] seconds, or None; got {self.horizon_s}",
        )
        for name in ("resize_s", "reclaim_s", "default_duration_s"):
            value = getattr(self, name)
            require(
                math.isfinite(value) and 0.0 <= value <= MAX_DELAY_S,
                name,
                f"must be in [0, {MAX_DELAY_S:g}] seconds; got {value}",
            )


def paced(config: SloConfig, interval: float) -> SloConfig:
    """``config`` with its forecast at the pace of a loop ticking every ``interval``
    seconds.

    :data:`SLO_FORECAST` is made for 60 s ticks: bins of one interval, a half-life of
    five. A loop that ticks faster (the runtime's tests and demo tick every few
    seconds, on traces compressed as much) gets the same shape in its own time: bins
    of one interval and a half-life of five, so that a ramp shows in the forecast
    within a few ticks rather than minutes; the season (a day) and its smoothing
    window are kept, rounded down to whole bins. At 60 s, and for any forecast other than
    :data:`SLO_FORECAST` (set on purpose), ``config`` is returned as it is.
    """
    fc = config.forecast
    if fc != SLO_FORECAST or interval == fc.bin_s:
        return config
    scale = interval / fc.bin_s
    season_bins = max(3, int(fc.season_s // interval))
    smooth_bins = min(round(fc.smooth_s / interval), (season_bins - 1) // 2)
    paced_fc = dataclasses.replace(
        fc,
        bin_s=interval,
        halflife_s=fc.halflife_s * scale,
        season_s=season_bins * interval,
        smooth_s=smooth_bins * interval,
    )
    return dataclasses.replace(config, forecast=paced_fc)


@dataclass(frozen=True, slots=True)
class ServiceNeed:
    """What one service needs held now.

    Attributes:
        warm: Replicas to keep loaded: the missing ones are pre-warmed ahead of
            demand, and idle ones are not lent. The forecast need in the pre-warm
            regime, else ``guaranteed_replicas`` alone.
        hold: GPUs to keep from lending, loaded or FREE (>= ``warm``).
    """

    warm: int
    hold: int


def horizon(
    spec: ServiceSpec, interval: float, config: SloConfig, starts: Mapping[str, float] = _NONE
) -> float:
    """Seconds the forecast for ``spec`` must look ahead (see the module docstring)."""
    floor = start_s(spec, starts) + config.resize_s + interval
    return floor if config.horizon_s is None else max(floor, config.horizon_s)


def start_s(spec: ServiceSpec, starts: Mapping[str, float] = _NONE) -> float:
    """Seconds a new replica of ``spec`` takes: ``starts``'s for it (its host start,
    :func:`host_starts`), else its cold start."""
    return starts.get(spec.name, spec.cold_start_s or 0.0)


def host_starts(
    services: Mapping[str, ServiceSpec],
    cached: Mapping[int, frozenset[str]],
    host_start_s: Mapping[str, float],
    loaded: Iterable[str] = (),
) -> dict[str, float]:
    """The services a new replica of which can start from host memory now, and how
    fast: those whose model some node's cache holds (``cached``, a snapshot's) or a
    replica holds (``loaded``: evicting it, to lend its GPU, leaves the model in its
    node's memory), and whose host start (``host_start_s``) beats their cold start.

    The guard counts such a service's lent and FREE GPUs on those nodes as *warm
    within the host start*: when the host start meets its ``slo_wait_s`` it is in the
    relaxed regime, served by a reclaim (or an idle GPU) when a request comes instead
    of replicas held loaded for it. It is a count of models, not of GPUs: the
    catalog's models fit a small cache on every node (docs/benchmarks.md), and
    ATS-I takes a caching node's GPU first (``PlacementConfig.prefer_host``).
    """
    if not host_start_s:
        return {}
    models = frozenset(loaded).union(*cached.values())
    out: dict[str, float] = {}
    for name in sorted(services):
        spec = services[name]
        host = host_start_s.get(name)
        if host is not None and spec.model in models and host < (spec.cold_start_s or 0.0):
            out[name] = host
    return out


def service_needs(
    services: Mapping[str, ServiceSpec],
    histories: Mapping[str, ArrivalHistory],
    loads: Mapping[str, ServiceLoad],
    now: float,
    interval: float,
    config: SloConfig,
    capacity: int | None = None,
    starts: Mapping[str, float] = _NONE,
) -> dict[str, ServiceNeed]:
    """Each service's need, in sorted name order; services that need nothing (no
    forecast demand and no ``guaranteed_replicas``) are left out.

    When the forecast needs add up to more than ``capacity`` replicas, the pool
    cannot hold ``slo_target`` for every service: each keeps its guaranteed
    replicas, and the rest of the pool goes one replica at a time to the service
    whose next replica saves the most requests from a cold start (``rate x
    (B(n, a) - B(n + 1, a))``, Erlang B, or Hayward's for bursty arrivals), rather
    than in name order.

    Args:
        services: Every service's spec.
        histories: Arrival counts per service in fixed bins, up to ``now`` (missing:
            no arrival yet).
        loads: Recent load per service; its ``duration_s`` is the mean task duration
            (0 or missing: ``config.default_duration_s``).
        now: Current time (the oracle's schedules are read from it).
        interval: Seconds between scheduling rounds.
        config: The SLO parameters; with ``enabled`` False only the guaranteed
            replicas are needed.
        capacity: GPUs of the inference pool (None: no limit); a replica of a
            service with ``gpus_per_replica`` = k takes k of them. Needs and Erlang B
            count replicas (servers), never GPUs.
        starts: Services whose new replica starts faster than cold, and in how many
            seconds (:func:`host_starts`): their regime and horizon follow it.
    """
    wants: dict[str, int] = {}
    # name -> (rate, offered, slots, peakedness)
    rates: dict[str, tuple[float, float, int, float]] = {}
    for name in sorted(services):
        spec = services[name]
        want = 0
        if config.enabled and not relaxed(spec, config, starts):
            ahead = horizon(spec, interval, config, starts)
            schedule = config.oracle.get(name)
            if schedule is not None:
                want = schedule.peak(now, now + ahead)
            else:
                demand = _demand(name, spec, histories, loads, interval, config, starts)
                if demand is not None:
                    peak, duration = demand
                    want, z = _sized(spec, histories.get(name), peak * duration, config)
                    rates[name] = (peak, peak * duration, spec.concurrency, z)
            if spec.max_replicas:
                want = min(want, spec.max_replicas)
        wants[name] = max(want, spec.guaranteed_replicas)
    size = {name: services[name].gpus_per_replica for name in wants}
    if capacity is not None and sum(n * size[name] for name, n in wants.items()) > capacity:
        wants = _share(services, wants, rates, capacity)
    out: dict[str, ServiceNeed] = {}
    for name, hold in wants.items():
        spec = services[name]
        if hold > 0:
            prewarm = spec.slo_wait_s < start_s(spec, starts)
            out[name] = ServiceNeed(hold if prewarm else spec.guaranteed_replicas, hold)
    return out


def relaxed(spec: ServiceSpec, config: SloConfig, starts: Mapping[str, float] = _NONE) -> bool:
    """Whether ``spec`` is in the relaxed regime: even a new replica (a cold start,
    or a host start where ``starts`` has one) on a GPU reclaimed when its request
    arrives meets the SLO (see the module docstring)."""
    return spec.slo_wait_s >= start_s(spec, starts) + config.reclaim_s


def idle_need(
    services: Mapping[str, ServiceSpec],
    histories: Mapping[str, ArrivalHistory],
    loads: Mapping[str, ServiceLoad],
    interval: float,
    config: SloConfig,
    starts: Mapping[str, float] = _NONE,
    serving: Mapping[str, int] = _NO_COUNTS,
) -> int:
    """Idle inference GPUs (sleeping replicas or FREE) to keep from lending for the
    relaxed one-GPU services (``gpus_per_replica`` = 1; the others:
    :func:`idle_need_multi`), which share them: Erlang B's servers for
    ``config.idle_target`` at their pooled offered load, each service's forecast
    peak over its horizon times the GPU-seconds a request that starts a replica
    takes (its start, cold or from host memory per ``starts``, plus the mean task
    duration, over its concurrency), less the relaxed services' replicas serving
    now (``serving``). 0 with ``enabled`` off, or when no relaxed service has a
    forecast demand.

    Why less the serving ones: Erlang B counts every server, busy or idle, and a
    replica that finishes its task rejoins the pool at once (SLEEP, reusable by
    any relaxed service's next start). The pool's servers are the idle GPUs held
    plus the replicas serving, so holding the whole count idle beside them held
    the serving ones twice: on ``middle.csv`` about 3 GPUs more than the target
    needs, for the whole run (docs/benchmarks.md, issue 23).

    Args:
        services: Every service's spec.
        histories: Arrival counts per service in fixed bins (missing: none yet).
        loads: Recent load per service (``duration_s``: the mean task duration; 0 or
            missing: ``config.default_duration_s``).
        interval: Seconds between scheduling rounds.
        config: The SLO parameters.
        starts: Host starts (:func:`host_starts`), as for :func:`service_needs`.
        serving: Replicas serving a task (RUNNING, a load included) per service now;
            the relaxed services' are subtracted (missing: none).
    """
    return _idle(services, histories, loads, interval, config, starts, serving, 1)


def idle_need_multi(
    services: Mapping[str, ServiceSpec],
    histories: Mapping[str, ArrivalHistory],
    loads: Mapping[str, ServiceLoad],
    interval: float,
    config: SloConfig,
    starts: Mapping[str, float] = _NONE,
    serving: Mapping[str, int] = _NO_COUNTS,
) -> dict[int, int]:
    """:func:`idle_need` for the relaxed services whose replica spans k > 1 GPUs of one
    node: per k (ascending), the idle replicas (node sets of k GPUs, sleeping
    replicas or FREE) their shared pool needs, by Erlang B over replicas (servers)
    at their pooled offered load, less their replicas serving now (``serving``
    counts replicas). Services of one size share one pool; sizes with no need are
    left out (empty for a cluster of one-GPU services only)."""
    sizes = sorted({v.gpus_per_replica for v in services.values() if v.gpus_per_replica > 1})
    out: dict[int, int] = {}
    for k in sizes:
        n = _idle(services, histories, loads, interval, config, starts, serving, k)
        if n > 0:
            out[k] = n
    return out


def _idle(
    services: Mapping[str, ServiceSpec],
    histories: Mapping[str, ArrivalHistory],
    loads: Mapping[str, ServiceLoad],
    interval: float,
    config: SloConfig,
    starts: Mapping[str, float],
    serving: Mapping[str, int],
    size: int,
) -> int:
    """The idle replicas of the relaxed services whose replica spans ``size`` GPUs."""
    if not config.enabled or config.oracle:
        return 0
    offered = 0.0
    busy = 0
    for name in sorted(services):
        spec = services[name]
        if spec.gpus_per_replica != size or not relaxed(spec, config, starts):
            continue
        busy += serving.get(name, 0)
        demand = _demand(name, spec, histories, loads, interval, config, starts)
        if demand is None:
            continue
        peak, duration = demand
        offered += peak * (start_s(spec, starts) + duration) / max(spec.concurrency, 1)
    if offered <= 0:
        return 0
    return max(replicas_for(offered, config.idle_target, 1) - busy, 0)


class _PeakMemo:
    """``forecast(history, horizon_s, config).peak``, remembered by the history's
    identity: the guard asks again for the same history object at every event-time
    top-up until the next bin completes (``DemandLedger.histories`` hands out the same
    object meanwhile). Keyed by identity, not by value: hashing a history hashes its
    whole tuples, which cost as much as the lookup saved when a round brings a new
    one. An entry keeps its history alive, so an id is never reused while cached."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._peaks: dict[tuple[int, float, ForecastConfig], tuple[ArrivalHistory, float]] = {}

    def __call__(self, history: ArrivalHistory, horizon_s: float, config: ForecastConfig) -> float:
        key = (id(history), horizon_s, config)
        hit = self._peaks.get(key)
        if hit is not None and hit[0] is history:
            return hit[1]
        peak = forecast(history, horizon_s, config).peak
        if len(self._peaks) >= self._size:
            del self._peaks[next(iter(self._peaks))]  # the oldest entry
        self._peaks[key] = (history, peak)
        return peak


_forecast_peak = _PeakMemo(1024)


def _demand(
    name: str,
    spec: ServiceSpec,
    histories: Mapping[str, ArrivalHistory],
    loads: Mapping[str, ServiceLoad],
    interval: float,
    config: SloConfig,
    starts: Mapping[str, float],
) -> tuple[float, float] | None:
    """``name``'s forecast peak rate over its horizon and its mean task duration
    (``config.default_duration_s`` before a task finished); None before its first
    arrival."""
    history = histories.get(name)
    if history is None or not history.counts:
        return None
    peak = _forecast_peak(history, horizon(spec, interval, config, starts), config.forecast)
    load = loads.get(name)
    duration = load.duration_s if load and load.duration_s > 0 else 0.0
    return peak, duration or config.default_duration_s


def _sized(
    spec: ServiceSpec, history: ArrivalHistory | None, offered: float, config: SloConfig
) -> tuple[int, float]:
    """The replicas ``spec`` needs at ``offered`` Erlangs, and the peakedness they were
    sized for: bursty arrivals need more than Poisson ones (Hayward); Poisson-like
    ones, or any with ``burst_sizing`` off, get Erlang B's count, as always."""
    target = spec.slo_target if config.target is None else config.target
    z = burstiness(history).peakedness if config.burst_sizing else 1.0
    return replicas_for_bursts(offered, target, spec.concurrency, z), z


def _share(
    services: Mapping[str, ServiceSpec],
    wants: Mapping[str, int],
    rates: Mapping[str, tuple[float, float, int, float]],
    capacity: int,
) -> dict[str, int]:
    """``wants`` cut to ``capacity`` GPUs in all (a replica takes its service's
    ``gpus_per_replica``): the guaranteed first, then one replica at a time to the
    largest saving of cold-started requests per second among those that still fit
    (ties: name order); a service without a forecast (the oracle's) saves 1 per
    replica it still wants."""
    size = {name: services[name].gpus_per_replica for name in wants}
    held = {name: services[name].guaranteed_replicas for name in wants}
    left = capacity - sum(held[name] * size[name] for name in held)
    while left > 0:
        best, gain = "", 0.0
        for name in sorted(wants):
            n = held[name]
            if n >= wants[name] or size[name] > left:
                continue
            if name in rates:
                rate, offered, slots, z = rates[name]
                lost = blocking(n * slots, offered, z) - blocking((n + 1) * slots, offered, z)
                saved = rate * lost
            else:
                saved = 1.0
            if saved > gain:
                best, gain = name, saved
        if not best:
            break
        held[best] += 1
        left -= size[best]
    return held


def demand_schedule(
    requests: Sequence[tuple[float, float]], concurrency: int = 1
) -> DemandSchedule:
    """The exact demand of one service's requests, each ``(arrival, duration)``
    served at once on arrival: the replicas (``concurrency`` requests each) busy over
    time. An end and an arrival at the same instant hand the replica over (the end
    first)."""
    changes: list[tuple[float, int]] = []
    for arrival, duration in requests:
        changes.append((arrival, 1))
        changes.append((arrival + duration, -1))
    changes.sort(key=lambda c: (c[0], c[1]))
    times: list[float] = []
    replicas: list[int] = []
    in_flight = 0
    for t, delta in changes:
        in_flight += delta
        busy = -(-in_flight // max(concurrency, 1))
        if times and times[-1] == t:
            replicas[-1] = busy
        elif not replicas or replicas[-1] != busy:
            times.append(t)
            replicas.append(busy)
    return DemandSchedule(tuple(times), tuple(replicas))


@dataclass(frozen=True, slots=True)
class DemandView:
    """What the guard reads of one service's demand, for ``status`` to show.

    Attributes:
        forecast_rps: The forecast peak rate over its horizon (requests/s).
        dispersion: The measured index of dispersion of its one-second counts.
        peakedness: What the sizing uses (1 when within Poisson's noise).
        peak_per_s: The most arrivals seen in one second.
        sized: Replicas its forecast and burstiness ask for (before the pool's
            capacity and ``max_replicas``; 0 in the relaxed regime, where nothing
            is held warm for the SLO).
    """

    forecast_rps: float
    dispersion: float
    peakedness: float
    peak_per_s: int
    sized: int


def demand_views(
    services: Mapping[str, ServiceSpec],
    histories: Mapping[str, ArrivalHistory],
    loads: Mapping[str, ServiceLoad],
    interval: float,
    config: SloConfig,
) -> dict[str, DemandView]:
    """Each service with arrivals: its forecast, its burstiness and the replicas they
    ask for, by the functions the guard sizes with (:func:`service_needs`); sorted.
    Host starts are not known here: a service is read in its cold-start regime."""
    out: dict[str, DemandView] = {}
    for name in sorted(services):
        spec = services[name]
        demand = _demand(name, spec, histories, loads, interval, config, _NONE)
        if demand is None:
            continue
        peak, duration = demand
        b = burstiness(histories.get(name))
        sized, z = _sized(spec, histories.get(name), peak * duration, config)
        out[name] = DemandView(
            peak, b.measured, z, b.peak_per_s, 0 if relaxed(spec, config) else sized
        )
    return out
