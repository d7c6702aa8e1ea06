"""deepboot's Ray node labels: the scheme, and the cluster read back from them.

A Ray node joins a deepboot cluster by carrying labels (``ray start --labels``, or a
KubeRay group's ``labels``: ``examples/kuberay/``) instead of hand-typed custom
resources (:mod:`deepboot.runtime.actors.rayresources`):

* :data:`POOL_LABEL` (``deepboot.io/pool``): ``training`` or ``inference``. Required on
  every deepboot node; a node without it (a KubeRay head, say) is not one.
* :data:`GPU_TYPE_LABEL` (``deepboot.io/gpu-type``): optional, the GPU model (``a100``,
  ``h100``...). Read and checked here; the policies do not use it yet (they assume
  identical GPUs).

A labelled node's GPUs are Ray's own ``GPU`` resource (KubeRay sets it from the pod's
``nvidia.com/gpu`` limit; ``ray start --num-gpus`` elsewhere), and each GPU ``i`` of it
is also one unit of the custom resource ``deepboot_gpu_<i>``
(:func:`gpu_index_resource`; :func:`ray_start_resources`: a KubeRay group's
``resources``), the same on every pod of a group: a worker asks for one of them on its
node (:mod:`deepboot.runtime.actors.rayplacement`), so that the scheduler, not Ray,
decides which GPU it gets. Its deepboot id is not a label (the pods of one KubeRay
group share one template): :func:`labelled_cluster` numbers the nodes, training
first, then by address and Ray node id.

Every key under :data:`LABEL_PREFIX` is deepboot's: one not in :data:`LABELS` is an
error (a typo must not leave a node out of its pool silently).
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from deepboot.core.cluster import ClusterSpec, Node, Pool
from deepboot.core.errors import ConfigError
from deepboot.runtime.actors.rayresources import carries_resources

LABEL_PREFIX = "deepboot.io/"
"""Every deepboot label's key starts so."""

POOL_LABEL = LABEL_PREFIX + "pool"
"""The node's pool: a :class:`~deepboot.core.cluster.Pool` value."""

GPU_TYPE_LABEL = LABEL_PREFIX + "gpu-type"
"""The node's GPU model (optional; any Kubernetes label value)."""

LABELS = (POOL_LABEL, GPU_TYPE_LABEL)
"""Every label deepboot knows, in the order the docs list them."""

GPU_RESOURCE = "GPU"
"""Ray's resource whose amount is a labelled node's GPU count."""


def gpu_index_resource(index: int) -> str:
    """The custom resource of GPU ``index`` of a labelled node (every node has its own
    unit of it: the node is chosen by its Ray node id)."""
    return f"deepboot_gpu_{index}"


def ray_start_resources(gpus: int) -> dict[str, float]:
    """The custom resources of a labelled node of ``gpus`` GPUs (``ray start
    --resources``; a KubeRay group's ``resources``): one unit of each
    :func:`gpu_index_resource`."""
    return {gpu_index_resource(i): 1.0 for i in range(gpus)}


class NodeForm(Enum):
    """How a Ray cluster's nodes say that they are deepboot's."""

    LABELS = "labels"
    """Ray node labels (this module)."""
    RESOURCES = "resources"
    """Hand-typed custom resources (:mod:`~deepboot.runtime.actors.rayresources`)."""


@dataclass(frozen=True, slots=True)
class LabelledNode:
    """One Ray node read from its labels.

    Attributes:
        ray_node_id: Ray's node id (hex).
        address: The node's IP address (Ray's ``NodeManagerAddress``).
        pool: Its pool.
        gpus: Its GPU count (Ray's ``GPU`` resource), at least 1.
        gpu_type: Its GPU model, or None when unlabelled.
    """

    ray_node_id: str
    address: str
    pool: Pool
    gpus: int
    gpu_type: str | None


def ray_start_labels(pool: Pool, gpu_type: str | None = None) -> str:
    """The ``ray start --labels`` value of a node of ``pool`` (``k=v,k=v``)."""
    pairs = {POOL_LABEL: pool.value}
    if gpu_type is not None:
        pairs[GPU_TYPE_LABEL] = gpu_type
    return ",".join(f"{k}={v}" for k, v in pairs.items())


def _labels(node: Mapping[str, object]) -> Mapping[str, object]:
    labels = node.get("Labels") or {}
    return labels if isinstance(labels, Mapping) else {}


def is_labelled(node: Mapping[str, object]) -> bool:
    """Whether a ``ray.nodes()`` entry carries any deepboot label."""
    return any(str(k).startswith(LABEL_PREFIX) for k in _labels(node))


def _name(node: Mapping[str, object]) -> str:
    """A node as an error names it: Ray's id and its address."""
    return f"Ray node {node.get('NodeID', '?')} ({node.get('NodeManagerAddress', '?')})"


