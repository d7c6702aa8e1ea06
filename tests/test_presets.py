"""Presets (issue 44): ``--policy guarded`` runs exactly its parts in ``simulate``,
``compare`` and ``up``; flags given beside it win; ``up`` runs it by default;
``deepboot policies`` lists it with its figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deepboot.core.errors import ConfigError
from deepboot.matrix import parse_run, sim_config
from deepboot.world.presets import DEFAULT_PRESET, GUARDED, PRESETS, apply_preset
from tests.cli_helpers import run_cli
from tests.test_cli_simulate import make_tiny_workload


def _summary(capsys: pytest.CaptureFixture[str], tmp_path: Path, *flags: str) -> dict[str, Any]:
    out = tmp_path / "summary.json"
    out.unlink(missing_ok=True)
    code, _, err = run_cli(
        capsys,
        "simulate",
        "--workload", str(make_tiny_workload(tmp_path)),
        "--cluster", "2x4",
        "--inference-nodes", "1",
        "--quiet",
        "--summary-json", str(out),
        *flags,
    )  # fmt: skip
    assert code == 0, err
    summary: dict[str, Any] = json.loads(out.read_text())
    for noise in ("wall_s", "scheduler"):
        summary.pop(noise)
    return summary


def _params(**override: str) -> list[str]:
    """``--param`` flags of guarded's policy parameters, with ``override`` instead."""
    merged = {**GUARDED.params, **override}
    return [word for k, v in merged.items() for word in ("--param", f"{k}={v}")]


def test_guarded_runs_exactly_its_parts_and_names_itself(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    preset = _summary(capsys, tmp_path, "--policy", "guarded")
    flags = ("--slo", "--host-cache-gb", "1", "--interval", "30")
    parts = _summary(capsys, tmp_path, "--policy", GUARDED.policy, *_params(), *flags)
    plain = _summary(capsys, tmp_path, "--policy", GUARDED.policy)
    assert preset.pop("preset") == "guarded"
    assert preset == parts
    assert preset["policy"] == GUARDED.policy == "deepboot"
    # The preset's flags change the run: were they dropped, it would be plain deepboot's.
    assert preset != plain and "preset" not in plain


def test_a_flag_or_parameter_given_beside_a_preset_wins(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    given = _summary(capsys, tmp_path, "--policy", "guarded", "--interval", "60")
    given.pop("preset")
    flags = ("--slo", "--host-cache-gb", "1", "--interval", "60")
    parts = _summary(capsys, tmp_path, "--policy", GUARDED.policy, *_params(), *flags)
    assert given == parts
    # A parameter of the user's replaces the preset's (no "given twice" error).
    own = _summary(capsys, tmp_path, "--policy", "guarded", "--param", "objective=sum")
    own.pop("preset")
    flags = ("--slo", "--host-cache-gb", "1", "--interval", "30")
    paper = _summary(capsys, tmp_path, "--policy", "deepboot", *_params(objective="sum"), *flags)
    assert own == paper


def test_the_presets_parameters_reach_the_policy() -> None:
    from argparse import Namespace

    from deepboot.cli.policy_params import resolve_policy, split_pairs

    args = Namespace(policy="guarded", param=["hysteresis=0.2"], slo=False,
                     host_cache_gb=None, interval=None, reserve=False)  # fmt: skip
    resolve_policy(args)
    assert args.policy == "deepboot"
    assert split_pairs(args.param) == {**GUARDED.params, "hysteresis": "0.2"}
    run = parse_run("guarded:solver=dp")
    assert dict(run.params) == {**GUARDED.params, "solver": "dp"}


def test_simulate_prints_the_preset_and_its_parts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = run_cli(
        capsys,
        "simulate",
        "--workload", str(make_tiny_workload(tmp_path)),
        "--policy", "guarded", "--cluster", "2x4", "--inference-nodes", "1", "--quiet",
    )  # fmt: skip
    assert code == 0, err
    assert f"guarded = {GUARDED.parts()}" in " ".join(out.split())  # however it wraps
    assert "guarded on tiny" in out and "Within the SLO" in out


def test_apply_preset_fills_only_what_was_left_out() -> None:
    left_out = {"slo": False, "host_cache_gb": None, "interval": None, "reserve": False}
    assert apply_preset("guarded", left_out) == (
        "deepboot",
        {"slo": True, "host_cache_gb": 1.0, "interval": 30.0},
    )
    chosen = {**left_out, "host_cache_gb": 8.0, "interval": 60.0}
    assert apply_preset("guarded", chosen) == ("deepboot", {"slo": True})
    # Another way of deciding what is lent replaces the guard rather than clash with it.
    for other in ({"reserve": True}, {"lending": False}, {"oracle": True}):
        policy, filled = apply_preset("guarded", {**left_out, **other})
        assert "slo" not in filled and filled["interval"] == 30.0
    assert apply_preset("deepboot", left_out) == ("deepboot", {})
    with pytest.raises(ConfigError, match="lacks"):
        apply_preset("guarded", {"slo": False})


def test_every_preset_names_a_registered_policy_and_no_policy_is_shadowed() -> None:
    from deepboot.policies import registry

    for name, preset in PRESETS.items():
        assert preset.policy in registry.names()
        assert name not in registry.names()
    assert DEFAULT_PRESET in PRESETS


def test_compare_runs_a_preset_by_name_with_its_own_interval() -> None:
    run = parse_run("guarded")
    assert (run.name, run.policy, run.preset) == ("guarded", "deepboot", "guarded")
    assert dict(run.params) == dict(GUARDED.params)
    config = sim_config(run, 60.0, 0, 8)
    assert config.interval == 30.0 and config.slo.enabled
    assert config.host_cache.capacity_gb == 1.0
    assert sim_config(parse_run("guarded:interval=45"), 60.0, 0, 8).interval == 45.0
    assert sim_config(parse_run("pollux:slo"), 60.0, 0, 8).interval == 60.0
    swapped = parse_run("guarded:reserve")
    assert swapped.reserve and not swapped.slo
    with pytest.raises(ConfigError, match="interval"):
        parse_run("guarded:interval=0")


def test_policies_lists_the_presets_with_their_figures(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "policies")
    assert code == 0
    assert "guarded" in out and "up's default" in out
    assert "objective=power-mean" in out and "solver=core" in out and "--interval 30" in out
    assert "middle.csv: " in out and "small.csv: " in out


def test_up_runs_the_default_preset_and_the_paper_when_asked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``deepboot up`` hands the cluster's start (stopped there: Ray is the
    runtime tests'; test_state_ownership runs a real ``up`` and reads its status)."""
    from deepboot.runtime.cluster import updown as lifecycle

    seen: list[object] = []

    def no_cluster(state: object, settings: object, *rest: object) -> None:
        seen.append(settings)
        raise ConfigError("stopped before the cluster starts")

    monkeypatch.setattr(lifecycle, "up", no_cluster)
    for flags in ([], ["--policy", "deepboot"], ["--interval", "5", "--reserve"]):
        code, _, err = run_cli(capsys, "up", "--state-dir", str(tmp_path / "s"), *flags)
        assert code == 2 and "stopped before the cluster starts" in err
    default, paper, mixed = seen
    params = ", ".join(f"--param {k}={v}" for k, v in GUARDED.params.items())
    assert default.describe() == f"guarded = {GUARDED.parts()}"  # type: ignore[attr-defined]
    assert paper.describe() == "deepboot, --interval 60"  # type: ignore[attr-defined]
    assert mixed.describe() == (  # type: ignore[attr-defined]
        f"guarded = deepboot, {params}, --reserve, --host-cache-gb 1, --interval 5"
    )
