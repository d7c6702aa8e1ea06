"""Cluster topology: nodes, pools and the cluster spec."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from deepboot.core.errors import ConfigError


class Pool(enum.Enum):
    """Which pool a node belongs to."""

    TRAINING = "training"
    INFERENCE = "inference"


@dataclass(frozen=True, slots=True)
class Node:
    """One machine. ``node_id`` is its index in the cluster."""

    node_id: int
    gpus: int
    pool: Pool = Pool.TRAINING


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """An immutable list of nodes. Node ids are 0..len(nodes)-1, in order."""

    nodes: tuple[Node, ...]

    def __post_init__(self) -> None:
        for i, node in enumerate(self.nodes):
            if node.node_id != i:
                raise ConfigError(f"node ids must be 0..N-1 in order; got {node.node_id} at {i}")
            if node.gpus <= 0:
                raise ConfigError(f"node {i} has {node.gpus} GPUs; need at least 1")

    @classmethod
    def parse(cls, shape: str, inference_nodes: int = 0) -> ClusterSpec:
        """Build a homogeneous cluster from ``"NODESxGPUS"`` (e.g. ``"16x4"``).

        The last ``inference_nodes`` nodes form the inference pool (DeepBoot's layout).

        Raises:
            ConfigError: the shape is malformed or the split is impossible.
        """
        m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", shape)
        if not m:
            raise ConfigError(f"cluster shape {shape!r} is not NODESxGPUS, e.g. 16x4")
        n, g = int(m.group(1)), int(m.group(2))
        if n <= 0 or g <= 0:
            raise ConfigError(f"cluster shape {shape!r} needs at least 1 node and 1 GPU")
        if not 0 <= inference_nodes < n:
            raise ConfigError(
                f"--inference-nodes {inference_nodes} must be in [0, {n - 1}] for {n} nodes"
            )
        first_inf = n - inference_nodes
        return cls(
            tuple(Node(i, g, Pool.INFERENCE if i >= first_inf else Pool.TRAINING) for i in range(n))
        )

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def gpus_per_node(self) -> int:
        """GPUs of the largest node (all nodes are equal in parsed clusters)."""
        return max((n.gpus for n in self.nodes), default=0)

    def pool_nodes(self, pool: Pool) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.pool is pool)
