"""The shared-cluster configuration: one typed object, whichever door it came in by."""

from __future__ import annotations

import argparse

import pytest

from deepboot.cli.policy_params import add_shared_cluster_flags, shared_cluster
from deepboot.core.errors import ConfigError
from deepboot.matrix import parse_run, sim_config
from deepboot.policies.lending import LendReserveConfig
from deepboot.policies.lifecycle import LifecycleConfig
from deepboot.policies.slo import SloConfig, paced
from deepboot.scheduler.control import LoopSettings
from deepboot.world.settings import SharedCluster, loop_settings, shared_loop_settings


def parse(*flags: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_shared_cluster_flags(p)
    return p.parse_args(list(flags))


def test_the_command_line_and_the_python_api_make_the_same_configuration() -> None:
    flags = ("--reserve", "--reserve-target", "0.8", "--reserve-window", "30",
             "--protect-factor", "0.5", "--ats-i", "random", "--no-lifecycle")  # fmt: skip
    typed = SharedCluster(
        reserve=True,
        reserve_target=0.8,
        reserve_window=30,
        protect_factor=0.5,
        ats_i="random",
        lifecycle=False,
    )
    assert shared_cluster(parse(*flags)) == typed
    kw = typed.sim_kwargs(inference_nodes=2, policy="deepboot")
    assert kw["lend_reserve"] == LendReserveConfig(enabled=True, target=0.8, window_s=30.0)
    assert kw["lifecycle"] == LifecycleConfig(factor=0.5, enabled=False)
    assert kw["inference_policy"] == "random"


def test_the_run_matrix_makes_the_same_configuration_as_the_flags() -> None:
    run = parse_run("deepboot:reserve-target=0.9,protect-factor=2")
    config = sim_config(run, interval=60.0, seed=0, inference_nodes=2)
    kw = shared_cluster(parse("--reserve", "--reserve-target", "0.9", "--protect-factor", "2"))
    want = kw.sim_kwargs(inference_nodes=2, policy="deepboot")
    for name, value in want.items():
        assert getattr(config, name) == value, name


def test_it_round_trips_through_json_values() -> None:
    typed = SharedCluster(reserve=True, reserve_window=20.0, ats_i_params={"seed": "3"})
    assert SharedCluster.from_dict(typed.to_dict()) == typed
    with pytest.raises(ConfigError, match="unknown shared-cluster settings: reserv"):
        SharedCluster.from_dict({"reserv": True})


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"protect_factor": -1}, "protect factor"),
        ({"reserve_target": 1.0}, "reserve target"),
        ({"reserve_window": 0.0}, "window_s"),
        ({"slo": True, "reserve": True}, "pick one"),
        ({"slo": True, "lending": False}, "needs lending on"),
        ({"slo_target": 0.9}, "need --slo"),
        ({"slo_idle": 0.5}, "--slo-idle needs --slo"),
        ({"slo": True, "slo_idle": 1.0}, r"must be in \(0, 1\)"),
        ({"slo": True, "slo_horizon": -5.0}, "horizon_s"),
    ],
)
def test_out_of_range_or_contradictory_knobs_are_refused_by_name(
    knobs: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        SharedCluster(**knobs)  # type: ignore[arg-type]


def test_one_function_makes_the_loop_settings_of_both_worlds() -> None:
    typed = SharedCluster(reserve=True, reserve_target=0.6, protect_factor=3.0)
    got = shared_loop_settings(typed, 5.0)
    assert got == LoopSettings(
        interval=5.0,
        lending=True,
        lifecycle=LifecycleConfig(factor=3.0),
        reserve=LendReserveConfig(enabled=True, target=0.6),
        slo=paced(SloConfig(), 5.0),
    )
    # Without lending there is nothing for the SLO guard to guard.
    off = loop_settings(
        5.0,
        lending=False,
        lifecycle=LifecycleConfig(),
        reserve=LendReserveConfig(),
        slo=SloConfig(enabled=True),
    )
    assert off.slo == SloConfig()
