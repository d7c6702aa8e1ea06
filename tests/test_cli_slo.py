"""The SLO flags of ``deepboot simulate`` and ``compare`` (issue 20): what they run,
what they refuse, and what the runtime takes (``--slo``) and refuses (the references)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deepboot.matrix import parse_run, sim_config
from tests.cli_helpers import run_cli
from tests.test_cli_simulate import make_tiny_workload


def _simulate(capsys: pytest.CaptureFixture[str], tmp_path: Path, *flags: str) -> tuple[int, str]:
    out = tmp_path / "summary.json"
    code, _, err = run_cli(
        capsys,
        "simulate",
        "--workload", str(make_tiny_workload(tmp_path)),
        "--policy", "pollux",
        "--cluster", "2x4",
        "--inference-nodes", "1",
        "--quiet",
        "--summary-json", str(out),
        *flags,
    )  # fmt: skip
    return code, out.read_text() if code == 0 else err


@pytest.mark.parametrize("flags", [["--slo"], ["--slo", "--slo-target", "0.9"], ["--warm-pool"],
                                   ["--oracle"], ["--slo", "--slo-horizon", "600"],
                                   ["--slo", "--slo-idle", "0.9"]])  # fmt: skip
def test_each_slo_mode_runs_and_reports_attainment(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: list[str]
) -> None:
    code, text = _simulate(capsys, tmp_path, *flags)
    assert code == 0, text
    inference = json.loads(text)["inference"]
    assert 0.0 <= inference["slo_attainment"] <= 1.0
    assert (
        inference["reclaims_proactive"] + inference["reclaims_reactive"]
        == json.loads(text)["cluster"]["reclaims"]
    )


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--slo", "--reserve"], "pick one"),
        (["--slo", "--oracle"], "pick one"),
        (["--slo-target", "0.9"], "need --slo"),
        (["--warm-pool", "--slo-horizon", "60"], "needs --slo"),
        (["--slo", "--no-lending"], "needs lending"),
        (["--slo", "--slo-target", "1"], "target"),
        (["--oracle", "--slo-idle", "0.9"], "--slo-idle needs --slo"),
        (["--slo", "--slo-idle", "1"], "--slo-idle must be in (0, 1)"),
    ],
)
def test_bad_combinations_are_refused_with_the_flag_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: list[str], words: str
) -> None:
    code, err = _simulate(capsys, tmp_path, *flags)
    assert code == 2, err
    assert words in err


def test_compare_runs_take_the_same_flags() -> None:
    run = parse_run("x=pollux:slo,slo-target=0.95,slo-horizon=300,slo-idle=0.5")
    config = sim_config(run, 60.0, 0, 8)
    assert config.slo.enabled and config.slo.target == 0.95 and config.slo.horizon_s == 300.0
    assert config.slo.idle_target == 0.5
    assert sim_config(parse_run("deepboot:slo"), 60.0, 0, 8).slo.idle_target == 0.75
    assert sim_config(parse_run("deepboot:warm-pool"), 60.0, 0, 8).slo_reference == "warm-pool"
    assert sim_config(parse_run("deepboot:oracle"), 60.0, 0, 8).slo_reference == "oracle"


@pytest.mark.parametrize("flag", ["--warm-pool", "--oracle"])
def test_the_runtime_refuses_the_references(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: str
) -> None:
    code, _, err = run_cli(capsys, "up", "--state-dir", str(tmp_path / "state"), flag)
    assert code == 2 and "deepboot simulate" in err
    assert not (tmp_path / "state").exists()  # refused before anything started


def test_the_runtime_takes_slo_guarded_lending_with_its_knobs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``deepboot up --slo`` reaches the cluster's start with the knobs as the
    simulator takes them (the start itself is stopped here: no Ray)."""
    from deepboot.core.errors import ConfigError
    from deepboot.runtime.cluster import updown as lifecycle
    from deepboot.runtime.controller.controller_settings import build_loop

    seen: list[object] = []

    def no_cluster(state: object, settings: object, *rest: object) -> None:
        seen.append(settings)
        raise ConfigError("stopped before the cluster starts")

    monkeypatch.setattr(lifecycle, "up", no_cluster)
    flags = ["--slo", "--slo-target", "0.95", "--slo-horizon", "300", "--slo-idle", "0.5"]
    code, _, err = run_cli(capsys, "up", "--state-dir", str(tmp_path / "state"), *flags)
    assert code == 2 and "stopped before the cluster starts" in err
    [settings] = seen
    shared = settings.shared  # type: ignore[attr-defined]
    assert (shared.slo, shared.slo_target, shared.slo_horizon, shared.slo_idle) == (
        True, 0.95, 300.0, 0.5,
    )  # fmt: skip
    slo = build_loop(settings).settings.slo  # type: ignore[arg-type]
    assert slo.enabled and slo.target == 0.95 and slo.idle_target == 0.5
