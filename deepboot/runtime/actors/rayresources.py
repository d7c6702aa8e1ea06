"""The Ray resources that describe a deepboot cluster, and the cluster read back
from them.

A deepboot cluster is a Ray cluster whose nodes carry custom resources that name
them (Ray's resources double as labels here):

* ``deepboot_node_<n>``: the node's deepboot id ``n`` (any amount);
* ``deepboot_pool_training`` or ``deepboot_pool_inference``: its pool;
* ``deepboot_gpu_<n>_<i>``: one unit per GPU ``i`` of node ``n``. A worker asks for
  exactly one of these, so that the scheduler, not Ray, decides which GPU it gets
  (DeepBoot reclaims one named GPU). On a machine without GPUs they are logical and
  the workers run torch on the CPU.

:func:`node_resources` gives a node's resources (``ray start --resources``);
:func:`cluster_from_ray_nodes` reads the cluster back from live Ray nodes'. Nodes
may instead say what they are by Ray node labels
(:mod:`deepboot.runtime.actors.raylabels`); an attach reads the labels when any node
carries them, else these resources.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from deepboot.core.cluster import ClusterSpec, Node, Pool
from deepboot.core.errors import ConfigError

_GPU_RESOURCE = re.compile(r"^deepboot_gpu_(\d+)_(\d+)$")
_NODE_RESOURCE = re.compile(r"^deepboot_node_(\d+)$")


def gpu_resource(node: int, index: int) -> str:
    """The Ray resource naming GPU ``index`` of deepboot node ``node``."""
    return f"deepboot_gpu_{node}_{index}"


def node_resource(node: int) -> str:
    """The Ray resource naming deepboot node ``node`` (an actor asking one unit of it
    runs on that node: the node-local model cache)."""
    return f"deepboot_node_{node}"


def node_resources(node: Node) -> dict[str, float]:
    """The custom resources (labels and GPUs) of one deepboot node."""
    res: dict[str, float] = {
        node_resource(node.node_id): 1000.0,
        f"deepboot_pool_{node.pool.value}": 1000.0,
    }
    for i in range(node.gpus):
        res[gpu_resource(node.node_id, i)] = 1.0
    return res


def cluster_from_ray_nodes(nodes: Iterable[Mapping[str, object]]) -> ClusterSpec:
    """The deepboot cluster described by live Ray nodes' resources (see module doc).

    Raises:
        ConfigError: no node carries deepboot resources, or one lacks its pool or id.
    """
    out: list[Node] = []
    for n in nodes:
        if not n.get("Alive", True):
            continue
        res = n.get("Resources", {})
        assert isinstance(res, Mapping)
        ids = [int(m.group(1)) for k in res if (m := _NODE_RESOURCE.match(k))]
        if not ids:
            continue
        pools = [p for p in Pool if f"deepboot_pool_{p.value}" in res]
        if len(ids) != 1 or len(pools) != 1:
            raise ConfigError(
                f"Ray node {n.get('NodeID', '?')} must carry exactly one deepboot_node_<n> "
                f"and one deepboot_pool_<training|inference> resource"
            )
        gpus = sorted(
            int(m.group(2))
            for k in res
            if (m := _GPU_RESOURCE.match(k)) and int(m.group(1)) == ids[0]
        )
        if gpus != list(range(len(gpus))):
            raise ConfigError(
                f"deepboot node {ids[0]}: GPU resources must be deepboot_gpu_{ids[0]}_0.."
                f"deepboot_gpu_{ids[0]}_{len(gpus) - 1}, got indices {gpus}"
            )
        out.append(Node(ids[0], len(gpus), pools[0]))
    if not out:
        raise ConfigError(
            "no Ray node carries deepboot resources (deepboot_node_<n>, "
            "deepboot_pool_<pool>, deepboot_gpu_<n>_<i>); see docs/runtime.md"
        )
    return ClusterSpec(tuple(sorted(out, key=lambda node: node.node_id)))


def carries_resources(node: Mapping[str, object]) -> bool:
    """Whether a ``ray.nodes()`` entry carries a ``deepboot_node_<n>`` resource."""
    res = node.get("Resources", {})
    return isinstance(res, Mapping) and any(_NODE_RESOURCE.match(k) for k in res)


def live_node_ids(nodes: Iterable[Mapping[str, object]]) -> frozenset[int]:
    """The deepboot ids of the Ray nodes listed alive (``ray.nodes()``'s entries)."""
    out: set[int] = set()
    for n in nodes:
        res = n.get("Resources", {})
        if n.get("Alive", False) and isinstance(res, Mapping):
            out.update(int(m.group(1)) for k in res if (m := _NODE_RESOURCE.match(k)))
    return frozenset(out)
