"""Golden summary: ``deepboot`` on DeepBoot's ``small.csv`` (16 x 4 GPUs, 8 inference
nodes, measured profiles), run in-process through the CLI as a user runs it.

Every field of the summary except ``wall_s`` and the decision latencies must match
``tests/sim/golden/deepboot-small.json`` exactly, on every machine and under every
``NPY_DISABLE_CPU_FEATURES`` setting (CI runs this file under several; see
``make test-determinism``). After an intended change of behaviour, regenerate with::

    UPDATE_GOLDEN=1 .venv/bin/pytest tests/sim/test_golden_summary.py

in a commit of its own that says why (CONTRIBUTING.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from deepboot.cli.main import main

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
GOLDEN = Path(__file__).parent / "golden" / "deepboot-small.json"

# Measured on the machine that ran it: never part of the comparison.
MACHINE_FIELDS = {
    ("wall_s",),
    ("scheduler", "decision_ms_median"),
    ("scheduler", "decision_ms_max"),
}


def without_machine_fields(summary: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(summary))
    for path in MACHINE_FIELDS:
        node = out
        for key in path[:-1]:
            node = node.get(key, {})
        node.pop(path[-1], None)
    return out


@pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces is absent")
def test_deepboot_small_summary_is_golden(tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    code = main(
        [
            "simulate",
            "--workload",
            str(TRACES / "workloads" / "small.csv"),
            "--policy",
            "deepboot",
            "--cluster",
            "16x4",
            "--inference-nodes",
            "8",
            "--profiles",
            str(TRACES / "profiles"),
            "--quiet",
            "--summary-json",
            str(out),
        ]
    )
    assert code == 0
    got = without_machine_fields(json.loads(out.read_text()))
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    assert got == json.loads(GOLDEN.read_text())


def test_machine_fields_are_the_only_ones_dropped() -> None:
    summary = {"wall_s": 1.0, "scheduler": {"rounds": 3, "decision_ms_max": 2.0}, "x": 1}
    assert without_machine_fields(summary) == {"scheduler": {"rounds": 3}, "x": 1}
