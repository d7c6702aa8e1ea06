"""The inference side of the control loop: lendable capacity and validated placements.

Both worlds (simulator and runtime) call :class:`InferenceScheduler` on every inference
arrival and :func:`lendable_capacity` before every training round, so the rules of
DeepBoot's shared cluster live here once:

* training may use FREE, SLEEP, TRAINING and LENT GPUs, and inference-pool GPUs only
  when lending is on;
* an inference placement is checked against the snapshot before any part of it runs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from types import MappingProxyType

import numpy as np

from deepboot.core.cluster import ClusterSpec, Pool
from deepboot.core.errors import InvalidDecisionError
from deepboot.core.gpu import TRAINABLE, GpuState, GpuView
from deepboot.core.state import InferenceState
from deepboot.policies.inference import InferencePlacement, InferencePolicy, PlaceAction


def lendable_capacity(
    cluster: ClusterSpec,
    gpus: Iterable[GpuView],
    lending: bool,
    reserved: Collection[tuple[int, int]] = frozenset(),
) -> Mapping[int, int]:
    """GPUs training may use per node (``ClusterState.capacity``).

    A GPU counts when its state is in :data:`TRAINABLE` and, on an inference-pool
    node, only when ``lending`` is on. GPUs serving or protecting an inference
    replica (RUNNING, PROTECT) never count, whatever their pool, nor do the idle
    GPUs the lending reserve keeps back (:func:`deepboot.policies.lending.reserved_gpus`).

    Args:
        cluster: The cluster (every node appears in the result).
        gpus: Every GPU of the cluster.
        lending: Whether training may borrow inference-pool GPUs.
        reserved: Ids of idle (FREE or SLEEP) GPUs kept back for inference.

    Returns:
        A read-only ``{node_id: gpus}`` covering every node.
    """
    cap = {n.node_id: 0 for n in cluster.nodes}
    for g in gpus:
        if g.state in TRAINABLE and (lending or g.pool is Pool.TRAINING):
            if g.gpu_id in reserved and g.state in (GpuState.FREE, GpuState.SLEEP):
                continue
            cap[g.node_id] += 1
    return MappingProxyType(cap)


_ACTION_STATE: Mapping[PlaceAction, GpuState] = MappingProxyType(
    {
        PlaceAction.WARM_PROTECT: GpuState.PROTECT,
        PlaceAction.WARM_SLEEP: GpuState.SLEEP,
        PlaceAction.COLD_FREE: GpuState.FREE,
        PlaceAction.COLD_EVICT: GpuState.SLEEP,
        PlaceAction.COLD_RECLAIM: GpuState.LENT,
    }
)
"""The state the task's GPU must be in for each action."""

WARM_ACTIONS: frozenset[PlaceAction] = frozenset({PlaceAction.WARM_PROTECT, PlaceAction.WARM_SLEEP})
"""Actions that reuse a loaded replica of the same service (no cold start)."""


