"""The one event queue both worlds' drivers pop from: a heap in time order.

Events at equal times pop by :attr:`EventKind.priority`, then in the order they were
pushed, so a run is deterministic whatever else is scheduled.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

from deepboot.scheduler.events import Event, EventKind


@dataclass(frozen=True, slots=True, order=True)
class _Entry:
    time: float
    priority: int
    seq: int
    event: Event


class EventQueue:
    """A heap of ``(time, priority, seq, event)``.

    Events pop in time order; at equal times by ``EventKind.priority``; then in
    insertion order (``seq``), so runs are deterministic.
    """

    __slots__ = ("_heap", "_seq", "_other")

    def __init__(self) -> None:
        self._heap: list[_Entry] = []
        self._seq = itertools.count()
        self._other = 0

    def push(self, at: float, event: Event) -> None:
        """Schedule ``event`` at time ``at`` (virtual or wall, as the world's clock)."""
        heapq.heappush(self._heap, _Entry(at, event.kind.priority, next(self._seq), event))
        if event.kind is not EventKind.TICK:
            self._other += 1

    def pop(self) -> tuple[float, Event]:
        """Remove and return the next ``(time, event)``.

        Raises:
            IndexError: the queue is empty.
        """
        entry = heapq.heappop(self._heap)
        if entry.event.kind is not EventKind.TICK:
            self._other -= 1
        return entry.time, entry.event

    @property
    def only_ticks(self) -> bool:
        """Nothing but ticks is scheduled (no submission, arrival or completion)."""
        return self._other == 0

    def peek_time(self) -> float:
        """Time of the next event (``inf`` when empty)."""
        return self._heap[0].time if self._heap else math.inf

    def __len__(self) -> int:
        return len(self._heap)
