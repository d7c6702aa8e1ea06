"""Backtest of the per-service demand forecast (issue 20) on the Alibaba GenAI 2026 trace.

How many warm replicas should a service hold for the next few minutes? Each method
predicts, at every bin boundary and from the past only, the **peak arrival rate** over
a horizon (10 and 30 minutes by default); the service then holds
``replicas_for(peak x mean duration, target)`` warm replicas through the next bin
(Erlang B: a request that finds every warm replica busy overflows to a cold start),
and the decision is made again one bin later. Methods:

* ``forecast``: ``deepboot.policies.forecast.forecast`` (a normalised EWMA level,
  blended once a day of history exists with yesterday's smoothed shape scaled to
  today's level; see that module's docstring);
* ``ewma-only``: the same forecast without its seasonal term (``season_weight`` 0):
  what yesterday adds;
* ``last-value``: the rate of the last bin;
* ``constant``: the mean rate over all history so far;
* ``hindsight``: the realised peak itself (it sees the future: a reference for what
  a perfect peak forecast would hold and get, not a method).

Per method and horizon, over every evaluated bin of every service:

* ``MAE``: mean |forecast peak - realised peak| (the realised peak is the largest
  bin count in the horizon / bin width), in requests per minute;
* ``under``: share of bins whose realised peak exceeded the forecast;
* ``warm``: share of requests that found a warm replica, by replaying the real
  arrivals and durations through the loss system with the replicas each decision
  held (a request holds a free warm replica for its real duration; one that finds
  none is a cold start and holds no warm replica);
* ``replicas``: average warm replicas held (the cost; summed over services).

The mean duration in each decision is that of the service's requests finished by
then (the past only). Evaluation starts once one season (a day) of history exists,
so every method is scored on the same bins and the forecast's seasonal term is on
throughout; services are the base models (``checkpoint_model_version_id``) with at
least ``--min-requests`` requests, and ``platform`` is every request as one service.
Rows as the simulator's loader keeps them: PENDING and model-less rows dropped,
FAILED kept (they held a GPU), 0 s runs as 0.5 s; one request holds one GPU
(concurrency 1).

The Azure LLM 2023 trace holds one hour, and the GenAI ``qps.csv`` platform shape 22
hours: both are shorter than a day, too short for a daily seasonal term, so only the
23-day request trace is backtested.

    .venv/bin/python bench/forecast_backtest.py
    .venv/bin/python bench/forecast_backtest.py --per-service     # one row per model

Needs ``../shared/traces``. Source, CC-BY-4.0: Alibaba cluster-trace-v2026-GenAI
(github.com/alibaba/clusterdata; SoCC'25 / EuroSys'26).
"""

from __future__ import annotations

import argparse
import heapq
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from deepboot.policies.forecast import (  # noqa: E402
    ArrivalHistory,
    ForecastConfig,
    RateForecast,
    constant_rate,
    forecast,
    horizon_bins,
    last_value,
    replicas_for,
)
from deepboot.sim.traces.genai import MIN_DURATION_S, Status, read_requests  # noqa: E402

TRACE = REPO.parent / "shared" / "traces" / "inference" / "alibaba-genai-2026"
REQUESTS = TRACE / "lora_request_trace.csv"
PLATFORM = "platform"
DEFAULT = ForecastConfig()
KNOBS = {
    "halflife_s": "half-life of the forecast's level (EWMA of the bin rates), s",
    "season_weight": "share of yesterday's scaled shape in each bin's forecast, 0 = level only",
    "smooth_s": "yesterday's value of a bin = mean rate within this many s of it",
    "max_ratio": "clamp of the today / yesterday level ratio that scales the shape",
}
"""The forecast's knobs a flag sets (``--halflife-s`` ...), with their help."""
METHODS = ("forecast", "ewma-only", "last-value", "constant", "hindsight")


@dataclass(frozen=True, slots=True)
class Series:
    """One service's requests on the common bin grid.

    Attributes:
        name: The base model id, or ``platform``.
        arrivals: Arrival times, seconds from the grid's start, sorted.
        durations: The requests' run times, aligned with ``arrivals``.
        counts: Arrivals per bin; bin i is ``[i x bin_s, (i + 1) x bin_s)``.
    """

    name: str
    arrivals: tuple[float, ...]
    durations: tuple[float, ...]
    counts: tuple[int, ...]