def validate_placement(placement: InferencePlacement, state: InferenceState, service: str) -> None:
    """Check an inference placement against the snapshot it was made on.

    Rules: the task's GPU exists and is in the state its action needs (PROTECT or
    SLEEP of the same ``service`` for a warm reuse, FREE, another SLEEP replica, or
    a LENT GPU it reclaims); every reclaimed GPU is LENT to the named job, at most
    once, and only when ``state.lending`` is on; every evicted GPU is a SLEEP
    replica, at most once, and not also reclaimed; a replica of several GPUs is
    evicted whole. A replica of several GPUs (``placement.gpus``) has
    ``state.gpus_per_replica`` of them; a new one takes GPUs each FREE, evicted or
    reclaimed; a warm reuse names exactly the GPUs of the idle replica.

    Raises:
        InvalidDecisionError: the first broken rule, naming the GPU at fault.
    """
    by_id = {g.gpu_id: g for g in state.gpus}
    target = by_id.get(placement.gpu)
    if target is None:
        raise InvalidDecisionError(f"inference placement on unknown GPU {placement.gpu}")
    multi = bool(placement.gpus) or state.gpus_per_replica > 1
    if multi:
        _validate_set(placement, state, service, by_id)
    need = _ACTION_STATE[placement.action]
    if (placement.action in WARM_ACTIONS or not multi) and target.state is not need:
        raise InvalidDecisionError(
            f"{placement.action.name} for {service!r} needs GPU {placement.gpu} in "
            f"{need.name}, but it is {target.state.name}"
        )
    if placement.action in WARM_ACTIONS and target.service != service:
        raise InvalidDecisionError(
            f"warm reuse for {service!r} on GPU {placement.gpu}, which holds a replica "
            f"of {target.service!r}"
        )
    reclaimed = Counter(gpu for gpu, _ in placement.reclaims)
    if reclaimed and not state.lending:
        raise InvalidDecisionError("inference placement reclaims GPUs, but lending is off")
    for gpu, job in placement.reclaims:
        g = by_id.get(gpu)
        if g is None or g.state is not GpuState.LENT or g.job != job:
            found = "no such GPU" if g is None else f"{g.state.name} (job {g.job!r})"
            raise InvalidDecisionError(f"reclaim of GPU {gpu} from {job!r}: it is {found}")
        if reclaimed[gpu] > 1:
            raise InvalidDecisionError(f"GPU {gpu} is reclaimed twice")
    if (
        not multi
        and placement.action is PlaceAction.COLD_RECLAIM
        and placement.gpu not in reclaimed
    ):
        raise InvalidDecisionError(
            f"COLD_RECLAIM on GPU {placement.gpu} does not list it among its reclaims"
        )
    evicted = Counter(placement.evicts)
    for gpu in placement.evicts:
        g = by_id.get(gpu)
        if g is None or g.state is not GpuState.SLEEP:
            found = "no such GPU" if g is None else g.state.name
            raise InvalidDecisionError(f"eviction of GPU {gpu}: it is {found}, not SLEEP")
        if evicted[gpu] > 1 or gpu in reclaimed:
            raise InvalidDecisionError(f"GPU {gpu} is evicted twice or also reclaimed")
    if not multi and placement.gpu in evicted and placement.action is not PlaceAction.COLD_EVICT:
        raise InvalidDecisionError(f"{placement.action.name} on GPU {placement.gpu} also evicts it")
    for gpu in placement.evicts:
        whole = by_id[gpu].members
        if not set(whole) <= evicted.keys():
            raise InvalidDecisionError(
                f"eviction of GPU {gpu} splits its replica {whole}: evict all of its GPUs"
            )


def _validate_set(
    placement: InferencePlacement,
    state: InferenceState,
    service: str,
    by_id: Mapping[tuple[int, int], GpuView],
) -> None:
    """The rules of a replica of several GPUs (:func:`validate_placement`)."""
    ids = placement.members
    k = state.gpus_per_replica
    if len(ids) != k:
        raise InvalidDecisionError(
            f"a replica of {service!r} spans {k} GPUs; the placement names {len(ids)}: {ids}"
        )
    missing = [g for g in ids if g not in by_id]
    if missing:
        raise InvalidDecisionError(f"inference placement on unknown GPUs {missing}")
    if placement.action in WARM_ACTIONS:
        if by_id[placement.gpu].members != ids:
            raise InvalidDecisionError(
                f"warm reuse of {ids}, but GPU {placement.gpu}'s replica is "
                f"{by_id[placement.gpu].members}"
            )
        return
    freed = set(placement.evicts) | {g for g, _ in placement.reclaims}
    for gpu in ids:
        g = by_id[gpu]
        if g.state is not GpuState.FREE and gpu not in freed:
            raise InvalidDecisionError(
                f"new replica of {service!r} on {ids}: GPU {gpu} is {g.state.name}, "
                "neither FREE nor evicted nor reclaimed"
            )


class InferenceScheduler:
    """Asks an inference-placement policy where a task goes, and validates the answer.

    Holds no state and never reads a clock: time is ``state.now``.

    Attributes:
        policy: The placement policy (ATS-I or a variant).
    """

    def __init__(self, policy: InferencePolicy) -> None:
        self.policy = policy

    def place(
        self, state: InferenceState, service: str, rng: np.random.Generator
    ) -> InferencePlacement | None:
        """Where a task of ``service`` runs now, or None when it must wait.

        Args:
            state: The snapshot to decide on; never mutated.
            service: The task's service id.
            rng: The only source of randomness, passed to the policy.

        Raises:
            InvalidDecisionError: the policy's placement breaks a rule of
                :func:`validate_placement`; nothing has been applied.
        """
        placement = self.policy.place(state, service, rng)
        if placement is not None:
            validate_placement(placement, state, service)
        return placement
