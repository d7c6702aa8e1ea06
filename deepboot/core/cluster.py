"""Cluster topology: nodes, pools and the cluster spec."""

from __future__ import annotations

import enum
import itertools
import re
from dataclasses import dataclass

from deepboot.core.errors import ConfigError


class Pool(enum.Enum):
    """Which pool a node belongs to."""

    TRAINING = "training"
    INFERENCE = "inference"


GPU_TYPE_PATTERN = r"[a-z][a-z0-9_.-]{0,31}"
"""A GPU type's name: lower case, a letter first, at most 32 characters (``t4``,
``rtx``, ``a100``, ``h100-80gb``). The same names label Ray nodes
(:data:`deepboot.runtime.actors.raylabels.GPU_TYPE_LABEL`) and name profile files."""

_GROUP = re.compile(rf"\s*(?:({GPU_TYPE_PATTERN})\s*:)?\s*(\d+)\s*[xX]\s*(\d+)\s*", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Node:
    """One machine. ``node_id`` is its index in the cluster; ``gpu_type`` names its
    GPUs' type (None: untyped, as every cluster before typed specs; a cluster whose
    nodes all share one type, or none, is homogeneous and behaves the same either way)."""

    node_id: int
    gpus: int
    pool: Pool = Pool.TRAINING
    gpu_type: str | None = None


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
        """Build a cluster from ``"NODESxGPUS"`` (e.g. ``"16x4"``), or from typed groups
        ``"TYPE:NODESxGPUS,..."`` (e.g. ``"t4:6x4,rtx:3x8,a100:2x8"``): nodes are
        numbered in the order written, each group's nodes carrying its GPU type.

        The last ``inference_nodes`` nodes form the inference pool (DeepBoot's layout),
        so writing the inference pool's type last puts inference on it.

        Raises:
            ConfigError: the shape is malformed (naming the group), mixes typed and
                untyped groups, or the split is impossible.
        """
        groups = shape.split(",")
        parsed: list[tuple[str | None, int, int]] = []
        for text in groups:
            m = _GROUP.fullmatch(text)
            if not m:
                want = "NODESxGPUS, e.g. 16x4"
                if len(groups) > 1 or ":" in shape:
                    want = f"TYPE:NODESxGPUS, e.g. t4:6x4,a100:2x8 (a type is {GPU_TYPE_PATTERN})"
                raise ConfigError(f"cluster shape {shape!r}: {text.strip()!r} is not {want}")
            gpu_type = m.group(1).lower() if m.group(1) else None
            n, g = int(m.group(2)), int(m.group(3))
            if n <= 0 or g <= 0:
                raise ConfigError(
                    f"cluster shape {shape!r}: {text.strip()!r} needs at least 1 node and 1 GPU"
                )
            parsed.append((gpu_type, n, g))
        if len({t is None for t, _, _ in parsed}) > 1 or (len(parsed) > 1 and parsed[0][0] is None):
            raise ConfigError(
                f"cluster shape {shape!r}: with several groups, give each a type "
                "(TYPE:NODESxGPUS,...)"
            )
        n = sum(count for _, count, _ in parsed)
        if not 0 <= inference_nodes < n:
            raise ConfigError(
                f"--inference-nodes {inference_nodes} must be in [0, {n - 1}] for {n} nodes"
            )
        first_inf = n - inference_nodes
        nodes: list[Node] = []
        for gpu_type, count, g in parsed:
            for _ in range(count):
                i = len(nodes)
                pool = Pool.INFERENCE if i >= first_inf else Pool.TRAINING
                nodes.append(Node(i, g, pool, gpu_type))
        return cls(tuple(nodes))

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def gpus_per_node(self) -> int:
        """GPUs of the largest node (all nodes are equal in untyped parsed clusters)."""
        return max((n.gpus for n in self.nodes), default=0)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        """The distinct GPU types named on the nodes, in node order (empty: untyped)."""
        return tuple(dict.fromkeys(n.gpu_type for n in self.nodes if n.gpu_type is not None))

    @property
    def heterogeneous(self) -> bool:
        """More than one GPU type. Every type-aware path keys on this, not on a type
        being named, so ``t4:16x4`` behaves exactly as ``16x4``."""
        return len(self.gpu_types) > 1

    def node_types(self) -> tuple[str | None, ...]:
        """Each node's GPU type, by node id."""
        return tuple(n.gpu_type for n in self.nodes)

    def shape_text(self) -> str:
        """The spec written back: ``"16x4"`` for an untyped uniform cluster, else typed
        groups of consecutive equal nodes (``"t4:6x4,rtx:3x8"``)."""
        runs = [
            (key, len(list(group)))
            for key, group in itertools.groupby(self.nodes, lambda n: (n.gpu_type, n.gpus))
        ]
        return ",".join(
            (f"{t}:" if t is not None else "") + f"{count}x{gpus}" for (t, gpus), count in runs
        )

    def pool_nodes(self, pool: Pool) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.pool is pool)
