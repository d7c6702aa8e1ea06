"""Inference-placement policies take parameters like training ones, everywhere."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, run_cli

import deepboot
from deepboot.core import ClusterSpec, ConfigError
from deepboot.matrix import parse_run, sim_config
from deepboot.perf.catalog import load_catalog
from deepboot.policies import registry
from deepboot.scheduler import Scheduler
from deepboot.sim.config import SimConfig
from deepboot.sim.engine import Simulation
from deepboot.sim.workload import load_workload

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "examples" / "demo-deepboot.csv"


def test_the_simulator_builds_the_policy_with_its_parameters() -> None:
    apps = load_catalog()
    workload = load_workload(DEMO, apps.keys())
    config = SimConfig(inference_policy="ats-i", inference_params={"cold_order": "pack"})
    sim = Simulation(
        workload, ClusterSpec.parse("4x4", 2), Scheduler(registry.create("deepboot")), apps, config
    )
    assert sim.loop.inference is not None
    assert sim.loop.inference.policy.config.cold_order.value == "pack"  # type: ignore[attr-defined]


def test_a_run_spec_carries_them_to_the_config() -> None:
    run = parse_run("packed=deepboot:ats-i.cold_order=pack,ats-i.use_training_pool=false")
    assert run.inference_params == (("cold_order", "pack"), ("use_training_pool", "false"))
    config = sim_config(run, 60.0, 0, 2)
    assert dict(config.inference_params) == {"cold_order": "pack", "use_training_pool": "false"}
    with pytest.raises(ConfigError, match="repeated"):
        parse_run("deepboot:ats-i.cold_order=pack,ats-i.cold_order=pack")


def test_the_cli_takes_them_and_names_a_bad_one(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["simulate", "--workload", str(REPO / "examples" / "demo-24.csv"), "--quiet"]
    base += ["--policy", "pollux", "--cluster", "4x4", "--inference-nodes", "1"]
    code, _, err = run_cli(capsys, *base, "--ats-i-param", "nonsense=1")
    assert code == 2
    assert_one_line_error(err, "nonsense")
    code, out, _ = run_cli(capsys, "policies")
    assert code == 0 and "Registered inference-placement policies" in out


def test_the_api_takes_them() -> None:
    workload = deepboot.load_workload(REPO / "examples" / "demo-24.csv")
    with pytest.raises(ConfigError, match="cold_order"):
        deepboot.simulate(
            workload,
            deepboot.cluster("4x4", inference_nodes=1),
            "pollux",
            ats_i_params={"cold_order": "diagonal"},
        )
