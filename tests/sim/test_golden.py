"""Golden end-to-end simulations: a 10-job workload on the shipped catalog.

The per-job records (name, first start, completion rounded to 1e-6 s, restarts) are
compared as structured data with ``tests/sim/golden/<policy>.json``. After an
intended change of behaviour, regenerate the files with::

    UPDATE_GOLDEN=1 .venv/bin/pytest tests/sim/test_golden.py

and review the diff like code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from deepboot.core import ClusterSpec, TrainingJobSpec, Workload
from deepboot.perf.catalog import load_catalog
from deepboot.policies import registry
from deepboot.sim.config import SimConfig
from deepboot.sim.run import simulate

GOLDEN_DIR = Path(__file__).parent / "golden"
CLUSTER = "4x4"

# name, submit time, application, requested replicas, requested batch size.
JOBS: tuple[tuple[str, float, str, int, int], ...] = (
    ("bert-0", 0.0, "bert", 1, 12),
    ("cifar10-1", 30.0, "cifar10", 2, 256),
    ("ncf-2", 95.0, "ncf", 1, 32768),
    ("deepspeech2-3", 140.0, "deepspeech2", 2, 40),
    ("cifar10-4", 200.0, "cifar10", 4, 512),
    ("cifar10-5", 420.0, "cifar10", 1, 128),
    ("ncf-6", 600.0, "ncf", 1, 32768),
    ("deepspeech2-7", 610.0, "deepspeech2", 1, 20),
    ("cifar10-8", 1300.0, "cifar10", 1, 128),
    ("cifar10-9", 2000.0, "cifar10", 4, 512),
)


def make_workload() -> Workload:
    return Workload("golden-10", tuple(TrainingJobSpec(*row) for row in JOBS))


def records(policy: str) -> list[dict[str, Any]]:
    result = simulate(
        make_workload(),
        ClusterSpec.parse(CLUSTER),
        registry.create(policy),
        load_catalog(),
        SimConfig(interval=60.0, seed=0),
    )
    return [
        {
            "name": r.name,
            "start": None if r.first_start is None else round(r.first_start, 6),
            "completion": None if r.completion is None else round(r.completion, 6),
            "restarts": r.restarts,
        }
        for r in result.jobs
    ]


@pytest.mark.parametrize("policy", ["pollux", "optimus", "tiresias"])
def test_golden_records(policy: str) -> None:
    path = GOLDEN_DIR / f"{policy}.json"
    got = records(policy)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"workload": "golden-10", "cluster": CLUSTER, "policy": policy, "jobs": got}
        path.write_text(json.dumps(doc, indent=2) + "\n")
    expected = json.loads(path.read_text())["jobs"]
    assert got == expected
