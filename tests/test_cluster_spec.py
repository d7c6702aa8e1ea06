"""Cluster specs with GPU types (issue 50): ``TYPE:NODESxGPUS,...`` beside the untyped
``NODESxGPUS``, whose meaning does not change."""

from __future__ import annotations

import pytest

from deepboot.cli import limits
from deepboot.core.cluster import ClusterSpec, Node, Pool
from deepboot.core.errors import ConfigError


def test_typed_groups_number_nodes_in_the_order_written() -> None:
    c = ClusterSpec.parse("t4:6x4,rtx:3x8,a100:2x8")
    assert c.num_nodes == 11 and c.total_gpus == 64
    assert c.node_types() == ("t4",) * 6 + ("rtx",) * 3 + ("a100",) * 2
    assert [n.gpus for n in c.nodes] == [4] * 6 + [8] * 5
    assert c.gpu_types == ("t4", "rtx", "a100")
    assert c.heterogeneous
    assert c.shape_text() == "t4:6x4,rtx:3x8,a100:2x8"


def test_the_inference_pool_is_the_last_nodes_so_the_last_type_written() -> None:
    c = ClusterSpec.parse("t4:4x4, A100:2X8", inference_nodes=2)
    assert [(n.pool, n.gpu_type) for n in c.nodes[-3:]] == [
        (Pool.TRAINING, "t4"),
        (Pool.INFERENCE, "a100"),
        (Pool.INFERENCE, "a100"),
    ]


def test_an_untyped_shape_means_what_it_always_meant() -> None:
    c = ClusterSpec.parse("16x4", inference_nodes=8)
    assert c.nodes == tuple(
        Node(i, 4, Pool.INFERENCE if i >= 8 else Pool.TRAINING) for i in range(16)
    )
    assert c.gpu_types == () and not c.heterogeneous and c.shape_text() == "16x4"
    # One named type is still one type: every type-aware path keys on several.
    one = ClusterSpec.parse("t4:16x4", inference_nodes=8)
    assert not one.heterogeneous and one.gpu_types == ("t4",)
    assert [(n.gpus, n.pool) for n in one.nodes] == [(n.gpus, n.pool) for n in c.nodes]


@pytest.mark.parametrize(
    ("shape", "says"),
    [
        ("16by4", "'16by4' is not NODESxGPUS"),
        ("16x4,2x8", "give each a type"),
        ("t4:2x4,3x8", "give each a type"),
        ("t4:0x4", "needs at least 1 node and 1 GPU"),
        ("t4:2x4,9z:1x8", "'9z:1x8' is not TYPE:NODESxGPUS"),
        ("t4:2x4,", "'' is not TYPE:NODESxGPUS"),
    ],
)
def test_a_bad_shape_names_the_group_at_fault(shape: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says.replace("(", r"\(")):
        ClusterSpec.parse(shape)


def test_inference_nodes_count_across_groups() -> None:
    with pytest.raises(ConfigError, match=r"must be in \[0, 2\] for 3 nodes"):
        ClusterSpec.parse("t4:2x4,a100:1x8", inference_nodes=3)


def test_the_size_limits_add_up_every_group() -> None:
    limits.check_cluster("t4:2048x4,a100:2048x4", 0)  # 4,096 nodes: the most allowed
    with pytest.raises(ConfigError, match="too large"):
        limits.check_cluster("t4:2048x4,a100:2049x4", 0)
    with pytest.raises(ConfigError, match="too large"):
        limits.check_cluster("t4:1x4,a100:1x65", 0)
    with pytest.raises(ConfigError, match="for 3 nodes"):
        limits.check_cluster("t4:2x4,a100:1x8", 3)


TRACES = __import__("pathlib").Path(__file__).resolve().parents[1].parent / "shared" / "traces"


@pytest.mark.skipif(not (TRACES / "hetero").is_dir(), reason="../shared/traces is absent")
def test_simulate_on_sias_cluster_reports_its_typed_shape(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from deepboot.cli.main import main

    rows = (TRACES / "hetero" / "workloads" / "saturn" / "workload-1.csv").read_text()
    workload = tmp_path / "w.csv"
    workload.write_text("\n".join(rows.splitlines()[:13]) + "\n")  # the first 12 jobs
    summary = tmp_path / "s.json"
    common = ["simulate", "--workload", str(workload), "--policy", "pollux", "--quiet"]
    typed = ["--cluster", "t4:6x4,rtx:3x8,a100:2x8", "--profiles", str(TRACES / "profiles")]
    code = main(
        [*common, *typed, "--gpu-profiles", str(TRACES / "hetero" / "profiles"),
         "--summary-json", str(summary)]
    )  # fmt: skip
    assert code == 0
    doc = json.loads(summary.read_text())
    assert doc["cluster"]["shape"] == "t4:6x4,rtx:3x8,a100:2x8"
    assert doc["training"]["completed"] == 12
    # Without the typed profiles the run stops before it starts, saying what is missing.
    assert main([*common, *typed]) != 0
