"""``--host-cache-gb`` on the command line: the simulator counts host starts apart from
cold starts; a bad value or a lone ``--host-gbps`` is refused naming the flag; the
runtime refuses the cache (its node-local cache is not built yet)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli

DEMO = Path(__file__).resolve().parents[1] / "examples" / "demo-deepboot.csv"


def _simulate(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, *flags: str
) -> tuple[int, dict[str, object] | None, str]:
    out = tmp_path / "summary.json"
    code, _, err = run_cli(
        capsys, "simulate", "--workload", str(DEMO), "--cluster", "4x4",
        "--inference-nodes", "2", "--policy", "deepboot", "--summary-json", str(out), "-q",
        *flags,
    )  # fmt: skip
    return code, json.loads(out.read_text()) if code == 0 else None, err


def test_with_the_cache_new_replicas_start_from_host_memory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, off, _ = _simulate(capsys, tmp_path)
    assert code == 0 and off is not None
    code, on, _ = _simulate(capsys, tmp_path, "--host-cache-gb", "8")
    assert code == 0 and on is not None
    before, after = off["inference"], on["inference"]
    assert isinstance(before, dict) and isinstance(after, dict)
    assert "host_starts" not in before  # off: the summary it always had
    assert after["host_starts"] > 0
    assert after["cold_starts"] < before["cold_starts"]
    assert after["tasks"] == before["tasks"]


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--host-cache-gb", "-1"], "--host-cache-gb must be >= 0"),
        (["--host-gbps", "10"], "need --host-cache-gb"),
        (["--host-cache-gb", "8", "--host-gbps", "0"], "--host-gbps must be > 0"),
    ],
)
def test_bad_values_are_refused_naming_the_flag(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: list[str], words: str
) -> None:
    code, _, err = _simulate(capsys, tmp_path, *flags)
    assert code == 2 and words in err, err


@pytest.mark.parametrize("flag", ["--host-gbps", "--host-init-s"])
def test_the_runtime_refuses_the_simulators_model_of_a_host_start(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: str
) -> None:
    """The runtime runs the cache (``--host-cache-gb``: tests/runtime/test_host_cache.py)
    and measures its host starts: the simulator's bandwidth and fixed part are refused
    before anything starts."""
    state = str(tmp_path / "state")
    code, _, err = run_cli(capsys, "up", "--state-dir", state, "--host-cache-gb", "8", flag, "1")
    assert code == 2 and flag in err and "measured" in err and "deepboot simulate" in err
    assert not (tmp_path / "state").exists()


def test_preloaded_caches_start_the_first_replicas_from_host_memory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Without the preload each model's first start on a node is cold (nothing was
    evicted there yet); with it the caches hold the models from the start (the cold
    starts left are on the training pool's FREE GPUs, which have no cache)."""
    code, lazy, _ = _simulate(capsys, tmp_path, "--host-cache-gb", "8")
    assert code == 0 and lazy is not None
    code, pre, _ = _simulate(capsys, tmp_path, "--host-cache-gb", "8", "--host-cache-preload")
    assert code == 0 and pre is not None
    before, after = lazy["inference"], pre["inference"]
    assert isinstance(before, dict) and isinstance(after, dict)
    assert after["cold_starts"] < before["cold_starts"]
    assert after["host_starts"] > before["host_starts"]
    assert after["tasks"] == before["tasks"]
    code, _, err = _simulate(capsys, tmp_path, "--host-cache-preload")
    assert code == 2 and "--host-cache-preload needs --host-cache-gb" in err


def test_compare_runs_and_the_api_take_it() -> None:
    from deepboot.matrix import describe_config, parse_run, sim_config

    run = parse_run("cached=deepboot:host-cache-gb=16")
    config = sim_config(run, 60.0, 0, 2)
    assert config.host_cache.enabled and config.host_cache.capacity_gb == 16.0
    assert "host cache 16 GB per node" in describe_config(run, config)
    assert not sim_config(parse_run("deepboot"), 60.0, 0, 2).host_cache.enabled
    pre = parse_run("deepboot:host-cache-gb=16,host-cache-preload")
    config = sim_config(pre, 60.0, 0, 2)
    assert config.host_cache.preload and "models preloaded" in describe_config(pre, config)


def test_the_api_counts_host_starts() -> None:
    import deepboot

    workload = deepboot.load_workload(DEMO)
    cluster = deepboot.cluster("4x4", inference_nodes=2)
    result = deepboot.simulate(workload, cluster, "deepboot", host_cache_gb=8)
    assert result.summary["inference"]["host_starts"] > 0
    pre = deepboot.simulate(workload, cluster, "deepboot", host_cache_gb=8, host_cache_preload=True)
    assert pre.summary["inference"]["cold_starts"] < result.summary["inference"]["cold_starts"]
