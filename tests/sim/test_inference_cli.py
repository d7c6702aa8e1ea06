"""``deepboot simulate`` with an inference pool: the shared-cluster flags, end to end."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from deepboot.cli.main import build_parser, main
from deepboot.cli.policy_params import shared_cluster_settings
from deepboot.core import ConfigError
from deepboot.perf.restart import AfeRestartCost, FlatRestartCost

HEADER = "name,time,application,num_replicas,batch_size,duration,num_task"


def parse(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["simulate", "--workload", "w.csv", "--policy", "x", *flags])


@pytest.mark.parametrize(
    ("flags", "nodes", "policy", "expected"),
    [
        ((), 8, "deepboot", (True, 1.0, True, AfeRestartCost(afe=True), "ats-i")),
        ((), 0, "pollux", (True, 1.0, True, FlatRestartCost(30.0), "ats-i")),
        (("--no-afe",), 8, "pollux", (True, 1.0, True, AfeRestartCost(afe=False), "ats-i")),
        (("--afe",), 0, "pollux", (True, 1.0, True, AfeRestartCost(afe=True), "ats-i")),
        (
            ("--no-lending", "--no-lifecycle", "--protect-factor", "8"),
            8,
            "pollux",
            (False, 8.0, False, AfeRestartCost(afe=True), "ats-i"),
        ),
        ((), 8, "lyra", (True, 1.0, True, AfeRestartCost(afe=True), "lyra")),
        (("--ats-i", "random"), 8, "lyra", (True, 1.0, True, AfeRestartCost(afe=True), "random")),
    ],
    ids=["deepboot", "pollux-fidelity", "no-afe", "afe-forced", "baseline", "lyra", "random"],
)
def test_flags_become_sim_settings(
    flags: tuple[str, ...],
    nodes: int,
    policy: str,
    expected: tuple[bool, float, bool, object, str],
) -> None:
    got = shared_cluster_settings(parse(*flags), nodes, policy)
    lending, factor, enabled, restart, ats_i = expected
    assert got["lending"] is lending
    assert (got["lifecycle"].factor, got["lifecycle"].enabled) == (factor, enabled)
    assert got["restart"] == restart
    assert got["inference_policy"] == ats_i


def test_negative_protect_factor_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="--protect-factor"):
        shared_cluster_settings(parse("--protect-factor", "-1"), 8, "deepboot")


def test_reserve_flags_become_the_lending_reserve() -> None:
    from deepboot.policies.lending import LendReserveConfig

    assert shared_cluster_settings(parse(), 8, "deepboot")["lend_reserve"] == LendReserveConfig()
    got = shared_cluster_settings(parse("--reserve", "--reserve-target", "0.9"), 8, "deepboot")
    assert got["lend_reserve"] == LendReserveConfig(enabled=True, target=0.9)
    with pytest.raises(ConfigError, match="--reserve-target"):
        shared_cluster_settings(parse("--reserve", "--reserve-target", "1.5"), 8, "deepboot")


def test_unknown_ats_i_variant_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--workload", "w.csv", "--policy", "pollux", "--ats-i", "x"]) == 2
    assert "--ats-i" in capsys.readouterr().err


def write_workload(tmp_path: Path) -> Path:
    """Two training jobs and a burst of inference tasks (built-in catalog models)."""
    rows = [HEADER, "cifar10-0,0,cifar10,1,128,-1,-1", "ncf-1,30,ncf,1,32768,-1,-1"]
    rows += [f"inference-ncf-{i},{40 + 15 * i},infer-ncf-1,1,1,6.0,10" for i in range(12)]
    path = tmp_path / "mixed.csv"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def simulate(tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> dict[str, object]:
    out = tmp_path / "summary.json"
    code = main(
        [
            "simulate",
            "--workload", str(write_workload(tmp_path)),
            "--policy", "deepboot",
            "--cluster", "2x4",
            "--inference-nodes", "1",
            "--summary-json", str(out),
            "--quiet",
            *flags,
        ]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    assert "ignoring" not in err
    summary: dict[str, object] = json.loads(out.read_text(encoding="utf-8"))
    return summary


def test_lending_lets_training_use_the_idle_inference_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lent = simulate(tmp_path, capsys)
    alone = simulate(tmp_path, capsys, "--no-lending")
    jct_lent = lent["training"]["avg_jct_s"]  # type: ignore[index]
    jct_alone = alone["training"]["avg_jct_s"]  # type: ignore[index]
    assert lent["training"]["completed"] == alone["training"]["completed"] == 2  # type: ignore[index]
    assert jct_lent < jct_alone