def read_labelled_node(node: Mapping[str, object]) -> LabelledNode:
    """One labelled node of ``ray.nodes()`` (see the module doc).

    Raises:
        ConfigError: naming the node and the label: an unknown ``deepboot.io/`` key,
            no or an unknown pool, an empty GPU type, a GPU count that is not a whole
            number of at least 1, or a GPU without its :func:`gpu_index_resource`.
    """
    labels = _labels(node)
    for key in labels:
        if str(key).startswith(LABEL_PREFIX) and key not in LABELS:
            raise ConfigError(
                f"{_name(node)}: unknown label {key!r} (deepboot's labels: {', '.join(LABELS)})"
            )
    pools = ", ".join(p.value for p in Pool)
    if POOL_LABEL not in labels:
        raise ConfigError(f"{_name(node)}: has deepboot labels but no {POOL_LABEL} ({pools})")
    try:
        pool = Pool(str(labels[POOL_LABEL]))
    except ValueError:
        raise ConfigError(
            f"{_name(node)}: label {POOL_LABEL}={labels[POOL_LABEL]!r} is not a pool ({pools})"
        ) from None
    gpu_type = labels.get(GPU_TYPE_LABEL)
    if gpu_type is not None and not str(gpu_type):
        raise ConfigError(f"{_name(node)}: label {GPU_TYPE_LABEL} is empty (omit it instead)")
    res = node.get("Resources") or {}
    amount = res.get(GPU_RESOURCE, 0.0) if isinstance(res, Mapping) else 0.0
    gpus = float(amount) if isinstance(amount, int | float) else math.nan
    if not (gpus >= 1 and gpus == int(gpus)):
        raise ConfigError(
            f"{_name(node)}: labelled {POOL_LABEL}={pool.value} but has {amount} GPUs "
            f"(Ray's {GPU_RESOURCE} resource must be a whole number >= 1: the pod's "
            f"nvidia.com/gpu limit on KubeRay, 'ray start --num-gpus' elsewhere)"
        )
    assert isinstance(res, Mapping)
    wrong = {
        k: res.get(k, 0.0) for k, v in ray_start_resources(int(gpus)).items() if res.get(k) != v
    }
    if wrong:
        have = ", ".join(f"{k}={v}" for k, v in wrong.items())
        raise ConfigError(
            f"{_name(node)}: labelled {POOL_LABEL}={pool.value} with {int(gpus)} GPUs but "
            f"carries {have} (each GPU i of a labelled node must also be exactly one "
            f"unit of the resource deepboot_gpu_<i>: a KubeRay group's resources, "
            f"'ray start --resources' elsewhere)"
        )
    return LabelledNode(
        ray_node_id=str(node.get("NodeID", "")),
        address=str(node.get("NodeManagerAddress", "")),
        pool=pool,
        gpus=int(gpus),
        gpu_type=None if gpu_type is None else str(gpu_type),
    )


def _order(n: LabelledNode) -> tuple[int, tuple[int, int | str], str]:
    try:
        ip = ipaddress.ip_address(n.address)
        addr: tuple[int, int | str] = (0, int(ip))
    except ValueError:
        addr = (1, n.address)
    return (0 if n.pool is Pool.TRAINING else 1, addr, n.ray_node_id)


def labelled_cluster(
    nodes: Iterable[Mapping[str, object]],
) -> tuple[ClusterSpec, tuple[LabelledNode, ...]]:
    """The deepboot cluster of the live labelled nodes among ``ray.nodes()``'s entries,
    and those nodes, deepboot node ``i`` being the ``i``-th: numbered training first,
    then by IP address and Ray node id (the same set of nodes, the same numbers).
    Nodes without a deepboot label are not deepboot's (a KubeRay head, say). The
    entries are never mutated.

    Raises:
        ConfigError: a labelled node is malformed (:func:`read_labelled_node`), an
            unlabelled one carries the old custom resources (the two forms mixed), or
            no live node is labelled.
    """
    read: list[LabelledNode] = []
    for n in nodes:
        if not n.get("Alive", True):
            continue
        if is_labelled(n):
            read.append(read_labelled_node(n))
        elif carries_resources(n):
            raise ConfigError(
                f"{_name(n)}: carries deepboot_node_<n> resources but no {POOL_LABEL} label, "
                f"while other nodes are labelled: label every deepboot node, or none"
            )
    if not read:
        raise ConfigError(f"no live Ray node carries the {POOL_LABEL} label; see docs/runtime.md")
    ordered = tuple(sorted(read, key=_order))
    spec = ClusterSpec(tuple(Node(i, n.gpus, n.pool) for i, n in enumerate(ordered)))
    return spec, ordered


def node_form(nodes: Iterable[Mapping[str, object]]) -> NodeForm:
    """:attr:`NodeForm.LABELS` when any live node carries a deepboot label, else
    :attr:`NodeForm.RESOURCES` (the form of before: labels when present)."""
    alive = [n for n in nodes if n.get("Alive", True)]
    return NodeForm.LABELS if any(is_labelled(n) for n in alive) else NodeForm.RESOURCES
