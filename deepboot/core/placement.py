"""The one allocation representation: a job's GPUs as a sorted tuple of node ids."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeAlias


@dataclass(frozen=True, slots=True)
class Placement:
    """Node ids, one entry per GPU (replica), sorted ascending.

    ``Placement((0, 0, 3))`` is two GPUs on node 0 and one on node 3.
    """

    node_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if any(a > b for a, b in zip(self.node_ids, self.node_ids[1:], strict=False)):
            object.__setattr__(self, "node_ids", tuple(sorted(self.node_ids)))

    @classmethod
    def from_counts(cls, counts: Mapping[int, int]) -> Placement:
        """Build from ``{node_id: gpus}``; zero counts are ignored."""
        ids: list[int] = []
        for node in sorted(counts):
            ids.extend([node] * int(counts[node]))
        return cls(tuple(ids))

    @classmethod
    def of(cls, node_ids: Iterable[int]) -> Placement:
        return cls(tuple(sorted(node_ids)))

    @property
    def num_replicas(self) -> int:
        return len(self.node_ids)

    @property
    def num_nodes(self) -> int:
        return len(set(self.node_ids))

    def counts(self) -> dict[int, int]:
        """``{node_id: gpus}`` for the nodes used, ascending by node id."""
        return dict(sorted(Counter(self.node_ids).items()))

    def shape(self) -> tuple[int, ...]:
        """GPUs per used node, in node order (``(2, 2)`` = 2 nodes x 2 GPUs)."""
        return tuple(self.counts().values())

    def __bool__(self) -> bool:
        return bool(self.node_ids)


EMPTY = Placement(())

Allocation: TypeAlias = Mapping[str, Placement]
"""Job name -> placement. Jobs absent from the mapping hold no GPU."""


def freeze_allocation(alloc: Mapping[str, Placement]) -> Allocation:
    """A read-only copy without empty placements, keys sorted."""
    return MappingProxyType({k: alloc[k] for k in sorted(alloc) if alloc[k]})


def gpus_used(alloc: Allocation) -> Counter[int]:
    """GPUs in use per node, summed over all jobs."""
    used: Counter[int] = Counter()
    for p in alloc.values():
        used.update(p.node_ids)
    return used
