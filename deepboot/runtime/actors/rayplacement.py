"""How the runtime asks Ray for a deepboot GPU or node: the one place that decides,
for both forms of cluster (:class:`~deepboot.runtime.actors.raylabels.NodeForm`).

* **Resources** (a local ``up``; an attach to nodes carrying the hand-typed resources
  of :mod:`~deepboot.runtime.actors.rayresources`): GPU ``(n, i)`` is one unit of
  ``deepboot_gpu_<n>_<i>``, node ``n`` one unit of ``deepboot_node_<n>``; a node is
  alive while Ray lists a live node carrying its ``deepboot_node_<n>``.
* **Labels** (an attach by Ray node labels: :mod:`~deepboot.runtime.actors.raylabels`,
  KubeRay). The pods of one KubeRay group share one template, so no pod carries a
  resource of its own id: GPU ``i`` of every node is the resource ``deepboot_gpu_<i>``
  (:func:`~deepboot.runtime.actors.raylabels.gpu_index_resource`), one unit per pod,
  and the node is chosen by a hard label selector on Ray's own node label
  ``ray.io/node-id`` (:data:`NODE_ID_LABEL`), whose value is the id recorded at attach
  (``ClusterRecord.ray_node_ids``). Ray 2.60 takes the same selector on an actor
  (``label_selector``) and on a placement group's bundle (``bundle_label_selector``),
  so a worker, a replica, a promoted standby's GPU and a command replica's GPUs are
  pinned alike; a node's own actors (a standby, a command replica, the model cache)
  ask for the selector alone. A node is alive while Ray lists its recorded id alive.

An :class:`Ask` is what one request says (its resources, its selector): an actor's
``.options(**ask.actor_options())``, or a placement group's one bundle
(:func:`placement_group_for`). It is plain data: the controller computes it and hands
it to the replica actors that ask for their GPUs themselves.

A labelled cluster differs in two behaviours: an actor pinned to a node Ray no longer
lists fails at once (Ray: the node of its affinity does not exist), where one asking
for a dead node's resource waits; a pod KubeRay starts again is a new Ray node, not
the recorded one (:meth:`RayAsks.live_nodes` keeps its deepboot node lost).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from deepboot.runtime.actors.raylabels import NodeForm, gpu_index_resource
from deepboot.runtime.actors.rayresources import gpu_resource, live_node_ids, node_resource

if TYPE_CHECKING:
    from deepboot.runtime.cluster.raycluster import ClusterRecord

NODE_ID_LABEL = "ray.io/node-id"
"""Ray's own label on every node: its node id (hex). Ray sets it; nobody types it."""


@dataclass(frozen=True, slots=True)
class Ask:
    """One request to Ray: ``resources`` (name -> amount) on a node matching
    ``label_selector`` (empty: any node)."""

    resources: Mapping[str, float]
    label_selector: Mapping[str, str] = field(default_factory=dict)

    def actor_options(self) -> dict[str, Any]:
        """The ``.options()`` of an actor asking this (no ``label_selector`` key when
        there is none: a resource-form actor's options are what they always were)."""
        out: dict[str, Any] = {"resources": dict(self.resources)}
        if self.label_selector:
            out["label_selector"] = dict(self.label_selector)
        return out


@dataclass(frozen=True, slots=True)
class RayAsks:
    """How to ask Ray for GPUs and nodes on one cluster (module doc); not a job's
    :class:`~deepboot.core.placement.Placement`, which says which GPUs it holds.

    Attributes:
        ray_node_ids: A labelled cluster's Ray node id per deepboot node id
            (``ClusterRecord.ray_node_ids``); empty: the resource form.
    """

    ray_node_ids: tuple[tuple[int, str], ...] = ()

    @classmethod
    def of(cls, record: ClusterRecord) -> RayAsks:
        """The placement of the cluster ``record`` describes (its ``ray_node_ids``: set
        by an attach by labels only)."""
        return cls(tuple(record.ray_node_ids))

    @property
    def form(self) -> NodeForm:
        return NodeForm.LABELS if self.ray_node_ids else NodeForm.RESOURCES

    def _ray_id(self, node: int) -> str:
        for n, ray_id in self.ray_node_ids:
            if n == node:
                return ray_id
        raise KeyError(f"deepboot node {node} has no recorded Ray node id")

    def gpus(self, gpus: Sequence[tuple[int, int]]) -> Ask:
        """The ask of GPUs ``(node, index)`` together, all of one node (one bundle of a
        placement group, or one actor's), one unit each.

        Raises:
            ValueError: none, or of several nodes.
        """
        nodes = {n for n, _ in gpus}
        if len(nodes) != 1:
            raise ValueError(f"GPUs {list(gpus)} are not of exactly one node")
        if self.form is NodeForm.RESOURCES:
            return Ask({gpu_resource(n, i): 1.0 for n, i in gpus})
        (node,) = nodes
        return Ask(
            {gpu_index_resource(i): 1.0 for _, i in gpus},
            {NODE_ID_LABEL: self._ray_id(node)},
        )

    def gpu(self, node: int, index: int) -> Ask:
        """The ask of GPU ``index`` of deepboot node ``node``."""
        return self.gpus([(node, index)])

    def node(self, node: int) -> Ask:
        """The ask of an actor that must run on deepboot node ``node`` and holds no
        GPU (a standby, a command replica, the node's model cache)."""
        if self.form is NodeForm.RESOURCES:
            return Ask({node_resource(node): 1.0})
        return Ask({}, {NODE_ID_LABEL: self._ray_id(node)})

    def live_nodes(self, ray_nodes: Iterable[Mapping[str, object]]) -> frozenset[int]:
        """The deepboot ids of the nodes that ``ray.nodes()``'s entries list alive."""
        if self.form is NodeForm.RESOURCES:
            return live_node_ids(ray_nodes)
        alive = {str(n.get("NodeID")) for n in ray_nodes if n.get("Alive", False)}
        return frozenset(n for n, ray_id in self.ray_node_ids if ray_id in alive)


def placement_group_for(ask: Ask) -> Any:
    """A placement group of one bundle, ``ask``'s resources on a node matching its
    selector (``STRICT_PACK``: one node). Needs a connected Ray."""
    from ray.util.placement_group import placement_group

    if not ask.label_selector:
        return placement_group([dict(ask.resources)], strategy="STRICT_PACK")
    return placement_group(
        [dict(ask.resources)],
        strategy="STRICT_PACK",
        bundle_label_selector=[dict(ask.label_selector)],
    )
