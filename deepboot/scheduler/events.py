"""Events that drive the control loop, and the order in which simultaneous ones run."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import MappingProxyType


class EventKind(enum.Enum):
    """What happened. Inference events (demand change, replica idle, protect expiry)
    will be added here; give each new kind a priority in ``_PRIORITY``."""

    JOB_SUBMITTED = "job_submitted"
    JOB_FINISHED = "job_finished"
    TICK = "tick"

    @property
    def priority(self) -> int:
        """Rank among events at the same instant: lower runs first.

        Completions run before submissions, and both before the tick, so a tick at
        time ``t`` sees every job submitted at ``t`` and none that finished at ``t``
        (as the reference simulator does). The gaps leave room for new kinds.
        """
        return _PRIORITY[self]


_PRIORITY = MappingProxyType(
    {
        EventKind.JOB_FINISHED: 10,
        EventKind.JOB_SUBMITTED: 20,
        EventKind.TICK: 90,
    }
)


@dataclass(frozen=True, slots=True)
class Event:
    """One event.

    Attributes:
        kind: What happened.
        job: The job concerned; empty for a tick.
    """

    kind: EventKind
    job: str = ""
