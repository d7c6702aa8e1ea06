"""Named crash points of the controller, for the crash-safety tests.

The controller calls ``fault(point)`` at each step of every action on actors where a
crash could leave the store and the processes disagreeing. When the point is the one
``ControllerSettings.crash_at`` names, the controller dies there (SIGKILL, as an OOM
kill or a power cut would: no handler runs, nothing is flushed). Tests in-process
inject a ``crash`` that raises instead (see ``Controller``). Nothing reads an
environment variable or a module flag: the point travels in the settings.

Every point, and what the store holds when the controller dies there (the recovery
each needs is in docs/reliability.md, "Crash points"):
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping
from types import MappingProxyType

CRASH_POINTS: Mapping[str, str] = MappingProxyType(
    {
        # A generation (start, AFE resize, failure re-form, restart resize); <how> is
        # the change: start, afe, failure or restart.
        "<how>.recorded": "the generation's row is durable; no worker was offered it",
        "<how>.offered": "the staying workers were offered it; no joiner exists yet",
        "<how>.joined": "the first joiner's actor was created, the others not",
        "restart.stopped": "a restart's stop was offered to the old workers (durable)",
        "preempt.stopped": "a preemption's stop was offered (durable: the job QUEUED)",
        "reclaim.applied": "a reclaim moved the GPU on the ledger, nothing flushed",
        "finish.recorded": "the FINISHED row is durable; the workers still live",
        "evict.exported": "an evicted replica's model is in its node's cache; the actor "
        "lives, nothing flushed",
        "evict.killed": "an evicted replica's actor was killed, nothing flushed",
        "cold.recorded": "a new (cold or pre-warmed) replica's GPU row is durable; no "
        "actor exists yet",
        "standby.promoted": "a standby took its service and asked for its GPU (placement "
        "group); its GPU row not flushed",
        "recovery.planned": "recovery planned from the store and the actors; acted on nothing",
        "recovery.killed": "recovery killed the strays; nothing restored yet",
        "recovery.replicas": "recovery restored the replicas; the re-forms not offered",
    }
)
"""The named points (``<how>`` stands for each change kind)."""

HOWS = ("start", "afe", "failure", "restart")


def point_names() -> tuple[str, ...]:
    """Every concrete point name, ``<how>`` expanded."""
    out: list[str] = []
    for name in CRASH_POINTS:
        if name.startswith("<how>"):
            out.extend(h + name[len("<how>") :] for h in HOWS)
        else:
            out.append(name)
    return tuple(out)


def die(point: str) -> None:
    """The real crash: the controller kills itself at ``point``."""
    os.kill(os.getpid(), signal.SIGKILL)


class CrashPoints:
    """The crash point a controller's settings name, handed to every part that acts
    on processes: ``hit(point)`` dies there (``crash``: SIGKILL by :func:`die`;
    in-process tests raise instead) when ``point`` is the one named, and does nothing
    otherwise."""

    def __init__(self, crash_at: str | None, crash: Callable[[str], None] = die) -> None:
        self.crash_at = crash_at
        self._crash = crash

    def hit(self, point: str) -> None:
        if point == self.crash_at:
            self._crash(point)
