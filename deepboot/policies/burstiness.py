"""How bursty a service's arrivals are, and how many replicas bursts need (issue 45).

**Measured.** The world counts each service's arrivals per one-second window and
keeps, per bin of the forecast's history, the sum of those counts squared and the
largest (:class:`~deepboot.policies.forecast.ArrivalHistory`'s ``squares`` and
``peaks``); the last hour of them is read (:data:`WINDOW_S`). The index of
dispersion of one-second counts (variance over mean) is pooled *within* bins, so
that a rate that changes from bin to bin (a ramp, a day) does not read as
burstiness: with ``c_b`` arrivals and ``q_b`` their squares in a bin of ``S``
seconds,

    D = sum_b (q_b - c_b^2 / S) / sum_b c_b (S - 1) / S,

whose expectation is exactly 1 for Poisson arrivals of any rate, constant within
each bin (``E[q_b] = S(lambda + lambda^2)``, ``E[c_b^2] = S lambda + S^2 lambda^2``).
Its standard deviation under Poisson arrivals follows from ``Var[(x - mu)^2] = mu +
2 mu^2`` for a Poisson count of mean ``mu``: ``sqrt(sum_b (c_b + 2 c_b^2 / S)) /
sum_b c_b (S - 1) / S``, about ``sqrt(2 / seconds)`` at high rates and ``1 /
sqrt(arrivals)`` at low ones. A measured ``D`` within :data:`SIGMAS` of those of 1,
or under it, counts as 1: a service whose traffic looks Poisson is sized exactly as
before (every golden unchanged).

**Sized.** Hayward's approximation (A. A. Fredericks, "Congestion in blocking
systems: a simple approximation technique", Bell System Technical Journal 59(6),
1980; the form used in teletraffic engineering for peaked overflow traffic): a loss
system offered a load ``a`` of peakedness ``z`` blocks as Erlang B does with ``n /
z`` servers and load ``a / z``. For compound Poisson arrivals (batches arriving at
random), the peakedness of the offered load equals the index of dispersion of the
arrival counts, ``E[B^2] / E[B]`` for batch size ``B`` (Cox and Lewis 1966, ch. 4),
so the measured ``D`` is used as ``z``. Erlang B at a non-integer number of servers
is interpolated linearly between its neighbours (the usual way Hayward's
approximation is applied). With ``z = 1`` it is Erlang B itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from deepboot.policies.forecast import MAX_REPLICAS, ArrivalHistory, erlang_b, replicas_for

SIGMAS = 4.0
"""How far above 1 a measured dispersion must be, in its sampling standard deviations
under Poisson arrivals, to count: below, the traffic is sized as Poisson."""

WINDOW_S = 3600.0
"""The burstiness is measured over the history's last hour (its most recent bins):
recent enough to follow a change of traffic, long enough to hold thousands of
arrivals at a few per second (and a bound on the work of each tick)."""

MIN_ARRIVALS = 30
"""Fewer arrivals in the history than this: not measured (counts as 1)."""

MAX_PEAKEDNESS = 1000.0
"""The largest peakedness sized for (a guard against a degenerate history)."""


@dataclass(frozen=True, slots=True)
class Burstiness:
    """A service's measured burstiness.

    Attributes:
        measured: The pooled within-bin index of dispersion of one-second counts
            (1.0 when not measured: no per-second counts, too few arrivals, bins
            under 2 s).
        peakedness: What the sizing uses: ``measured`` when it is above 1 by more
            than its sampling spread under Poisson arrivals, else 1.
        peak_per_s: The most arrivals seen in one second over the history.
    """

    measured: float = 1.0
    peakedness: float = 1.0
    peak_per_s: int = 0


POISSON = Burstiness()
"""Arrivals sized as Poisson (nothing measured, or nothing beyond its noise)."""


def burstiness(history: ArrivalHistory | None) -> Burstiness:
    """The burstiness of ``history`` (see the module docstring)."""
    if history is None or not history.squares or history.bin_s < 2.0:
        return POISSON
    width = history.bin_s
    recent = max(1, math.ceil(WINDOW_S / width))
    num = den = var = 0.0
    arrivals = 0
    for c, q in zip(history.counts[-recent:], history.squares[-recent:], strict=True):
        if c <= 0:
            continue
        arrivals += c
        num += q - c * c / width
        den += c * (width - 1.0) / width
        var += c + 2.0 * c * c / width
    peak = max(history.peaks[-recent:], default=0)
    if arrivals < MIN_ARRIVALS or den <= 0.0:
        return Burstiness(1.0, 1.0, peak)
    measured = max(num / den, 0.0)
    beyond_noise = measured > 1.0 + SIGMAS * math.sqrt(var) / den
    z = min(measured, MAX_PEAKEDNESS) if beyond_noise else 1.0
    return Burstiness(measured, z, peak)


def blocking(servers: float, offered: float, peakedness: float = 1.0) -> float:
    """Hayward's blocking of ``servers`` offered ``offered`` Erlangs of peakedness
    ``peakedness``: Erlang B at ``servers / z`` servers (interpolated) and ``offered /
    z`` Erlangs; Erlang B itself at ``z = 1`` and a whole number of servers."""
    if peakedness == 1.0 and float(servers).is_integer():
        return erlang_b(int(servers), offered)
    n = servers / peakedness
    a = offered / peakedness
    low = math.floor(n)
    b_low = erlang_b(low, a)
    if n == low:
        return b_low
    return b_low + (n - low) * (erlang_b(low + 1, a) - b_low)


def replicas_for_bursts(
    offered: float, target: float, concurrency: int = 1, peakedness: float = 1.0
) -> int:
    """Warm replicas so that an arrival finds a free slot with ``target``, for
    arrivals of ``peakedness`` (Hayward): :func:`replicas_for` at ``z <= 1``, else
    the smallest ``n`` with ``1 - blocking(n x concurrency, offered, z) >= target``.

    Raises:
        ValueError: as :func:`replicas_for`, or more than ``MAX_REPLICAS`` needed.
    """
    if peakedness <= 1.0:
        return replicas_for(offered, target, concurrency)
    replicas_for(offered, target, concurrency)  # its argument checks
    if offered <= 0.0 or target <= 0.0:
        return 0
    a = offered / peakedness
    b = [1.0]  # Erlang B at 0, 1, 2, ... servers, by its recursion, as far as needed
    for n in range(1, MAX_REPLICAS + 1):
        x = n * concurrency / peakedness
        while len(b) <= math.ceil(x):
            ab = a * b[-1]
            b.append(ab / (len(b) + ab))
        low = math.floor(x)
        blocked = b[low] if x == low else b[low] + (x - low) * (b[low + 1] - b[low])
        if 1.0 - blocked >= target:
            return n
    raise ValueError(f"more than {MAX_REPLICAS} replicas needed for {offered:g} Erlangs")
