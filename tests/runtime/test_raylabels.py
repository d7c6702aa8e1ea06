"""deepboot's Ray node labels read back into a cluster (no Ray needed): numbering,
the old resource form kept, and errors that name the node and the label."""

from __future__ import annotations

from typing import Any

import pytest

from deepboot.core.cluster import Pool
from deepboot.core.errors import ConfigError
from deepboot.runtime.actors.raylabels import (
    GPU_TYPE_LABEL,
    LABELS,
    POOL_LABEL,
    NodeForm,
    labelled_cluster,
    node_form,
    ray_start_labels,
    ray_start_resources,
)
from deepboot.runtime.cluster.raycluster import record_attached


def make_node(
    node_id: str,
    ip: str,
    labels: dict[str, str] | None = None,
    gpus: float = 0.0,
    alive: bool = True,
    index_resources: bool = True,
    **resources: float,
) -> dict[str, Any]:
    """A ``ray.nodes()`` entry; a labelled one of whole GPUs carries their per-index
    resources (``ray_start_resources``) unless ``index_resources`` is False."""
    res: dict[str, float] = {"CPU": 4.0, **resources}
    if gpus:
        res["GPU"] = gpus
    if labels and index_resources and gpus == int(gpus):
        res.update(ray_start_resources(int(gpus)))
    return {
        "NodeID": node_id,
        "NodeManagerAddress": ip,
        "Alive": alive,
        "Labels": {"ray.io/node-id": node_id, **(labels or {})},
        "Resources": res,
    }


def training(node_id: str, ip: str, gpus: float = 4.0) -> dict[str, Any]:
    return make_node(node_id, ip, {POOL_LABEL: "training", GPU_TYPE_LABEL: "a100"}, gpus)


def inference(node_id: str, ip: str, gpus: float = 2.0) -> dict[str, Any]:
    return make_node(node_id, ip, {POOL_LABEL: "inference"}, gpus)


HEAD = make_node("head", "10.0.0.1")


def test_labels_number_the_nodes_training_first_then_by_address() -> None:
    nodes = [
        HEAD,
        inference("i1", "10.0.0.9"),
        training("t2", "10.0.0.10"),
        training("t1", "10.0.0.2"),
    ]
    cluster, read = labelled_cluster(nodes)
    assert [(n.node_id, n.pool, n.gpus) for n in cluster.nodes] == [
        (0, Pool.TRAINING, 4),
        (1, Pool.TRAINING, 4),
        (2, Pool.INFERENCE, 2),
    ]
    assert [n.ray_node_id for n in read] == ["t1", "t2", "i1"]
    assert [n.gpu_type for n in read] == ["a100", "a100", None]
    # The same nodes in another order: the same numbers.
    assert labelled_cluster(list(reversed(nodes)))[1] == read


def test_record_keeps_ray_ids_and_gpu_types() -> None:
    record = record_attached(
        "h:1", "", [HEAD, training("t", "10.0.0.2"), inference("i", "10.0.0.3")]
    )
    assert record.nodes == ((0, "training", 4), (1, "inference", 2))
    assert record.ray_node_ids == ((0, "t"), (1, "i"))
    assert record.gpu_types == ((0, "a100"),)


def test_without_labels_the_resources_are_read() -> None:
    old = make_node(
        "n",
        "10.0.0.2",
        None,
        deepboot_node_0=1000.0,
        deepboot_pool_inference=1000.0,
        deepboot_gpu_0_0=1.0,
        deepboot_gpu_0_1=1.0,
    )
    assert node_form([HEAD, old]) is NodeForm.RESOURCES
    record = record_attached("h:1", "", [HEAD, old])
    assert record.nodes == ((0, "inference", 2),)
    assert record.ray_node_ids == ()


def test_dead_labelled_nodes_are_left_out() -> None:
    dead = training("gone", "10.0.0.5")
    dead["Alive"] = False
    assert node_form([HEAD, dead]) is NodeForm.RESOURCES
    cluster, _ = labelled_cluster([HEAD, dead, inference("i", "10.0.0.3")])
    assert [n.pool for n in cluster.nodes] == [Pool.INFERENCE]


