"""Each service's demand as the SLO guard's forecast and the lending reserve read it.

The world's side of :mod:`deepboot.policies.slo` (:class:`DemandLedger`): each
service's arrivals are counted in bins of ``bin_s`` seconds aligned to time 0, keeping
the last ``keep`` of them (a bounded history), with the mean run time of its finished
tasks since the start. At a tick the policy gets every *complete* bin up to now (the
bin in progress is left out: a forecast never reads a partial count as a rate).

The world's side of :mod:`deepboot.policies.lending` (:class:`LoadWindow`): arrivals
per second and mean run times over a sliding window.
"""

from __future__ import annotations

import itertools
import math
from collections import deque

from deepboot.policies.forecast import ArrivalHistory
from deepboot.policies.lending import ServiceLoad


class _Series:
    """One service's bins: arrivals, their one-second counts squared, the busiest
    second, and the second still open (its count folds into its bin once it ends)."""

    __slots__ = (
        "last", "counts", "squares", "peaks", "second", "in_second", "second_bin",
        "version", "handed",
    )  # fmt: skip

    def __init__(self, bin_index: int, keep: int) -> None:
        self.last = bin_index  # the bin counts[-1] covers
        # Bumped by every change; ``handed`` is the history last handed out, with the
        # (bin in progress, version) it was made at: the same until either moves (an
        # event-time top-up asks for the histories at many events of one bin).
        self.version = 0
        self.handed: tuple[int, int, ArrivalHistory] | None = None
        self.counts: deque[int] = deque(maxlen=keep + 1)
        self.squares: deque[int] = deque(maxlen=keep + 1)
        self.peaks: deque[int] = deque(maxlen=keep + 1)
        self.second = -(1 << 62)  # the open one-second window
        self.in_second = 0
        self.second_bin = bin_index

    def advance(self, bin_index: int) -> int:
        """Bins up to ``bin_index`` (never back); returns the bin counted in."""
        b = max(bin_index, self.last)
        # More zeros than the columns hold would only be dropped again (a long lull).
        gap = min(b - self.last, self.counts.maxlen or 1) if self.counts else 1
        for column in (self.counts, self.squares, self.peaks):
            column.extend([0] * gap)
        self.last = b
        return b

    def fold(self) -> None:
        """The open second is over: its count goes into its bin's squares and peak
        (nothing when that bin has left the kept history)."""
        n, self.in_second = self.in_second, 0
        if n == 0:
            return
        self.version += 1
        at = len(self.counts) - 1 - (self.last - self.second_bin)
        if at >= 0:
            self.squares[at] += n * n
            self.peaks[at] = max(self.peaks[at], n)


class DemandLedger:
    """Binned arrival counts and mean run times per service (mutable; a world's own).

    Both worlds feed it with ``--slo``: the simulator each task's arrival, the runtime
    every request its router accepts (warm-served or not, as :class:`LoadWindow`).
    Within each bin it also keeps what the burstiness of the arrivals needs
    (:mod:`deepboot.policies.burstiness`): the one-second counts squared and the
    busiest second (a second belongs to the bin of its first arrival).

    Args:
        bin_s: Bin width, seconds (> 0).
        keep: Most complete bins handed out (>= 1): the forecast's history length.
    """

    def __init__(self, bin_s: float, keep: int) -> None:
        if not (math.isfinite(bin_s) and bin_s > 0) or keep < 1:
            raise ValueError(f"bin_s must be > 0 and keep >= 1; got {bin_s}, {keep}")
        self.bin_s = bin_s
        self.keep = keep
        self._series: dict[str, _Series] = {}
        self._runs: dict[str, tuple[float, int]] = {}

    def arrived(self, service: str, now: float) -> None:
        """One arrival of ``service`` at ``now``. Times should never go back; one
        that does (a wall clock stepped back) counts in the service's latest bin and
        second."""
        b = int(now // self.bin_s)
        series = self._series.get(service)
        if series is None:
            series = self._series[service] = _Series(b, self.keep)
        b = series.advance(b)
        series.version += 1
        series.counts[-1] += 1
        second = max(math.floor(now), series.second)
        if second != series.second:
            series.fold()
            series.second, series.second_bin = second, b
        series.in_second += 1

    def ran(self, service: str, seconds: float) -> None:
        """A task of ``service`` ran ``seconds``."""
        total, n = self._runs.get(service, (0.0, 0))
        self._runs[service] = (total + seconds, n + 1)

    def histories(self, now: float) -> dict[str, ArrivalHistory]:
        """Each service's complete bins up to ``now`` (at most ``keep``), oldest
        first; quiet bins since its last arrival are zeros."""
        current = int(now // self.bin_s)  # the bin in progress: left out
        end = current * self.bin_s
        out: dict[str, ArrivalHistory] = {}
        for service, series in self._series.items():
            if math.floor(now) > series.second:
                series.fold()  # a second that has ended counts now
            handed = series.handed
            if handed is not None and handed[0] == current and handed[1] == series.version:
                out[service] = handed[2]
                continue
            n = len(series.counts)
            if series.last >= current:  # drop the bins from the one in progress on
                stop, pad = max(n - (series.last - current + 1), 0), 0
            else:  # quiet bins since the last arrival: zeros
                stop, pad = n, min(current - 1 - series.last, self.keep)
            start = max(stop + pad - self.keep, 0)
            counts, squares, peaks = (
                tuple(itertools.islice(values, start, stop)) + (0,) * pad
                for values in (series.counts, series.squares, series.peaks)
            )
            out[service] = history = ArrivalHistory(self.bin_s, counts, end, squares, peaks)
            series.handed = (current, series.version, history)
        return out

    def loads(self) -> dict[str, ServiceLoad]:
        """Each service's mean run time so far (``rate`` unused: 0)."""
        return {s: ServiceLoad(0.0, total / n) for s, (total, n) in self._runs.items()}


class LoadWindow:
    """Each service's arrivals and finished run times, for the lending reserve's
    recent load (:class:`ServiceLoad`), from the past only.

    Both worlds feed it the same facts: every request that arrives (the runtime's
    router reports each one, warm-served or not) and every task that finishes.
    """

    def __init__(self) -> None:
        self._arrivals: dict[str, deque[float]] = {}
        self._runs: dict[str, deque[tuple[float, float]]] = {}

    def arrived(self, service: str, now: float) -> None:
        """One request of ``service`` arrived at ``now`` (times never go back)."""
        self._arrivals.setdefault(service, deque()).append(now)

    def ran(self, service: str, now: float, seconds: float) -> None:
        """A task of ``service`` finished at ``now`` after running ``seconds``."""
        self._runs.setdefault(service, deque()).append((now, seconds))

    def loads(self, now: float, window_s: float) -> dict[str, ServiceLoad]:
        """Each service's load over ``(now - window_s, now]``: arrivals per second,
        and the mean run time of the tasks that finished in it (services with no
        arrival in the window are left out). Forgets what is older than the window."""
        loads: dict[str, ServiceLoad] = {}
        since = now - window_s
        for service, times in self._arrivals.items():
            while times and times[0] <= since:
                times.popleft()
            runs = self._runs.get(service, deque())
            while runs and runs[0][0] <= since:
                runs.popleft()
            if times:
                mean = sum(d for _, d in runs) / len(runs) if runs else 0.0
                loads[service] = ServiceLoad(len(times) / window_s, mean)
        return loads
