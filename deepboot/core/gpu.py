"""Per-GPU states of the shared cluster and their legal transitions (DeepBoot §2.1)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeAlias

from deepboot.core.cluster import Pool
from deepboot.core.errors import InvalidDecisionError

GpuId: TypeAlias = tuple[int, int]
"""(node_id, index) of one GPU."""


class GpuState(enum.Enum):
    """What one GPU is doing.

    FREE: empty.
    TRAINING: a training worker on a training-pool GPU.
    RUNNING: an inference replica serving a task, or loading (a cold start, with a
        task or pre-warmed without one).
    PROTECT: an idle replica kept warm for its protect time; not lendable.
    SLEEP: an idle replica, still loaded, lendable (lending evicts it).
    LENT: a training worker on an inference-pool GPU; reclaimable at any time.
    DOWN: its node left the cluster (a real world's fact, never a decision): nothing
        runs on it and no decision may use it until the node returns (-> FREE).
    """

    FREE = "free"
    TRAINING = "training"
    RUNNING = "running"
    PROTECT = "protect"
    SLEEP = "sleep"
    LENT = "lent"
    DOWN = "down"


_T = GpuState
TRANSITIONS: Mapping[GpuState, frozenset[GpuState]] = MappingProxyType(
    {
        # A free GPU can take a training worker (own pool or lent) or a cold-started
        # replica: for a task, or pre-warmed with none (WarmReplica).
        _T.FREE: frozenset({_T.TRAINING, _T.LENT, _T.RUNNING}),
        _T.TRAINING: frozenset({_T.FREE, _T.RUNNING}),
        # Its tasks are done, or a pre-warmed replica is ready with none (-> PROTECT);
        # a task joins it (-> RUNNING: a free slot, or a pre-warmed replica loading).
        _T.RUNNING: frozenset({_T.PROTECT, _T.RUNNING}),
        # Warm reuse (PROTECT -> RUNNING) or the protect time ends (PROTECT -> SLEEP).
        _T.PROTECT: frozenset({_T.RUNNING, _T.SLEEP}),
        # Warm reuse, eviction by another service's cold start, lending, or release.
        _T.SLEEP: frozenset({_T.RUNNING, _T.LENT, _T.FREE, _T.TRAINING}),
        # Reclaimed for inference (-> RUNNING) or released by training (-> FREE).
        _T.LENT: frozenset({_T.RUNNING, _T.FREE}),
        # Only its node's return (a fact: FAILURES) brings it back.
        _T.DOWN: frozenset(),
    }
)


TRAINABLE: frozenset[GpuState] = frozenset(
    {GpuState.FREE, GpuState.SLEEP, GpuState.TRAINING, GpuState.LENT}
)
"""States a training round may hand out: empty, idle-and-lendable, or already training."""


FAILURES: Mapping[GpuState, frozenset[GpuState]] = MappingProxyType(
    {
        # A replica's process died (or the router gave it up): its GPU is empty.
        _T.RUNNING: frozenset({_T.FREE}),
        _T.PROTECT: frozenset({_T.FREE}),
        _T.SLEEP: frozenset({_T.FREE}),
        # A training worker died: its GPU is empty (as a release).
        _T.TRAINING: frozenset({_T.FREE}),
        _T.LENT: frozenset({_T.FREE}),
        # Its node left the cluster (what ran there was failed to FREE first).
        _T.FREE: frozenset({_T.DOWN}),
        # Its node came back.
        _T.DOWN: frozenset({_T.FREE}),
    }
)
"""What a failure (a fact, never a decision) may do to a GPU: a real world's process
dies, or its node leaves the cluster or returns. Kept apart from :data:`TRANSITIONS`,
so that no decision may, say, empty a RUNNING GPU."""


def check_transition(old: GpuState, new: GpuState, where: str = "", failure: bool = False) -> None:
    """Raise ``InvalidDecisionError`` unless ``old -> new`` is a legal transition (of a
    decision; of a failure with ``failure``: :data:`FAILURES`)."""
    if new not in (FAILURES if failure else TRANSITIONS)[old]:
        suffix = f" on {where}" if where else ""
        kind = "failure" if failure else "GPU transition"
        raise InvalidDecisionError(f"illegal {kind} {old.name} -> {new.name}{suffix}")


@dataclass(frozen=True, slots=True)
class GpuView:
    """One GPU as a policy sees it.

    Attributes:
        node_id: Its node.
        index: Its index on the node (0-based).
        pool: Its node's pool.
        state: Its state.
        service: The inference service whose replica is loaded (RUNNING/PROTECT/SLEEP).
        hits: Warm-reuse hit count of that replica.
        job: The training job using it (TRAINING/LENT).
        protect_until: When PROTECT ends (PROTECT only).
        replica_gpus: Every GPU of the loaded replica when it spans several
            (``ServiceSpec.gpus_per_replica`` > 1), lead first, all on this node; each
            of them carries the same state, service, hits and protect end. Empty for
            a one-GPU replica and for a GPU with no replica.
    """

    node_id: int
    index: int
    pool: Pool
    state: GpuState
    service: str | None = None
    hits: int = 0
    job: str | None = None
    protect_until: float | None = None
    replica_gpus: tuple[GpuId, ...] = ()
    # ``(node_id, index)``, made once: policies and worlds ask for it tens of millions
    # of times in a long run (a property built a tuple each time).
    gpu_id: GpuId = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpu_id", (self.node_id, self.index))

    @property
    def members(self) -> tuple[GpuId, ...]:
        """The GPUs of the replica loaded here, lead first (``(gpu_id,)`` for a one-GPU
        replica, or for a GPU with none)."""
        return self.replica_gpus or (self.gpu_id,)

    @property
    def lead(self) -> bool:
        """Whether this GPU names its replica: the first of ``members`` (always true
        for a one-GPU replica). Placement and lifecycle look at leads only, so that a
        replica of k GPUs counts once."""
        return not self.replica_gpus or self.replica_gpus[0] == self.gpu_id
