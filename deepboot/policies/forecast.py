"""Per-service demand forecast and the Erlang B loss model (issue 20, SLO-guarded lending).

A request that finds every warm replica of its service busy does not queue: it
overflows to a cold start (ALGORITHMS.md §5.2). The warm replicas a service needs are
then those of a loss system, M/G/c/c, whose blocking probability is Erlang B and does
not depend on the service-time distribution (only on its mean). :func:`erlang_b` and
:func:`replicas_for` give that count for an offered load; :func:`forecast` gives the
arrival rate to put into it, from the service's binned arrival history.

**The forecast** (:func:`forecast`), in expected arrivals per second:

* ``level``: an exponentially weighted mean of the binned rates (half-life
  ``halflife_s``), normalised by the sum of its weights, so that a short history is
  not pulled towards 0; only the last ``ceil(LEVEL_HALFLIVES x halflife_s / bin_s)``
  bins are read (older weights are below 2**-8 of the newest).
* Once the history holds more than one full season (``season_s``, a day by default),
  each bin ``j`` of the horizon also gets a seasonal-naive value: the mean rate of the
  bins one season earlier within ``smooth_s`` of that bin (a centred window: one
  season ago both sides are in the past), scaled by ``level / level_then``, the ratio
  of today's level to the level a season ago (clamped to ``[1 / max_ratio,
  max_ratio]``, with ``prior_rate`` added to both levels so that a night of zeros does
  not make it infinite). The scaling carries yesterday's *shape* (the morning ramp)
  at today's *volume* (a weekday after a weekend). The bin's forecast is
  ``(1 - season_weight) x level + season_weight x seasonal``.
* Without a full season, every bin of the horizon is ``level``.
* ``peak`` is the largest bin forecast over the horizon; ``rate`` is the first one.

Why this method: the GenAI trace's services are diurnal (~20x peak to trough) and
sparse (the busiest one sees ~1.2 arrivals per 5 minutes on average), so a single bin
is mostly Poisson noise (the last-value baseline chases it), a long mean misses the
day (the constant-rate baseline), and a per-bin seasonal-naive copy of yesterday is
noise too; the smoothed, level-scaled season is the part of yesterday that predicts
today. ``bench/forecast_backtest.py`` measures it against both baselines.

Everything here is a pure function of immutable values: no clock or randomness is
read, nothing is mutated, and the arithmetic is plain IEEE float operations in a fixed
order plus :mod:`deepboot.perf.detmath` (the same bits on every machine).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from deepboot.perf import detmath
from deepboot.policies.registration import MAX_DELAY_S, require

MAX_REPLICAS = 1_000_000
"""Most replicas :func:`replicas_for` searches before it gives up."""
MAX_HORIZON_BINS = 100_000
"""Most bins a forecast's horizon may span."""
MAX_HISTORY_BINS = 1_000_000
"""Most bins a forecast may read (:attr:`ForecastConfig.history_bins`)."""
LEVEL_HALFLIVES = 8
"""Half-lives of history the level reads (older weights are below 2**-8)."""
LN2 = 0.6931471805599453
"""ln 2 as a literal (math.log is not deterministic across C libraries)."""


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True, slots=True)
class ArrivalHistory:
    """Arrivals of one service, counted in consecutive bins of equal width.

    Attributes:
        bin_s: Bin width, seconds (finite, > 0).
        counts: Arrivals per bin, oldest first; the last bin is the most recent
            complete one. May be empty (no history yet).
        end: Virtual time at which the last bin ends (finite); bin ``i`` covers
            ``(end - (len(counts) - i) x bin_s, end - (len(counts) - i - 1) x bin_s]``.
        squares: Per bin, the sum over its one-second windows of their arrival
            counts squared (with ``counts``, the within-bin variance of one-second
            counts: :mod:`deepboot.policies.burstiness`); empty when not measured.
        peaks: Per bin, the most arrivals in one of its one-second windows; empty
            when not measured.

    Raises:
        ValueError: ``bin_s`` not finite and positive, ``end`` not finite, ``counts``
            not a tuple of non-negative ints.
    """

    bin_s: float
    counts: tuple[int, ...]
    end: float
    squares: tuple[int, ...] = ()
    peaks: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("squares", "peaks"):
            extra = getattr(self, name)
            if extra and len(extra) != len(self.counts):
                raise ValueError(f"{name} must have one entry per bin, or none")
        if not (math.isfinite(self.bin_s) and self.bin_s > 0.0):
            raise ValueError(f"bin_s must be finite and > 0 seconds; got {self.bin_s}")
        if not math.isfinite(self.end):
            raise ValueError(f"end must be a finite time; got {self.end}")
        if not isinstance(self.counts, tuple):
            raise ValueError(f"counts must be a tuple; got {type(self.counts).__name__}")
        # The common case at C speed; the loop only names the first bad bin.
        if not all(type(c) is int for c in self.counts) or min(self.counts, default=0) < 0:
            for i, c in enumerate(self.counts):
                if not _is_count(c):
                    raise ValueError(f"counts[{i}] must be a non-negative int; got {c!r}")

    @property
    def start(self) -> float:
        """Virtual time at which the first bin starts."""
        return self.end - len(self.counts) * self.bin_s


