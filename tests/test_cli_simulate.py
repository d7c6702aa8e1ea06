"""End to end: ``deepboot simulate`` on a tiny workload writes the summary JSON schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deepboot.cli.main import main
from deepboot.report.schema import SUMMARY_SCHEMA

DEEPBOOT_HEADER = "name,time,application,num_replicas,batch_size,duration,num_task"


def make_tiny_workload(tmp_path: Path) -> Path:
    """Two short training jobs and two inference rows (which are ignored for now)."""
    rows = [
        DEEPBOOT_HEADER,
        "ncf-0,0,ncf,1,32768,-1,-1",
        "inference-ncf-1,5,infer-ncf-1,1,1,2.0,100",
        "ncf-1,30,ncf,1,32768,-1,-1",
        "inference-bert-2,9,infer-bert-1,1,1,3.0,50",
    ]
    path = tmp_path / "tiny.csv"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_simulate_writes_summary_with_exact_schema(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    workload = make_tiny_workload(tmp_path)
    out = tmp_path / "summary.json"
    code = main(
        [
            "simulate",
            "--workload", str(workload),
            "--policy", "pollux",
            "--cluster", "2x4",
            "--summary-json", str(out),
            "--quiet",
        ]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    summary = json.loads(out.read_text(encoding="utf-8"))
    assert list(summary) == list(SUMMARY_SCHEMA)
    for key, sub in SUMMARY_SCHEMA.items():
        if sub is not None:
            assert list(summary[key]) == list(sub), key
    assert summary["policy"] == "pollux"
    assert summary["workload"] == "tiny"
    cluster = summary["cluster"]
    assert (cluster["nodes"], cluster["gpus_per_node"], cluster["inference_nodes"]) == (2, 4, 0)
    assert (cluster["lent_gpu_s"], cluster["reclaims"]) == (0.0, 0)
    assert summary["training"]["jobs"] == 2
    assert summary["training"]["completed"] == 2
    assert 0 < summary["training"]["avg_jct_s"] <= summary["training"]["makespan_s"]
    assert summary["scheduler"]["rounds"] >= 1
    # The table goes to stdout; the inference warning to stderr, exactly once.
    assert "Average JCT" in captured.out
    warnings = [line for line in captured.err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "2 inference tasks" in warnings[0]
    assert "Traceback" not in captured.err
    assert "Inference" not in captured.out  # none served: no inference table


def test_simulate_prints_an_inference_table_when_it_serves_inference(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    workload = make_tiny_workload(tmp_path)
    out = tmp_path / "summary.json"
    argv = ["simulate", "--workload", str(workload), "--policy", "deepboot", "--cluster", "2x4"]
    code = main([*argv, "--inference-nodes", "1", "--summary-json", str(out), "--quiet"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    inference = json.loads(out.read_text(encoding="utf-8"))["inference"]
    text = captured.out
    assert "Inference" in text
    # Each figure of the table is the summary's, with the SLO it was measured against.
    [slo] = [line for line in text.splitlines() if "Within the SLO" in line]
    assert "wait <= 1 s" in slo and f"{100 * inference['slo_attainment']:.1f}%" in slo
    [requests] = [line for line in text.splitlines() if "│ Requests " in line]
    assert requests.split("│")[2].strip() == f"{inference['tasks']:,}"
    for label in ("Median wait", "p99 wait", "Cold starts", "Reclaims (proactive / reactive)",
                  "GPU-hours lent to training"):  # fmt: skip
        assert label in text, label
