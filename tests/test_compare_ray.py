"""``deepboot compare --ray``: the matrix on a private local Ray instance gives the
same summaries as the local process pool (a simulation is a pure function of its
task). Needs the runtime extra; marked slow (and runtime)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_compare_cli import DEMO_24, SMALL_SWEEP, compare_from_a_pipe, result_rows

from deepboot.cli.main import main

pytestmark = [
    pytest.mark.slow,
    pytest.mark.runtime,
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs the runtime extra"),
]

REPO = Path(__file__).resolve().parents[1]


def _sweep(out: Path, *extra: str) -> dict[str, dict[str, Any]]:
    cmd = [
        sys.executable,
        "-m",
        "deepboot.cli.main",
        "compare",
        "--workload",
        str(REPO / "examples" / "demo-deepboot.csv"),
        "--cluster",
        "4x4",
        "--inference-nodes",
        "2",
        "--run",
        "deepboot",
        "--run",
        "pollux:no-lending",
        "--run",
        "tiresias",
        "--replications",
        "2",
        "--out",
        str(out),
        "--no-figures",
        "-q",
        *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    found = {}
    for path in sorted((out / "summaries").glob("*.json")):
        data = json.loads(path.read_text())
        # Wall time and decision latencies are the only fields allowed to differ.
        data.pop("wall_s")
        data["scheduler"].pop("decision_ms_median")
        data["scheduler"].pop("decision_ms_max")
        found[path.name] = data
    return found


def test_ray_sweep_equals_the_process_pool(tmp_path: Path) -> None:
    local = _sweep(tmp_path / "local", "--procs", "2")
    on_ray = _sweep(tmp_path / "ray", "--ray", "--procs", "2")
    assert len(local) == 6
    assert on_ray == local
    rows = (tmp_path / "ray" / "intervals.csv").read_text()
    assert rows == (tmp_path / "local" / "intervals.csv").read_text()


def test_ray_sweep_of_a_piped_workload_equals_the_file(tmp_path: Path) -> None:
    from_file = tmp_path / "file"
    assert main(["compare", "--workload", str(DEMO_24), *SMALL_SWEEP, "--out", str(from_file)]) == 0
    proc = compare_from_a_pipe(DEMO_24, tmp_path / "ray", *SMALL_SWEEP, "--ray", "--procs", "2")
    assert proc.returncode == 0, proc.stderr
    assert result_rows(tmp_path / "ray") == result_rows(from_file)