@dataclass(frozen=True, slots=True)
class RateForecast:
    """Expected arrival rates (arrivals per second) after ``history.end``.

    Attributes:
        rate: The expected rate now: in the first bin of the horizon.
        peak: The largest expected rate over the horizon, ``max(bins)``.
        bins: The expected rate in each bin of the horizon, in time order.
        seasonal: Whether the seasonal term was used (a full season of history).
    """

    rate: float
    peak: float
    bins: tuple[float, ...]
    seasonal: bool = False


@dataclass(frozen=True, slots=True)
class ForecastConfig:
    """Parameters of :func:`forecast` (see the module docstring for the method).

    Attributes:
        bin_s: The bin width the histories are kept at, seconds (> 0); ``season_s``
            and ``smooth_s`` are whole multiples of it.
        halflife_s: Half-life of the level's exponential weights, seconds (> 0).
        season_s: The season, seconds (a whole number of bins); the seasonal term is
            used only once the history holds more than one season.
        season_weight: In [0, 1]: the seasonal term's share of each bin's forecast
            (0: the level alone).
        smooth_s: The seasonal value of a bin is the mean rate of the bins within
            this many seconds of it one season earlier (a whole number of bins, >= 0).
        max_ratio: The level ratio (today / a season ago) is clamped to
            ``[1 / max_ratio, max_ratio]`` (>= 1).
        prior_rate: Added to both levels of that ratio, arrivals/s (> 0): the rate
            below which a level counts as "quiet" rather than as a ratio's divisor.

    Raises:
        ConfigError: naming the first invalid field.
    """

    bin_s: float = 300.0
    halflife_s: float = 1800.0
    season_s: float = 86_400.0
    season_weight: float = 0.5
    smooth_s: float = 1800.0
    max_ratio: float = 4.0
    prior_rate: float = 1.0 / 3600.0

    def __post_init__(self) -> None:
        for name in ("bin_s", "halflife_s", "season_s"):
            value = getattr(self, name)
            require(
                math.isfinite(value) and 0.0 < value <= MAX_DELAY_S,
                name,
                f"must be in (0, {MAX_DELAY_S:g}] seconds; got {value}",
            )
        require(
            0.0 <= self.season_weight <= 1.0,
            "season_weight",
            f"must be in [0, 1]; got {self.season_weight}",
        )
        require(
            math.isfinite(self.smooth_s) and 0.0 <= self.smooth_s < self.season_s / 2.0,
            "smooth_s",
            f"must be in [0, season_s / 2) seconds; got {self.smooth_s}",
        )
        for name in ("season_s", "smooth_s"):
            value = getattr(self, name)
            require(
                _whole_bins(value, self.bin_s) is not None,
                name,
                f"must be a whole number of bins of {self.bin_s:g} s; got {value}",
            )
        require(
            math.isfinite(self.max_ratio) and self.max_ratio >= 1.0,
            "max_ratio",
            f"must be finite and >= 1; got {self.max_ratio}",
        )
        require(
            math.isfinite(self.prior_rate) and self.prior_rate > 0.0,
            "prior_rate",
            f"must be finite and > 0 arrivals/s; got {self.prior_rate}",
        )
        require(
            self.history_bins <= MAX_HISTORY_BINS,
            "bin_s",
            f"of {self.bin_s:g} s makes a forecast read {self.history_bins} bins, more "
            f"than {MAX_HISTORY_BINS}",
        )

    @property
    def season_bins(self) -> int:
        """Bins in one season."""
        return _bins(self.season_s, self.bin_s)

    @property
    def smooth_bins(self) -> int:
        """Bins on each side of a seasonal value's window."""
        return _bins(self.smooth_s, self.bin_s)

    @property
    def level_bins(self) -> int:
        """Bins the level reads (the newest ``LEVEL_HALFLIVES`` half-lives)."""
        return max(1, math.ceil(LEVEL_HALFLIVES * self.halflife_s / self.bin_s))

    @property
    def history_bins(self) -> int:
        """How many of the newest bins :func:`forecast` reads, whatever the horizon:
        a history kept this long gives the same forecast as any longer one."""
        return self.season_bins + max(self.level_bins, self.smooth_bins)


