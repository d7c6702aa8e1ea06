"""examples/kuberay/: every manifest is valid against KubeRay's RayCluster CRD.

The CRD lies in ``../shared/kuberay/`` (never copied here); without it, or without
jsonschema (the runtime extra) or PyYAML, the tests skip saying why. The CRD's
``openAPIV3Schema`` is checked as the API server checks it, stricter on one point:
a field the schema does not know is an error (the server prunes it silently, or
``kubectl apply`` refuses it under strict field validation), unless the schema says
``x-kubernetes-preserve-unknown-fields``. ``x-kubernetes-int-or-string`` fields have no
``type``, so either an integer or a string passes, as on the server.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
jsonschema = pytest.importorskip(
    "jsonschema", reason="jsonschema is not installed (it comes with the runtime extra)"
)

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
CRD = SHARED / "kuberay" / "ray.io_rayclusters.yaml"
MANIFESTS = sorted((REPO / "examples" / "kuberay").glob("*.yaml"))

pytestmark = pytest.mark.skipif(
    not CRD.is_file(), reason=f"KubeRay's CRD is absent ({CRD}: ../shared/kuberay/)"
)


def _strict(schema: Any) -> Any:
    """``schema`` with unknown fields refused wherever the CRD lists an object's fields
    and does not say to keep unknown ones (a copy; the input is not mutated)."""
    out = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields", False)
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(out)
    return out


@functools.cache
def _validator() -> Any:
    """The CRD's v1 schema, strict (:func:`_strict`); built once (the CRD is large)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load(CRD.read_text(), Loader=loader)  # noqa: S506 (a safe loader)
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    assert v1["served"] and v1["storage"], "the CRD's v1 is no longer served and stored"
    schema = _strict(v1["schema"]["openAPIV3Schema"])
    # OpenAPI v3.0's schema objects are JSON Schema draft 4's (its boolean
    # exclusiveMinimum/Maximum included).
    return jsonschema.Draft4Validator(schema)


def _rayclusters(path: Path) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return [d for d in docs if d.get("kind") == "RayCluster"]


def _errors(doc: dict[str, Any]) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in _validator().iter_errors(doc)
    ]


def test_there_are_manifests() -> None:
    assert MANIFESTS, "examples/kuberay/ has no manifest"
    assert all(_rayclusters(p) for p in MANIFESTS), "a manifest without a RayCluster"


@pytest.mark.parametrize("path", MANIFESTS, ids=[p.name for p in MANIFESTS])
def test_manifest_matches_the_crd(path: Path) -> None:
    for doc in _rayclusters(path):
        assert doc["apiVersion"] == "ray.io/v1"
        assert _errors(doc) == []


# The rayStartParams that KubeRay refuses beside a group's `resources` (its
# validateRayGroupResources).
_RESOURCE_PARAMS = ("num-cpus", "num-gpus", "memory", "resources")


@pytest.mark.parametrize("path", MANIFESTS, ids=[p.name for p in MANIFESTS])
def test_each_gpu_is_its_per_index_resource(path: Path) -> None:
    """Every worker group carries ``deepboot_gpu_<i>`` (one unit) for each GPU of its
    container's nvidia.com/gpu limit, and nothing else in its ``resources`` (what an
    attach by labels requires: deepboot/runtime/actors/raylabels.py), in the group's
    ``resources`` alone (KubeRay refuses resources in both it and rayStartParams)."""
    for doc in _rayclusters(path):
        for group in doc["spec"]["workerGroupSpecs"]:
            (container,) = group["template"]["spec"]["containers"]
            gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
            want = {f"deepboot_gpu_{i}": "1" for i in range(gpus)}
            assert group.get("resources") == want, group["groupName"]
            clash = [k for k in _RESOURCE_PARAMS if k in group.get("rayStartParams", {})]
            assert not clash, (group["groupName"], clash)


def _no_group_name(doc: dict[str, Any]) -> None:
    del doc["spec"]["workerGroupSpecs"][0]["groupName"]


def _replicas_as_words(doc: dict[str, Any]) -> None:
    doc["spec"]["workerGroupSpecs"][0]["replicas"] = "two"


def _label_not_a_string(doc: dict[str, Any]) -> None:
    doc["spec"]["workerGroupSpecs"][0]["labels"]["deepboot.io/pool"] = ["training"]


def _misspelt_field(doc: dict[str, Any]) -> None:
    group = doc["spec"]["workerGroupSpecs"][0]
    group["groupname"] = group.pop("groupName")


def _no_head(doc: dict[str, Any]) -> None:
    del doc["spec"]["headGroupSpec"]


@pytest.mark.parametrize(
    ("breaks", "where"),
    [
        (_no_group_name, "groupName"),
        (_replicas_as_words, "spec/workerGroupSpecs/0/replicas"),
        (_label_not_a_string, "spec/workerGroupSpecs/0/labels/deepboot.io/pool"),
        (_misspelt_field, "groupname"),
        (_no_head, "headGroupSpec"),
    ],
    ids=["no-group-name", "replicas-as-words", "label-not-a-string", "misspelt-field", "no-head"],
)
def test_the_validator_catches_a_broken_manifest(
    breaks: Callable[[dict[str, Any]], None], where: str
) -> None:
    doc = _rayclusters(MANIFESTS[0])[0]
    assert _errors(doc) == []
    breaks(doc)
    errors = _errors(doc)
    assert errors and any(where in e for e in errors), errors


def test_int_or_string_fields_take_either() -> None:
    """A container port given by name or number (an int-or-string field) passes."""
    doc = _rayclusters(MANIFESTS[0])[0]
    probe = {"tcpSocket": {"port": 6379}, "periodSeconds": 5}
    container = doc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    container["readinessProbe"] = probe
    assert _errors(doc) == []
    probe["tcpSocket"]["port"] = "gcs"
    assert _errors(doc) == []
