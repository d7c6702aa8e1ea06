"""How the runtime asks Ray for a GPU or a node, in both forms of cluster (no Ray
needed): the resource form's asks are those of before, the labelled form's pin a
per-index resource to the recorded Ray node id, and live nodes are read per form."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from deepboot.runtime.actors.handles import _on_gpu, _on_node
from deepboot.runtime.actors.raylabels import NodeForm, gpu_index_resource
from deepboot.runtime.actors.rayplacement import NODE_ID_LABEL, Ask, RayAsks
from deepboot.runtime.cluster.raycluster import NAMESPACE, ClusterRecord, record_attached

RESOURCES = RayAsks()
LABELLED = RayAsks(((0, "aa11"), (1, "bb22")))


def ray_node(node_id: str, alive: bool = True, **resources: float) -> dict[str, Any]:
    """A ``ray.nodes()`` entry."""
    return {"NodeID": node_id, "Alive": alive, "Resources": {"CPU": 1.0, **resources}}


def test_the_form_follows_the_record() -> None:
    local = ClusterRecord("local", "127.0.0.1:1", "/tmp/x", ((0, "training", 2),), "")
    assert RayAsks.of(local) == RESOURCES
    assert RESOURCES.form is NodeForm.RESOURCES
    attached = ClusterRecord(
        "attached", "h:1", "", ((0, "training", 2),), "", ray_node_ids=((0, "aa11"),)
    )
    assert RayAsks.of(attached) == RayAsks(((0, "aa11"),))
    assert RayAsks.of(attached).form is NodeForm.LABELS


def test_resource_form_asks_are_those_of_before() -> None:
    assert RESOURCES.gpu(3, 1).actor_options() == {"resources": {"deepboot_gpu_3_1": 1.0}}
    assert RESOURCES.node(3).actor_options() == {"resources": {"deepboot_node_3": 1.0}}
    both = RESOURCES.gpus([(2, 0), (2, 1)])
    assert both == Ask({"deepboot_gpu_2_0": 1.0, "deepboot_gpu_2_1": 1.0})
    assert "label_selector" not in both.actor_options()
    # The actors' whole options: as before, a node's or a GPU's resource, nothing else.
    assert _on_gpu(RESOURCES, "w|j|0.1|0", "0.1", 4) == {
        "name": "w|j|0.1|0",
        "namespace": NAMESPACE,
        "lifetime": "detached",
        "num_cpus": 0,
        "resources": {"deepboot_gpu_0_1": 1.0},
        "max_restarts": 0,
        "max_concurrency": 4,
    }
    assert _on_node(RESOURCES, "s|1", 1, 2)["resources"] == {"deepboot_node_1": 1.0}


def test_labelled_asks_pin_a_per_index_resource_to_the_ray_node() -> None:
    gpu = LABELLED.gpu(1, 3)
    assert gpu == Ask({"deepboot_gpu_3": 1.0}, {NODE_ID_LABEL: "bb22"})
    assert gpu.actor_options() == {
        "resources": {gpu_index_resource(3): 1.0},
        "label_selector": {NODE_ID_LABEL: "bb22"},
    }
    assert LABELLED.gpus([(0, 0), (0, 1)]) == Ask(
        {"deepboot_gpu_0": 1.0, "deepboot_gpu_1": 1.0}, {NODE_ID_LABEL: "aa11"}
    )
    assert LABELLED.node(0).actor_options() == {
        "resources": {},
        "label_selector": {NODE_ID_LABEL: "aa11"},
    }
    options = _on_gpu(LABELLED, "r|s|1.0|0", "1.0", 2)
    assert options["resources"] == {"deepboot_gpu_0": 1.0}
    assert options["label_selector"] == {NODE_ID_LABEL: "bb22"}
    assert _on_node(LABELLED, "c", 0, 1)["label_selector"] == {NODE_ID_LABEL: "aa11"}


@pytest.mark.parametrize("placement", [RESOURCES, LABELLED], ids=["resources", "labels"])
def test_gpus_of_several_nodes_or_none_are_refused(placement: RayAsks) -> None:
    with pytest.raises(ValueError, match="exactly one node"):
        placement.gpus([(0, 0), (1, 0)])
    with pytest.raises(ValueError, match="exactly one node"):
        placement.gpus([])


def test_a_labelled_node_without_a_recorded_ray_id_is_an_error() -> None:
    with pytest.raises(KeyError, match="deepboot node 7"):
        LABELLED.gpu(7, 0)


def test_live_nodes_per_form() -> None:
    nodes = [
        ray_node("aa11"),
        ray_node("bb22", alive=False),
        ray_node("cc33"),  # a pod started again: a new Ray node, not the recorded one
        ray_node("old", deepboot_node_4=1000.0),
        ray_node("olddead", alive=False, deepboot_node_5=1000.0),
    ]
    assert LABELLED.live_nodes(nodes) == frozenset({0})
    assert RESOURCES.live_nodes(nodes) == frozenset({4})


def test_an_ask_travels_to_an_actor() -> None:
    ask = LABELLED.gpus([(1, 0), (1, 1)])
    assert pickle.loads(pickle.dumps(ask)) == ask


def test_attach_by_labels_then_asks_by_the_recorded_ids() -> None:
    """From ray.nodes() to an ask: the attach's numbering is the placement's."""
    labels = {NODE_ID_LABEL: "x", "deepboot.io/pool": "training"}
    nodes = [
        {
            "NodeID": rid,
            "NodeManagerAddress": ip,
            "Alive": True,
            "Labels": {**labels, NODE_ID_LABEL: rid},
            "Resources": {"GPU": 2.0, "deepboot_gpu_0": 1.0, "deepboot_gpu_1": 1.0},
        }
        for rid, ip in (("r-high", "10.0.0.9"), ("r-low", "10.0.0.2"))
    ]
    placement = RayAsks.of(record_attached("h:1", "", nodes))
    assert placement.gpu(0, 1) == Ask({"deepboot_gpu_1": 1.0}, {NODE_ID_LABEL: "r-low"})
    assert placement.node(1).label_selector == {NODE_ID_LABEL: "r-high"}