def _whole_bins(value: float, bin_s: float) -> int | None:
    """``value / bin_s`` when it is (within 1e-9 relative) a whole number, else None."""
    q = value / bin_s
    n = round(q)
    return n if abs(q - n) <= 1e-9 * max(1.0, q) else None


def _bins(value: float, bin_s: float) -> int:
    n = _whole_bins(value, bin_s)
    assert n is not None  # validated by ForecastConfig
    return n


def horizon_bins(horizon_s: float, bin_s: float) -> int:
    """Bins of width ``bin_s`` that cover ``horizon_s`` (rounded up, at least 1).

    Raises:
        ValueError: ``horizon_s`` not finite and > 0, or more than MAX_HORIZON_BINS bins.
    """
    if not (math.isfinite(horizon_s) and horizon_s > 0.0):
        raise ValueError(f"horizon_s must be finite and > 0 seconds; got {horizon_s}")
    n = max(1, math.ceil(horizon_s / bin_s - 1e-9))
    if n > MAX_HORIZON_BINS:
        raise ValueError(f"horizon_s spans {n} bins, more than {MAX_HORIZON_BINS}")
    return n


def erlang_b(servers: int, offered: float) -> float:
    """Erlang B: the probability that an arrival finds all ``servers`` busy.

    The loss system M/G/n/n with offered load ``offered`` = arrival rate x mean
    service time, in Erlangs. Computed by the stable recursion ``B(0) = 1``,
    ``B(k) = a B(k-1) / (k + a B(k-1))`` (no factorials, no overflow), O(servers).

    Args:
        servers: n >= 0.
        offered: a >= 0, finite.

    Returns:
        B(n, a) in [0, 1]: 1 when n == 0, 0 when a == 0 and n >= 1.

    Raises:
        ValueError: ``servers`` not a non-negative int, or ``offered`` negative or
            not finite.
    """
    if not _is_count(servers):
        raise ValueError(f"servers must be a non-negative int; got {servers!r}")
    if not (math.isfinite(offered) and offered >= 0.0):
        raise ValueError(f"offered load must be finite and >= 0 Erlangs; got {offered}")
    b = 1.0
    for k in range(1, servers + 1):
        ab = offered * b
        b = ab / (k + ab)
    return b


def replicas_for(offered: float, target: float, concurrency: int = 1) -> int:
    """Warm replicas a service needs so an arrival finds a free slot with ``target``.

    Each replica serves ``concurrency`` requests at once (``concurrency`` servers of
    the loss system), so n replicas give ``n x concurrency`` servers. A request that
    finds them all busy overflows to a cold start (it does not queue). Dividing the
    load by ``concurrency`` and counting replicas as servers instead, as
    ALGORITHMS.md §5.2 writes it, models one server c times as fast, busy whenever
    one request is in it: it overstates the blocking (``B(1, 0.5) = 1/3`` for one
    replica of concurrency 2 at 1 Erlang, against ``B(2, 1) = 1/5`` here).

    Args:
        offered: Offered load in Erlangs (rate x mean service time), finite, >= 0.
        target: Required probability ``1 - B(n x concurrency, offered)`` that an
            arriving request finds a free slot, in [0, 1).
        concurrency: Requests one replica serves at once, >= 1.

    Returns:
        The smallest n >= 0 with ``1 - erlang_b(n x concurrency, offered) >= target``;
        0 when ``offered`` is 0 (nothing arrives; the recursion's B(0, 0) = 1 is a
        convention, not a loss) or ``target`` is 0.

    Raises:
        ValueError: an argument out of range, or more than MAX_REPLICAS needed.
    """
    if not (math.isfinite(offered) and offered >= 0.0):
        raise ValueError(f"offered load must be finite and >= 0 Erlangs; got {offered}")
    if not 0.0 <= target < 1.0:
        raise ValueError(f"target must be in [0, 1) (1 needs infinitely many); got {target}")
    if not (_is_count(concurrency) and concurrency >= 1):
        raise ValueError(f"concurrency must be an int >= 1; got {concurrency!r}")
    if offered == 0.0 or target == 0.0:
        return 0
    b, k = 1.0, 0
    for n in range(1, MAX_REPLICAS + 1):
        for _ in range(concurrency):
            k += 1
            ab = offered * b
            b = ab / (k + ab)
        if 1.0 - b >= target:
            return n
    raise ValueError(
        f"more than {MAX_REPLICAS} replicas of concurrency {concurrency} needed for "
        f"{offered:g} Erlangs at target {target}"
    )


