"""The pure parts of ``bench/floor.py`` (its clusters) and of ``bench/frontier.py``'s
``--host-cache`` plan (genai-day's SLO settings and their services files)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import floor  # noqa: E402
import frontier  # noqa: E402

from deepboot.core.cluster import Pool  # noqa: E402
from deepboot.core.servicefile import load_services  # noqa: E402


def test_a_floor_cluster_takes_the_gpus_from_the_last_node() -> None:
    c = floor.cluster_of(61)
    assert [n.gpus for n in c.nodes] == [4] * 15 + [1]
    assert all(n.pool is Pool.TRAINING for n in c.nodes)
    assert [n.gpus for n in floor.cluster_of(60).nodes] == [4] * 15
    assert sum(n.gpus for n in floor.cluster_of(64).nodes) == 64
    for bad in (0, 65):
        with pytest.raises(SystemExit, match=f"--gpus {bad}"):
            floor.cluster_of(bad)


def test_each_setting_sets_every_services_wait() -> None:
    assert frontier._wait_s("1s", 30.0) == 1.0
    assert frontier._wait_s("5s", 30.0) == 5.0
    assert frontier._wait_s("2xcold", 3.0) == 6.0
    assert frontier._wait_s("2xcold", None) == 1.0  # a cold start under 0.5 s counts as 0.5


def test_genai_day_runs_in_three_settings_with_the_whole_cache(tmp_path: Path) -> None:
    works = frontier.workloads("genai-day")
    cells = frontier.cache_cells(tmp_path, works, "profiles", 1, 1.0, 320.0)
    settings = {setting for _, setting, _, _, _ in cells}
    assert settings == {"1s", "5s", "2xcold"}
    # The limits and the probe run once, in 1s: they stand under every setting.
    assert all(s == "1s" for _, s, run, _, _ in cells if run.startswith(("limit", "probe")))
    runs = {run: task.run for _, s, run, _, task in cells if s == "5s"}
    assert runs["pollux-slo-0.99+cache"].host_cache_gb == 320.0
    assert runs["pollux-slo-0.99+cache"].host_cache_preload
    specs = load_services(tmp_path / "genai-day-5s.toml")
    assert len(specs) == 11
    assert {s.slo_wait_s for s in specs} == {5.0}
    assert {s.model_gb for s in specs} == {frontier.GENAI_MODEL_GB}
    # 320 GB per node holds all eleven models.
    assert frontier.GENAI_MODEL_GB * len(specs) <= 320.0


def test_the_interval_reaches_every_run_the_limits_included(tmp_path: Path) -> None:
    works = frontier.workloads("genai-day")  # in the repository: no traces needed
    default = frontier.cache_cells(tmp_path, works, "profiles", 2, 1.0, 320.0)
    assert {task.interval for *_, task in default} == {60.0}
    cells = frontier.cache_cells(tmp_path, works, "profiles", 2, 1.0, 320.0, interval=30.0)
    assert {task.interval for *_, task in cells} == {30.0}
    assert {run for _, _, run, _, _ in cells} >= {"limit", "pollux-slo-0.99+cache"}
    sweep = frontier.make_cells(
        tmp_path, works, "profiles", 1, frontier.IDLE_SWEEP, ("2xcold",), 20.0
    )
    assert {task.interval for *_, task in sweep} == {20.0}


def test_an_interval_out_of_range_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        frontier.main(["--interval", "0.5", "--host-cache", "--quick"])
    assert "--interval must be in [1, 3600] seconds; got 0.5" in capsys.readouterr().err
