"""Typed scheduling operations, the Decision that groups them, and its validation."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TypeAlias

from deepboot.core.errors import InvalidDecisionError
from deepboot.core.placement import EMPTY, Placement
from deepboot.core.state import ClusterState


@dataclass(frozen=True, slots=True)
class Start:
    """Give a job that holds no GPU its first (or next, after preemption) placement."""

    job: str
    placement: Placement


@dataclass(frozen=True, slots=True)
class Resize:
    """Move a running job from ``old`` to ``new`` (a different, non-empty placement)."""

    job: str
    old: Placement
    new: Placement


@dataclass(frozen=True, slots=True)
class Preempt:
    """Take every GPU (``old``) from a running job; it waits, keeping its progress."""

    job: str
    old: Placement


Operation: TypeAlias = Start | Resize | Preempt


def new_placement(op: Operation) -> Placement:
    """The placement ``op.job`` holds once ``op`` is applied (EMPTY for a preemption)."""
    if isinstance(op, Start):
        return op.placement
    if isinstance(op, Resize):
        return op.new
    return EMPTY


def old_placement(op: Operation) -> Placement:
    """The placement ``op`` expects ``op.job`` to hold before it is applied."""
    if isinstance(op, Start):
        return EMPTY
    return op.old


@dataclass(frozen=True, slots=True)
class Decision:
    """The operations of one scheduling round, at most one per job, in job order.

    Jobs that no operation names keep their placement.
    """

    ops: tuple[Operation, ...] = ()

    def __iter__(self) -> Iterator[Operation]:
        return iter(self.ops)

    def __len__(self) -> int:
        return len(self.ops)

    def __bool__(self) -> bool:
        return bool(self.ops)


def resulting_allocation(decision: Decision, state: ClusterState) -> dict[str, Placement]:
    """Placements of the active jobs once ``decision`` is applied to ``state``.

    Does not validate; neither argument is mutated. Jobs with no GPU are omitted.
    """
    alloc = {j.name: j.placement for j in state.jobs if j.placement}
    for op in decision:
        new = new_placement(op)
        if new:
            alloc[op.job] = new
        else:
            alloc.pop(op.job, None)
    return alloc


def validate_decision(decision: Decision, state: ClusterState) -> None:
    """Check a decision against a snapshot before any part of it is applied.

    Checks: every operation names an active job, at most once; its ``old`` placement
    is the job's current one (empty for ``Start``); new placements are non-empty,
    differ from the old one and use existing nodes only; the job's
    ``max_replicas`` is respected; and in the resulting allocation no node holds
    more GPUs than it has (double booking) or than ``state.capacity`` lets
    training use.

    Raises:
        InvalidDecisionError: the first broken rule, naming the job or node at fault.
    """
    views = {j.name: j for j in state.jobs}
    seen: set[str] = set()
    num_nodes = state.cluster.num_nodes
    for op in decision:
        view = views.get(op.job)
        if view is None:
            raise InvalidDecisionError(f"operation {op!r} names unknown or inactive job")
        if op.job in seen:
            raise InvalidDecisionError(f"job {op.job!r} has more than one operation")
        seen.add(op.job)
        if old_placement(op) != view.placement:
            raise InvalidDecisionError(
                f"job {op.job!r}: operation expects placement {old_placement(op).node_ids}, "
                f"but it holds {view.placement.node_ids}"
            )
        new = new_placement(op)
        if isinstance(op, Start | Resize) and not new:
            raise InvalidDecisionError(f"job {op.job!r}: {type(op).__name__} to no GPU")
        if isinstance(op, Resize) and new == op.old:
            raise InvalidDecisionError(f"job {op.job!r}: Resize to the same placement")
        if any(not 0 <= n < num_nodes for n in new.node_ids):
            raise InvalidDecisionError(
                f"job {op.job!r}: placement {new.node_ids} uses a node outside 0..{num_nodes - 1}"
            )
        if new.num_replicas > view.max_replicas:
            raise InvalidDecisionError(
                f"job {op.job!r}: {new.num_replicas} GPUs exceed its max_replicas "
                f"{view.max_replicas}"
            )
    _check_node_usage(resulting_allocation(decision, state), state)


def _check_node_usage(alloc: Mapping[str, Placement], state: ClusterState) -> None:
    used: Counter[int] = Counter()
    for p in alloc.values():
        used.update(p.node_ids)
    for node_id, gpus in sorted(used.items()):
        if not 0 <= node_id < state.cluster.num_nodes:
            raise InvalidDecisionError(f"node {node_id} does not exist")
        physical = state.cluster.nodes[node_id].gpus
        if gpus > physical:
            holders = sorted(name for name, p in alloc.items() if node_id in p.node_ids)
            raise InvalidDecisionError(
                f"node {node_id} double-booked: {gpus} GPUs assigned to {holders}, "
                f"it has {physical}"
            )
        cap = state.capacity.get(node_id, 0)
        if gpus > cap:
            raise InvalidDecisionError(
                f"node {node_id}: {gpus} training GPUs exceed its capacity {cap}"
            )