def _level(rates: tuple[float, ...], hi: int, width: int, decay: float) -> float | None:
    """Normalised exponentially weighted mean of ``rates[hi - width:hi]`` (newest
    weight 1, each older one ``decay`` times the next); None when the slice is empty."""
    num = den = 0.0
    for i in range(max(0, hi - width), hi):
        num = num * decay + rates[i]
        den = den * decay + 1.0
    return num / den if den > 0.0 else None


def _window_mean(rates: tuple[float, ...], lo: int, hi: int) -> float:
    """Mean of ``rates[lo:hi + 1]`` clipped to the valid indices (``lo <= hi``)."""
    lo, hi = max(lo, 0), min(hi, len(rates) - 1)
    total = 0.0
    for i in range(lo, hi + 1):
        total += rates[i]
    return total / (hi - lo + 1)


def forecast(history: ArrivalHistory, horizon_s: float, config: ForecastConfig) -> RateForecast:
    """Expected arrival rate of one service over ``(end, end + horizon_s]``.

    See the module docstring for the method. Reads only the newest
    ``config.history_bins`` bins. An empty history forecasts 0.

    Args:
        history: The service's arrivals; ``history.bin_s`` must equal
            ``config.bin_s``. Not mutated.
        horizon_s: Seconds ahead to cover (finite, > 0; rounded up to whole bins).
        config: The forecast's parameters.

    Returns:
        The per-bin expected rates over the horizon, their first (``rate``) and their
        largest (``peak``), all >= 0.

    Raises:
        ValueError: the bin widths differ, or ``horizon_s`` is invalid.
    """
    if history.bin_s != config.bin_s:
        raise ValueError(
            f"history bins of {history.bin_s:g} s, but the forecast is configured for "
            f"{config.bin_s:g} s bins"
        )
    h = horizon_bins(horizon_s, config.bin_s)
    keep = config.history_bins
    counts = history.counts[-keep:] if keep < len(history.counts) else history.counts
    n = len(counts)
    if n == 0:
        return RateForecast(0.0, 0.0, (0.0,) * h)
    inv_bin = 1.0 / config.bin_s
    rates = tuple(c * inv_bin for c in counts)
    decay = detmath.exp_scalar(-LN2 * config.bin_s / config.halflife_s)
    width = config.level_bins
    level = _level(rates, n, width, decay)
    assert level is not None  # n >= 1
    season = config.season_bins
    if config.season_weight == 0.0 or n <= season:
        return RateForecast(level, level, (level,) * h)
    then = _level(rates, n - season, width, decay)
    assert then is not None  # n - season >= 1
    ratio = (level + config.prior_rate) / (then + config.prior_rate)
    ratio = min(config.max_ratio, max(1.0 / config.max_ratio, ratio))
    k = config.smooth_bins
    w = config.season_weight
    bins = []
    for j in range(h):
        # One season before horizon bin j (a horizon longer than a season repeats
        # it); the window is clipped to the history at both ends.
        at = n - season + j % season
        seasonal = _window_mean(rates, at - k, at + k) * ratio
        bins.append((1.0 - w) * level + w * seasonal)
    return RateForecast(bins[0], max(bins), tuple(bins), seasonal=True)


def last_value(history: ArrivalHistory, horizon_s: float) -> RateForecast:
    """Baseline: the rate of the newest bin, flat over the horizon (0 when empty).

    Raises:
        ValueError: ``horizon_s`` is invalid.
    """
    h = horizon_bins(horizon_s, history.bin_s)
    rate = history.counts[-1] / history.bin_s if history.counts else 0.0
    return RateForecast(rate, rate, (rate,) * h)


def constant_rate(history: ArrivalHistory, horizon_s: float) -> RateForecast:
    """Baseline: the mean rate over the whole history, flat over the horizon (0 when
    empty).

    Raises:
        ValueError: ``horizon_s`` is invalid.
    """
    h = horizon_bins(horizon_s, history.bin_s)
    n = len(history.counts)
    rate = sum(history.counts) / (n * history.bin_s) if n else 0.0
    return RateForecast(rate, rate, (rate,) * h)
