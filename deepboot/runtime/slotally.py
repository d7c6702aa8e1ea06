"""Each service's SLO attainment as the router measures it: requests within and over
their service's ``slo_wait_s``, since the controller started and over a recent window.

Which requests count, and where (the router decides, :mod:`deepboot.runtime.http.dispatch`;
the controller tallies here what it reports):

- a request's *wait* runs from its arrival at the router (its body read) to its last
  hand-off to a ready replica: queueing, a cold start, a reclaim of a lent GPU and a
  retry after a replica died all fall inside it;
- a request handed to a replica within ``slo_wait_s`` counts as *within*, whatever the
  replica then answers (the SLO bounds the wait, not the handler: a 500 of the
  service's own code is within when it came in time);
- every other answered request counts as *over*: handed to a replica late, or never
  handed to one at all (the queue full, 503; no replica within ``request_timeout_s``,
  503; the handler failing to load, 502; the client gone while queued, 499). A request
  the front door refused before it was queued (401, 404, 408, 409, 413, 415) is no
  request of the service and is not counted.

Pure: times are passed in (the controller's injected clock), nothing here reads one.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, NamedTuple

WINDOW_S = 300.0
"""The recent window of ``deepboot status``: the last 5 minutes."""
BUCKET_S = 10.0
"""The window's resolution: counts are kept in buckets this wide, aligned to time 0."""
WAIT_BINS_PER_DECADE = 20
"""Resolution of the recent p99 wait: waits are counted in geometric bins, 20 to a
decade (each 12% wider than the last), from :data:`WAIT_FLOOR_S` up; the p99 is the
upper edge of its bin, so it errs high by at most 12%."""
WAIT_FLOOR_S = 1e-3
"""Waits below a millisecond count in the first bin."""
_WAIT_BINS = 6 * WAIT_BINS_PER_DECADE + 2  # bins 0..120: up to 1000 s; 121: the rest


def wait_bin(seconds: float) -> int:
    """The bin of a wait (see :data:`WAIT_BINS_PER_DECADE`)."""
    if not seconds > WAIT_FLOOR_S:  # NaN, negative and tiny waits alike
        return 0
    k = math.ceil(math.log10(seconds / WAIT_FLOOR_S) * WAIT_BINS_PER_DECADE - 1e-9)
    return min(max(k, 0), _WAIT_BINS - 1)


def bin_upper(k: int) -> float:
    """The upper edge of wait bin ``k`` (seconds; the last bin's is infinite)."""
    if k >= _WAIT_BINS - 1:
        return math.inf
    return float(WAIT_FLOOR_S * 10.0 ** (k / WAIT_BINS_PER_DECADE))


def wait_header(seconds: float) -> str:
    """``X-Wait-Ms``: a wait in milliseconds, to the microsecond (never negative)."""
    return f"{max(seconds, 0.0) * 1000.0:.3f}"


class ServiceSlo(NamedTuple):
    """A service's SLO as the controller applies it: its ``slo_wait_s``, and its
    ``slo_target`` or ``--slo-target``'s override of every service's."""

    wait_s: float
    target: float


@dataclass(frozen=True, slots=True)
class Attainment:
    """Requests within and over the SLO, and their ratio."""

    within: int = 0
    over: int = 0

    @property
    def total(self) -> int:
        return self.within + self.over

    @property
    def attainment(self) -> float | None:
        """``within / (within + over)``; None before any request."""
        return self.within / self.total if self.total else None

    def to_json(self) -> dict[str, Any]:
        ratio = self.attainment
        return {
            "within": self.within,
            "over": self.over,
            "attainment": None if ratio is None else round(ratio, 6),
        }

    def __add__(self, other: Attainment) -> Attainment:
        return Attainment(self.within + other.within, self.over + other.over)


