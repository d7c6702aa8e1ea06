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

import math
from collections import deque

from deepboot.policies.forecast import ArrivalHistory
from deepboot.policies.lending import ServiceLoad


class DemandLedger:
    """Binned arrival counts and mean run times per service (mutable; a world's own).

    Both worlds feed it with ``--slo``: the simulator each task's arrival, the runtime
    every request its router accepts (warm-served or not, as :class:`LoadWindow`).

    Args:
        bin_s: Bin width, seconds (> 0).
        keep: Most complete bins handed out (>= 1): the forecast's history length.
    """

    def __init__(self, bin_s: float, keep: int) -> None:
        if not (math.isfinite(bin_s) and bin_s > 0) or keep < 1:
            raise ValueError(f"bin_s must be > 0 and keep >= 1; got {bin_s}, {keep}")
        self.bin_s = bin_s
        self.keep = keep
        # service -> (index of the bin counts[-1] covers, counts)
        self._bins: dict[str, tuple[int, deque[int]]] = {}
        self._runs: dict[str, tuple[float, int]] = {}

    def arrived(self, service: str, now: float) -> None:
        """One arrival of ``service`` at ``now``. Times should never go back; one
        that does (a wall clock stepped back) counts in the service's latest bin."""
        b = int(now // self.bin_s)
        last, counts = self._bins.get(service, (b, deque(maxlen=self.keep + 1)))
        b = max(b, last)
        counts.extend([0] * (b - last))
        if not counts:
            counts.append(0)
        counts[-1] += 1
        self._bins[service] = (b, counts)

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
        for service, (last, counts) in self._bins.items():
            complete = list(counts)
            if last >= current:
                complete = complete[: len(complete) - (last - current + 1)]
            else:
                complete.extend([0] * min(current - 1 - last, self.keep))
            out[service] = ArrivalHistory(self.bin_s, tuple(complete[-self.keep :]), end)
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
