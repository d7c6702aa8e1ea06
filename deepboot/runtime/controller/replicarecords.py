"""The controller's record of each inference replica: which actor is on a GPU, and
where it is in its life, by a checked transition table (as the GPU ledger checks
a GPU's and :data:`~deepboot.runtime.controller.jobrecords.JOB_TRANSITIONS` a job's).

Three records describe a replica, each kept where its facts arise: the GPU ledger
holds the GPU's state (RUNNING, PROTECT, SLEEP: the control loop's, the same in the
simulator); the router's :class:`~deepboot.runtime.http.routerstate.Replica` holds
its slots and requests (on the router's loop); this record holds what the controller
learned of the actor itself: whether it has loaded, whether it was pre-warmed with no
request, and whether its first sleep was logged.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


class ReplicaPhase(enum.Enum):
    """Where a replica is in its life, as the controller knows it."""

    LOADING = "loading"  # started for a request; its load not reported yet
    PREWARMING = "prewarming"  # started with no request (WarmReplica); loading
    WARM_IDLE = "warm-idle"  # pre-warmed and loaded with no request: its Idle is REPLICA_WARM
    READY = "ready"  # loaded: it serves (or sleeps, or is protected) as the ledger says


REPLICA_TRANSITIONS: Mapping[ReplicaPhase, frozenset[ReplicaPhase]] = MappingProxyType(
    {
        # The router's Ready.
        ReplicaPhase.LOADING: frozenset({ReplicaPhase.READY}),
        # Ready with requests that joined it while it loaded: it serves them (READY);
        # with none, it waits for its Idle (WARM_IDLE). Its Idle before its Ready
        # (the router reports Ready first, so not seen) posts REPLICA_WARM and leaves
        # it loading.
        ReplicaPhase.PREWARMING: frozenset(
            {ReplicaPhase.READY, ReplicaPhase.WARM_IDLE, ReplicaPhase.LOADING}
        ),
        # Its Idle: REPLICA_WARM protects it until its WarmReplica's ``until``.
        ReplicaPhase.WARM_IDLE: frozenset({ReplicaPhase.READY}),
        ReplicaPhase.READY: frozenset(),
    }
)
"""Where a replica may go from each phase (:meth:`ReplicaRec.move` checks every move).
A replica evicted or dead leaves its GPU: the ledger says so, and the next replica
there gets a record of its own."""


class ReplicaTransitionError(RuntimeError):
    """A replica move that :data:`REPLICA_TRANSITIONS` does not allow."""


@dataclass(slots=True)
class ReplicaRec:
    """One replica actor, as the controller knows it.

    Attributes:
        name: Its actor's name (the ledger's ``replica`` on its GPU while it is there).
        service: Its service.
        phase: Where it is in its life (:class:`ReplicaPhase`).
        started: When it was started (Unix time).
        warm_until: For a pre-warmed one (``WarmReplica``): its ``until``, the end of
            the protection REPLICA_WARM gives it once it has loaded with no request.
        sleep_logged: Its first ``sleep`` is in the event log (logged once per
            replica: with --slo it sleeps after every request).
    """

    name: str
    service: str
    phase: ReplicaPhase
    started: float
    warm_until: float | None = None
    sleep_logged: bool = False

    @property
    def prewarm_pending(self) -> bool:
        """Pre-warmed and not yet protected by its REPLICA_WARM nor serving."""
        return self.phase in (ReplicaPhase.PREWARMING, ReplicaPhase.WARM_IDLE)

    @property
    def loaded(self) -> bool:
        """The router reported it Ready."""
        return self.phase in (ReplicaPhase.READY, ReplicaPhase.WARM_IDLE)

    def move(self, to: ReplicaPhase) -> None:
        """Move to phase ``to``.

        Raises:
            ReplicaTransitionError: :data:`REPLICA_TRANSITIONS` has no such move.
        """
        if to not in REPLICA_TRANSITIONS[self.phase]:
            raise ReplicaTransitionError(
                f"replica {self.name}: no move from {self.phase.value} to {to.value}"
            )
        self.phase = to
