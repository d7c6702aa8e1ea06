"""``bench/gpu_report.py``: the GPU check's report from ``make test-gpu``'s JUnit XML.

On this machine (no CUDA) the real GPU tests run and skip, and the report must say
that nothing ran, with each skip's reason; a report of a GPU run is checked on a
JUnit file of the shape pytest writes (its figures as properties)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import gpu_report  # noqa: E402


@pytest.mark.runtime  # torch and ray: the runtime extra (make test-runtime)
def test_the_report_of_a_machine_without_cuda_says_every_test_skipped_and_why(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("ray")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the GPU tests would run, not skip")
    junit = tmp_path / "junit.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
         "tests/gpu", f"--junitxml={junit}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = tmp_path / "out"
    assert gpu_report.main(["--junit", str(junit), "--out", str(out), "--machine", "here"]) == 0
    text = (out / "report.md").read_text()
    assert "0 passed, 0 failed, 4 skipped of 4 GPU tests" in text, text
    assert "**No GPU test ran here**" in text
    doc = json.loads((out / "report.json").read_text())
    reasons = {t["test"]: t["why"] for t in doc["tests"]}
    assert all(t["outcome"] == "skipped" for t in doc["tests"]), doc
    assert all("sees no CUDA device" in why for why in reasons.values()), reasons
    nccl = reasons["test_an_elastic_jobs_nccl_group_reforms_at_every_resize"]
    assert nccl.startswith("needs 2 CUDA device(s)"), nccl


def test_a_gpu_runs_figures_and_failures_are_in_the_report(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">'
        '<testcase classname="tests.gpu.test_gpu_paths" name="test_one" time="61.5">'
        '<properties><property name="h2d_pageable_gbps" value="9.81"/>'
        '<property name="h2d_pinned_gbps" value="None"/>'
        '<property name="sim_host_gbps" value="12.0"/></properties></testcase>'
        '<testcase classname="tests.gpu.test_gpu_paths" name="test_two" time="3.0">'
        '<failure message="AssertionError: wakes 0">trace</failure></testcase>'
        '<testcase classname="tests.gpu.test_gpu_paths" name="test_three" time="0.0">'
        '<skipped type="pytest.skip" message="needs 2 CUDA devices, this machine has 1">'
        "</skipped></testcase></testsuite></testsuites>"
    )
    out = tmp_path / "out"
    assert gpu_report.main(["--junit", str(junit), "--out", str(out)]) == 1  # a failure
    text = (out / "report.md").read_text()
    assert "1 passed, 1 failed, 1 skipped of 3 GPU tests" in text, text
    assert "No GPU test ran" not in text
    assert "| host-to-GPU copy, pageable (the cache's shared memory) | 9.81 | GB/s |" in text
    assert "| host-to-GPU copy, pinned | n/a | GB/s |" in text
    assert "| `test_two` | failed | 3.0 | AssertionError: wakes 0 |" in text
    assert "needs 2 CUDA devices, this machine has 1" in text


def test_an_unreadable_junit_file_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "junit.xml"
    bad.write_text("not xml")
    assert gpu_report.main(["--junit", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert f"{bad}: not a readable JUnit XML file" in capsys.readouterr().err


def test_a_check_that_stopped_or_ran_nothing_on_a_gpu_machine_fails(tmp_path: Path) -> None:
    out = tmp_path / "out"
    why = "cannot import: torch (ModuleNotFoundError)"
    code = gpu_report.main(["--junit", "/dev/null", "--out", str(out), "--failed-before", why])
    assert code == 1
    assert f"**The check stopped before the GPU tests**: {why}." in (out / "report.md").read_text()
    # Every test skipped on a machine whose nvidia-smi lists GPUs: a failure.
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest"><testcase name="test_one" time="0.1">'
        '<skipped message="needs 1 CUDA device(s): torch 2.13.0+cpu (a CPU build) sees no '
        'CUDA device"/></testcase></testsuite></testsuites>'
    )
    assert gpu_report.main(["--junit", str(junit), "--out", str(out)]) == 0
    assert gpu_report.main(["--junit", str(junit), "--out", str(out), "--expect-gpus"]) == 1
