"""Each service's demand as the SLO guard's forecast reads it: arrivals in fixed bins.

The world's side of :mod:`deepboot.policies.slo`: the simulator counts each
service's arrivals in bins of ``bin_s`` seconds aligned to time 0, keeping the last
``keep`` of them (a bounded history), and the mean run time of its finished tasks
since the start. At a tick it hands the policy every *complete* bin up to now (the
bin in progress is left out: a forecast never reads a partial count as a rate).
"""

from __future__ import annotations

import math
from collections import deque

from deepboot.policies.forecast import ArrivalHistory
from deepboot.policies.lending import ServiceLoad


class DemandLedger:
    """Binned arrival counts and mean run times per service (mutable, sim-private).

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
        """One arrival of ``service`` at ``now`` (times never go back)."""
        b = int(now // self.bin_s)
        last, counts = self._bins.get(service, (b, deque(maxlen=self.keep + 1)))
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
