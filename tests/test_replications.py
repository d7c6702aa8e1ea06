"""`deepboot compare --replications K`: paired, seeded perturbations of the workload."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_cli

from deepboot.perf.catalog import load_catalog
from deepboot.sim.workload import jitter_submissions, load_workload

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "examples" / "demo-24.csv"


def test_jitter_is_seeded_bounded_and_sorted() -> None:
    workload = load_workload(DEMO, load_catalog().keys())
    a = jitter_submissions(workload, np.random.default_rng(3), 30.0)
    b = jitter_submissions(workload, np.random.default_rng(3), 30.0)
    assert a == b
    assert a != jitter_submissions(workload, np.random.default_rng(4), 30.0)
    before = {j.name: j.submit_time for j in workload.training}
    for job in a.training:
        assert job.submit_time >= 0.0
        assert abs(job.submit_time - before[job.name]) <= 30.0
    times = [j.submit_time for j in a.training]
    assert times == sorted(times)
    assert jitter_submissions(workload, np.random.default_rng(3), 0.0) == workload
    with pytest.raises(ValueError):
        jitter_submissions(workload, np.random.default_rng(3), -1.0)


def test_compare_replicates_every_run_on_the_same_workloads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rep"
    code, text, err = run_cli(
        capsys, "compare", "--workload", str(DEMO), "--cluster", "4x4",
        "--inference-nodes", "0", "--run", "pollux", "--run", "fifo", "--baseline", "fifo",
        "--replications", "2", "--out", str(out), "--no-figures", "--quiet",
    )  # fmt: skip
    assert code == 0, err
    assert "Replications: mean ± 95% interval over 2 perturbed workloads" in text
    names = sorted(p.name for p in (out / "summaries").iterdir())
    assert names == [f"demo-24--{r}#{i}.json" for r in ("fifo", "pollux") for i in (0, 1)]
    rows = list(csv.DictReader((out / "intervals.csv").open()))
    assert [r["run"] for r in rows] == ["pollux", "fifo"]
    assert rows[0]["replications"] == "2" and rows[0]["real"] in ("True", "False")
    assert rows[1]["real"] == ""  # the baseline


def test_replications_have_a_range(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(
        capsys, "compare", "--workload", str(DEMO), "--replications", "0",
        "--out", str(tmp_path / "x"),
    )  # fmt: skip
    assert code == 2 and "--replications must be in [1, 100]" in err
