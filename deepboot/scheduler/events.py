"""Events that drive the control loop, and the order in which simultaneous ones run."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import MappingProxyType


class EventKind(enum.Enum):
    """What happened.

    JOB_SUBMITTED / JOB_FINISHED: a training job arrived or finished its last epoch.
    INFERENCE_ARRIVAL: an inference task arrived; it is placed at once (ATS-I runs at
        the arrival, not at the next tick) or queued.
    INFERENCE_DONE: an inference task finished; its replica goes RUNNING -> PROTECT.
    PROTECT_EXPIRED: a replica's protect time ended; it goes PROTECT -> SLEEP unless
        it was reused since (the event's ``seq`` is then stale).
    REPLICA_WARM: a replica started by ``WarmReplica`` is loaded; unless a task joined
        it meanwhile (it serves: nothing to do, the event's ``seq`` is then stale) it
        goes RUNNING -> PROTECT until the event's ``until``.
    REPLICA_LOST: a replica's process died (a real world's fact: the world has freed
        its GPU); the queued inference tasks are tried again.
    WORKER_LOST: a training worker's process died (likewise: its GPU is free, the
        job's survivors wait); a training round says at once where the job goes on,
        then the queued inference tasks are tried again.
    TICK: a scheduling round of the training policy.
    RETRY: the queued inference tasks are tried again; never queued by a world, only
        made by :func:`deepboot.scheduler.control.run_event` to continue a retry pass.
    TOP_UP: the event-time top-up of a step that freed GPUs (``LoopSettings.
        event_lending``); never queued, made by ``run_event`` like RETRY. A world
        snapshots it as a tick (the services' loads and arrivals, the loading
        replicas), with every job as it stands now.
    """

    JOB_SUBMITTED = "job_submitted"
    JOB_FINISHED = "job_finished"
    INFERENCE_ARRIVAL = "inference_arrival"
    INFERENCE_DONE = "inference_done"
    PROTECT_EXPIRED = "protect_expired"
    REPLICA_WARM = "replica_warm"
    REPLICA_LOST = "replica_lost"
    WORKER_LOST = "worker_lost"
    TICK = "tick"
    RETRY = "retry"
    TOP_UP = "top_up"

    @property
    def priority(self) -> int:
        """Rank among events at the same instant: lower runs first.

        Completions run before submissions, and both before the tick, so a tick at
        time ``t`` sees every job submitted at ``t`` and none that finished at ``t``
        (as the reference simulator does). GPUs freed at ``t`` (a finished job or
        task, an expired protect time) are freed before an inference arrival at
        ``t`` looks for one, and arrivals are placed before the tick at ``t`` lends
        what is left. A pre-warmed replica ready at ``t`` is a completion too (its
        cold start ended): it is PROTECT before an arrival at ``t``, which reuses it
        as a warm PROTECT hit. The gaps leave room for new kinds.
        """
        return _PRIORITY[self]


_PRIORITY = MappingProxyType(
    {
        EventKind.JOB_FINISHED: 10,
        EventKind.INFERENCE_DONE: 12,
        EventKind.REPLICA_WARM: 13,
        EventKind.PROTECT_EXPIRED: 14,
        EventKind.REPLICA_LOST: 15,
        EventKind.WORKER_LOST: 16,
        EventKind.JOB_SUBMITTED: 20,
        EventKind.INFERENCE_ARRIVAL: 30,
        EventKind.RETRY: 50,
        EventKind.TOP_UP: 55,
        EventKind.TICK: 90,
    }
)


@dataclass(frozen=True, slots=True)
class Event:
    """One event.

    Attributes:
        kind: What happened.
        job: The training job or inference task concerned; empty for a tick.
        seq: Version of the subject when the event was scheduled; a handler ignores
            the event when the subject has changed since (a job resized by a
            reclaim finishes at another time; a replica reused before its protect
            time ended).
        gpu: The GPU concerned, as (node_id, index), for INFERENCE_DONE,
            PROTECT_EXPIRED, REPLICA_WARM and REPLICA_LOST.
        service: The task's service, for INFERENCE_ARRIVAL; the replica's, for
            REPLICA_WARM.
        until: When the ready replica's protect time ends (``WarmReplica.until``),
            for REPLICA_WARM.
    """

    kind: EventKind
    job: str = ""
    seq: int = 0
    gpu: tuple[int, int] | None = None
    service: str = ""
    until: float = 0.0
