"""The workload of ``make demo`` (``examples/demo-deepboot.csv``) and its generator.

The shipped file must load with the package's own loader and the built-in catalog,
hold both training jobs and inference tasks, and be exactly what
``examples/make_demo_workload.py`` writes, so that it can never drift from its
generator. The demo simulation itself is not run here (it takes several seconds).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from deepboot.perf.catalog import load_catalog
from deepboot.sim.workload import load_workload

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SHIPPED = EXAMPLES / "demo-deepboot.csv"
SCRIPT = EXAMPLES / "make_demo_workload.py"


@pytest.fixture(scope="module")
def generator() -> ModuleType:
    """``examples/make_demo_workload.py`` imported as a module (examples/ is no package)."""
    spec = importlib.util.spec_from_file_location("make_demo_workload", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_shipped_demo_workload_loads_with_training_and_inference() -> None:
    apps = load_catalog()
    workload = load_workload(SHIPPED, apps.keys())
    assert workload.name == "demo-deepboot"
    assert len(workload.training) >= 24
    assert len(workload.inference) > len(workload.training)
    for job in workload.training:
        assert job.batch_size <= apps[job.application].limits.max_batch_size, job.name
    assert {t.model for t in workload.inference} <= set(apps)
    assert all(re.fullmatch(r"infer-.+-\d+", t.service) for t in workload.inference)
    assert all(1 <= t.duration <= 9 for t in workload.inference)


def test_shipped_demo_inference_load_has_quiet_periods_and_bursts(
    generator: ModuleType,
) -> None:
    """Arrivals per compressed hour: silent hours (GPUs to lend) and busy ones."""
    workload = load_workload(SHIPPED, load_catalog().keys())
    hour_s = generator.DAY_S // 24
    per_hour = [0] * (generator.DAY_S * generator.INFERENCE_DAYS // hour_s)
    for task in workload.inference:
        per_hour[int(task.submit_time) // hour_s] += 1
    assert min(per_hour) == 0
    assert max(per_hour) > 200
    # Training jobs arrive both while inference is silent and while it bursts.
    levels = [generator.load_percent(int(j.submit_time)) for j in workload.training]
    assert min(levels) == 0
    assert max(levels) >= 80


def test_regenerating_gives_the_shipped_file(generator: ModuleType, tmp_path: Path) -> None:
    out = generator.write_demo_workload(tmp_path / "demo-deepboot.csv")
    assert out.read_bytes() == SHIPPED.read_bytes()


def test_generator_main_writes_out(generator: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "w.csv"
    assert generator.main(["--out", str(out)]) == 0
    assert out.read_bytes() == SHIPPED.read_bytes()


def test_another_seed_gives_another_workload(generator: ModuleType, tmp_path: Path) -> None:
    out = generator.write_demo_workload(tmp_path / "other.csv", seed=generator.SEED + 1)
    assert out.read_bytes() != SHIPPED.read_bytes()
    load_workload(out, load_catalog().keys())