@pytest.mark.parametrize("form", list(NodeForm), ids=[f.value for f in NodeForm])
def test_every_node_form_is_told_apart(form: NodeForm) -> None:
    nodes = {
        NodeForm.LABELS: [HEAD, training("t", "10.0.0.2")],
        NodeForm.RESOURCES: [HEAD],
    }
    assert node_form(nodes[form]) is form


@pytest.mark.parametrize(
    ("node", "says"),
    [
        (
            make_node("bad", "10.0.0.7", {POOL_LABEL: "serving"}, 2.0),
            ["Ray node bad (10.0.0.7)", f"{POOL_LABEL}='serving'", "training, inference"],
        ),
        (
            make_node("nogpu", "10.0.0.7", {POOL_LABEL: "inference"}),
            ["Ray node nogpu", f"{POOL_LABEL}=inference", "0.0 GPUs"],
        ),
        (
            make_node("half", "10.0.0.7", {POOL_LABEL: "training"}, 0.5),
            ["Ray node half", "0.5 GPUs"],
        ),
        (
            make_node("typo", "10.0.0.7", {"deepboot.io/pol": "training"}, 2.0),
            ["Ray node typo", "unknown label 'deepboot.io/pol'", POOL_LABEL],
        ),
        (
            make_node("nopool", "10.0.0.7", {GPU_TYPE_LABEL: "h100"}, 2.0),
            ["Ray node nopool", f"no {POOL_LABEL}"],
        ),
        (
            make_node("empty", "10.0.0.7", {POOL_LABEL: "training", GPU_TYPE_LABEL: ""}, 2.0),
            ["Ray node empty", GPU_TYPE_LABEL, "empty"],
        ),
        (
            make_node("noidx", "10.0.0.7", {POOL_LABEL: "training"}, 2.0, index_resources=False),
            ["Ray node noidx", "deepboot_gpu_0=0.0, deepboot_gpu_1=0.0", "deepboot_gpu_<i>"],
        ),
        (
            make_node(
                "twice",
                "10.0.0.7",
                {POOL_LABEL: "inference"},
                2.0,
                index_resources=False,
                deepboot_gpu_0=1.0,
                deepboot_gpu_1=2.0,
            ),
            ["Ray node twice", "deepboot_gpu_1=2.0", "exactly one unit"],
        ),
    ],
    ids=[
        "unknown-pool",
        "inference-without-gpus",
        "fractional-gpus",
        "unknown-key",
        "no-pool",
        "empty-gpu-type",
        "no-per-index-resources",
        "a-per-index-resource-twice",
    ],
)
def test_malformed_labels_name_the_node_and_the_label(
    node: dict[str, Any], says: list[str]
) -> None:
    with pytest.raises(ConfigError) as err:
        record_attached("h:1", "", [HEAD, training("t", "10.0.0.2"), node])
    assert all(s in str(err.value) for s in says), str(err.value)


def test_the_two_forms_mixed_are_refused() -> None:
    old = make_node("old", "10.0.0.4", None, deepboot_node_0=1000.0, deepboot_pool_training=1000.0)
    with pytest.raises(ConfigError, match=r"Ray node old .*label every deepboot node, or none"):
        record_attached("h:1", "", [HEAD, training("t", "10.0.0.2"), old])


def test_ray_start_resources_name_each_gpu_index() -> None:
    assert ray_start_resources(2) == {"deepboot_gpu_0": 1.0, "deepboot_gpu_1": 1.0}


def test_ray_start_labels_use_the_scheme() -> None:
    assert ray_start_labels(Pool.INFERENCE) == f"{POOL_LABEL}=inference"
    assert ray_start_labels(Pool.TRAINING, "h100") == f"{POOL_LABEL}=training,{GPU_TYPE_LABEL}=h100"
    assert set(LABELS) == {POOL_LABEL, GPU_TYPE_LABEL}