class SloTally:
    """Within/over counts per service: since the start, and in buckets of ``bucket_s``
    seconds over the last ``window_s`` (mutable; the controller's own).

    Memory is bounded: at most ``window_s / bucket_s + 1`` buckets per service, however
    many requests come. The recent window is "the bucket in progress and the ones
    before it that fall inside ``window_s``", so it spans between ``window_s -
    bucket_s`` and ``window_s`` seconds.

    Args:
        window_s: The recent window (> 0).
        bucket_s: Bucket width (> 0, at most ``window_s``).

    Raises:
        ValueError: a bad width.
    """

    def __init__(self, window_s: float = WINDOW_S, bucket_s: float = BUCKET_S) -> None:
        if not (math.isfinite(window_s) and math.isfinite(bucket_s) and 0 < bucket_s <= window_s):
            raise ValueError(f"need 0 < bucket_s <= window_s; got {bucket_s}, {window_s}")
        self.window_s = window_s
        self.bucket_s = bucket_s
        self.buckets = math.ceil(window_s / bucket_s)  # buckets the window spans
        self._total: dict[str, Attainment] = {}
        # service -> [bucket index, within, over, *wait bins], oldest first, at most
        # `buckets` of them
        self._recent: dict[str, deque[list[int]]] = {}

    def record(self, service: str, within: bool, now: float, wait: float | None = None) -> None:
        """One answered request of ``service`` at ``now`` that waited ``wait`` seconds
        (None: not measured; it counts in the attainment, not in the p99 wait). A time
        before the newest bucket's (a wall clock stepped back) counts in the newest
        bucket."""
        one = Attainment(1, 0) if within else Attainment(0, 1)
        self._total[service] = self._total.get(service, Attainment()) + one
        index = int(now // self.bucket_s)
        buckets = self._recent.setdefault(service, deque(maxlen=self.buckets))
        if not buckets or index > buckets[-1][0]:
            buckets.append([index, 0, 0, *([0] * _WAIT_BINS)])
        buckets[-1][1 if within else 2] += 1
        if wait is not None:
            buckets[-1][3 + wait_bin(wait)] += 1

    def since_start(self) -> dict[str, Attainment]:
        """Every service's counts since the tally began."""
        return dict(self._total)

    def recent(self, now: float) -> dict[str, Attainment]:
        """Every service's counts in the window that ends at ``now`` (zeros for a
        service with no request in it). Forgets the buckets older than the window."""
        oldest = int(now // self.bucket_s) - self.buckets + 1
        out: dict[str, Attainment] = {}
        for service, buckets in self._recent.items():
            while buckets and buckets[0][0] < oldest:
                buckets.popleft()
            out[service] = Attainment(sum(b[1] for b in buckets), sum(b[2] for b in buckets))
        return out

    def recent_p99_wait(self, now: float) -> dict[str, float | None]:
        """Every service's 99th-percentile wait in the window that ends at ``now``
        (seconds, the upper edge of its bin; None with no measured wait in it)."""
        self.recent(now)  # forget the buckets older than the window
        out: dict[str, float | None] = {}
        for service, buckets in self._recent.items():
            counts = [sum(b[3 + k] for b in buckets) for k in range(_WAIT_BINS)]
            n = sum(counts)
            out[service] = None
            if n:
                rank, seen = math.ceil(0.99 * n), 0
                for k, c in enumerate(counts):
                    seen += c
                    if seen >= rank:
                        out[service] = bin_upper(k)
                        break
        return out

    def view(self, now: float) -> dict[str, dict[str, Any]]:
        """What the store keeps and ``deepboot status --json`` shows, per service:
        ``{"window_s", "recent": {within, over, attainment}, "total": {...},
        "p99_wait_s"}`` (the recent window's, :meth:`recent_p99_wait`; null with no
        wait in it, and for an unbounded one)."""
        recent = self.recent(now)
        p99 = self.recent_p99_wait(now)
        return {
            service: {
                "window_s": self.window_s,
                "recent": recent.get(service, Attainment()).to_json(),
                "total": total.to_json(),
                "p99_wait_s": _finite(p99.get(service)),
            }
            for service, total in sorted(self._total.items())
        }


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 6)