@dataclass
class Score:
    """Accumulated results of one method at one horizon over some services."""

    abs_err: float = 0.0
    under: int = 0
    decisions: int = 0
    warm: int = 0
    requests: int = 0
    replica_bins: float = 0.0
    services: set[str] = field(default_factory=set)

    def add(self, other: Score) -> None:
        self.abs_err += other.abs_err
        self.under += other.under
        self.decisions += other.decisions
        self.warm += other.warm
        self.requests += other.requests
        self.replica_bins += other.replica_bins
        self.services |= other.services


def load_series(path: Path, bin_s: float, min_requests: int) -> tuple[list[Series], Series]:
    """The busy services' series and the platform's, on one grid of ``bin_s`` bins."""
    rows = [
        r
        for r in read_requests(path)
        if r.status is not Status.PENDING and r.model  # as the simulator's loader
    ]
    rows.sort(key=lambda r: (r.arrival, r.line))
    t0 = (rows[0].arrival // bin_s) * bin_s
    nbins = int((rows[-1].arrival - t0) // bin_s) + 1

    by_model: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        d = r.exec_s if r.exec_s > 0.0 else MIN_DURATION_S
        by_model.setdefault(r.model, []).append((r.arrival - t0, d))
    every = [(r.arrival - t0, r.exec_s if r.exec_s > 0.0 else MIN_DURATION_S) for r in rows]

    def build(name: str, reqs: list[tuple[float, float]]) -> Series:
        counts = Counter(int(a // bin_s) for a, _ in reqs)
        return Series(
            name,
            tuple(a for a, _ in reqs),
            tuple(d for _, d in reqs),
            tuple(counts.get(i, 0) for i in range(nbins)),
        )

    sizes = Counter({m: len(v) for m, v in by_model.items()})
    busy = [
        m for m, k in sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0])) if k >= min_requests
    ]
    return [build(m, by_model[m]) for m in busy], build(PLATFORM, every)


Method = Callable[[int], tuple[float, ...]]
"""Per-bin expected rates over the longest horizon, decided at bin boundary t."""


def methods(s: Series, config: ForecastConfig, hmax: int) -> dict[str, Method]:
    """Each method as a function of the decision's bin index (the past is
    ``counts[:t]``, ending at ``t x bin_s``)."""
    b = config.bin_s
    keep = config.history_bins
    horizon = hmax * b

    def bins(f: RateForecast) -> tuple[float, ...]:
        return f.bins

    def ours(t: int) -> tuple[float, ...]:
        return bins(
            forecast(ArrivalHistory(b, s.counts[max(0, t - keep) : t], t * b), horizon, config)
        )

    flat = replace(config, season_weight=0.0)

    def ewma(t: int) -> tuple[float, ...]:
        return bins(
            forecast(ArrivalHistory(b, s.counts[max(0, t - keep) : t], t * b), horizon, flat)
        )

    def last(t: int) -> tuple[float, ...]:
        return bins(last_value(ArrivalHistory(b, s.counts[t - 1 : t], t * b), horizon))

    def const(t: int) -> tuple[float, ...]:
        return bins(constant_rate(ArrivalHistory(b, s.counts[:t], t * b), horizon))

    def hindsight(t: int) -> tuple[float, ...]:
        return tuple(c / b for c in s.counts[t : t + hmax])

    return {
        "forecast": ours,
        "ewma-only": ewma,
        "last-value": last,
        "constant": const,
        "hindsight": hindsight,
    }


def replay(s: Series, held: Sequence[int], first: int, bin_s: float) -> tuple[int, int]:
    """Requests of bins ``first .. first + len(held) - 1`` through the loss system with
    ``held[i]`` warm replicas during bin ``first + i``: (warm hits, requests)."""
    busy: list[float] = []  # finish times of the requests on warm replicas
    warm = total = 0
    lo, hi = first * bin_s, (first + len(held)) * bin_s
    for a, d in zip(s.arrivals, s.durations, strict=True):
        if not lo <= a < hi:
            continue
        total += 1
        while busy and busy[0] <= a:
            heapq.heappop(busy)
        if len(busy) < held[int(a // bin_s) - first]:
            warm += 1
            heapq.heappush(busy, a + d)
    return warm, total


def backtest(
    s: Series, config: ForecastConfig, horizons: Sequence[int], target: float
) -> dict[tuple[str, int], Score]:
    """Every method at every horizon (in bins) on one service."""
    b = config.bin_s
    hmax = max(horizons)
    first = config.season_bins + 1
    last = len(s.counts) - hmax  # the last decision whose horizon is in the trace
    finished = sorted((a + d, d) for a, d in zip(s.arrivals, s.durations, strict=True))
    fns = methods(s, config, hmax)
    held: dict[tuple[str, int], list[int]] = {(m, h): [] for m in fns for h in horizons}
    scores = {(m, h): Score(services={s.name}) for m in fns for h in horizons}
    done, dsum = 0, 0.0
    for t in range(first, last + 1):
        while done < len(finished) and finished[done][0] <= t * b:
            dsum += finished[done][1]
            done += 1
        duration = dsum / done if done else 0.0
        for m, fn in fns.items():
            rates = fn(t)
            for h in horizons:
                peak = max(rates[:h])
                real = max(s.counts[t : t + h]) / b
                sc = scores[m, h]
                sc.abs_err += abs(peak - real)
                sc.under += real > peak
                sc.decisions += 1
                n = replicas_for(peak * duration, target)
                held[m, h].append(n)
                sc.replica_bins += n
    for (m, h), sc in scores.items():
        sc.warm, sc.requests = replay(s, held[m, h], first, b)
    return scores


def table(
    title: str, rows: dict[tuple[str, str, int], Score], horizons: Sequence[int], bin_s: float
) -> Table:
    """One row per (scope, horizon, method)."""
    out = Table(title=title)
    for col in ("scope", "horizon", "method", "MAE (req/min)", "under", "warm", "replicas"):
        out.add_column(col, justify="left" if col in ("scope", "method") else "right")
    scopes = list(dict.fromkeys(scope for scope, _, _ in rows))
    for scope in scopes:
        for h in horizons:
            for m in METHODS:
                sc = rows[scope, m, h]
                bins_per_service = sc.decisions / max(1, len(sc.services))
                out.add_row(
                    scope,
                    f"{h * bin_s / 60:g} min",
                    m,
                    f"{60.0 * sc.abs_err / sc.decisions:.3f}",
                    f"{sc.under / sc.decisions:.1%}",
                    f"{sc.warm / max(1, sc.requests):.2%}",
                    f"{sc.replica_bins / bins_per_service:.2f}",
                )
            out.add_section()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trace", type=Path, default=REQUESTS, help="lora_request_trace.csv")
    parser.add_argument(
        "--bin-s", type=float, default=300.0, help="bin width and decision period, s (300)"
    )
    parser.add_argument(
        "--horizons-min",
        type=float,
        nargs="+",
        default=[10.0, 30.0],
        help="horizons the peak is forecast over, minutes (10 30)",
    )
    parser.add_argument(
        "--target",
        type=float,
        default=0.99,
        help="share of arrivals that should find a warm replica, per Erlang B (0.99)",
    )
    parser.add_argument(
        "--min-requests",
        type=int,
        default=500,
        help="a base model with at least this many requests is a service (500)",
    )
    for name, text in KNOBS.items():
        parser.add_argument(
            "--" + name.replace("_", "-"),
            type=float,
            default=getattr(DEFAULT, name),
            help=f"{text} (%(default)g)",
        )
    parser.add_argument("--per-service", action="store_true", help="also one row group per service")
    args = parser.parse_args(argv)
    config = replace(DEFAULT, bin_s=args.bin_s, **{name: getattr(args, name) for name in KNOBS})
    horizons = sorted({horizon_bins(m * 60.0, config.bin_s) for m in args.horizons_min})
    services, platform = load_series(args.trace, config.bin_s, args.min_requests)
    rows: dict[tuple[str, str, int], Score] = {}
    scope = f"{len(services)} services"
    for s in services:
        for (m, h), sc in backtest(s, config, horizons, args.target).items():
            rows.setdefault((scope, m, h), Score()).add(sc)
            if args.per_service:
                rows[s.name, m, h] = sc
    for (m, h), sc in backtest(platform, config, horizons, args.target).items():
        rows[PLATFORM, m, h] = sc
    console = Console()
    console.print(
        table(
            f"Peak-rate forecast backtest, Alibaba GenAI 2026 ({args.bin_s:g} s bins, "
            f"target {args.target})",
            rows,
            horizons,
            config.bin_s,
        )
    )
    console.print(
        f"{config}\nwarm = requests that found a warm replica; replicas = average held "
        "(summed over services). The Azure LLM 2023 trace (one hour) and qps.csv "
        "(22 hours) are shorter than a day: too short for a daily seasonal term."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
