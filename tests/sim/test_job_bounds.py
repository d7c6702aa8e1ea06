"""``SimConfig.job_bounds``: the reference simulator's sizing rules, or the runtime's
(``runtime.world.JobRec.view``), so that a simulation can be the twin of a runtime
run (``bench/twin.py``)."""

from __future__ import annotations

import pytest

from deepboot.core import Placement, TrainingJobSpec
from deepboot.core.errors import ConfigError
from deepboot.core.modes import JobMode
from deepboot.perf.restart import FlatRestartCost
from deepboot.sim.config import SimConfig
from deepboot.sim.job import GroundTruth, SimJob
from tests.sim.test_engine import TinyApp


def _job(runtime_bounds: bool, grad_min_replicas: int = 1) -> SimJob:
    spec = TrainingJobSpec("a", 0.0, "tiny", 1, 100)
    return SimJob(
        spec, GroundTruth(TinyApp()), JobMode.ADAPTIVE, app_replica_cap=4,
        runtime_bounds=runtime_bounds, grad_min_replicas=grad_min_replicas,
    )  # fmt: skip


def test_reference_bounds_grow_twice_the_most_run_from_zero() -> None:
    j = _job(runtime_bounds=False)
    v = j.view(0.0)
    assert (v.min_replicas, v.max_replicas) == (0, 1)  # 2 x 0 runs, never below 1


def test_runtime_bounds_take_the_cap_at_once_and_pin_a_resize_in_its_pause() -> None:
    j = _job(runtime_bounds=True)
    v = j.view(0.0)
    assert (v.min_replicas, v.max_replicas) == (1, 4)  # max_workers at once
    j.reallocate(Placement((0, 0)), 0.0, FlatRestartCost(30.0))
    assert j.restart_left > 0
    v = j.view(0.0)
    assert (v.min_replicas, v.max_replicas) == (2, 2)  # its generation is forming
    j.advance(60.0)
    assert j.restart_left == 0
    v = j.view(60.0)
    assert (v.min_replicas, v.max_replicas) == (1, 4)


def test_an_unknown_rule_is_refused() -> None:
    with pytest.raises(ConfigError, match="job_bounds"):
        SimConfig(job_bounds="kubernetes")
    with pytest.raises(ConfigError, match="grad_min_replicas"):
        SimConfig(grad_min_replicas=0)


def test_gradient_statistics_from_the_first_step_by_default() -> None:
    j = _job(runtime_bounds=True)
    j.reallocate(Placement((0,)), 0.0, FlatRestartCost(1.0))
    j.advance(10.0)
    assert j.view(10.0).grad_params is not None


def test_gradient_statistics_as_the_runtime_measures_them_need_two_gpus() -> None:
    """As the runtime's estimator (it compares ranks): none on 1 GPU, then kept."""
    j = _job(runtime_bounds=True, grad_min_replicas=2)
    cost = FlatRestartCost(1.0)
    j.reallocate(Placement((0,)), 0.0, cost)
    j.advance(10.0)
    assert j.view(10.0).perf_params is not None  # it measured its step times...
    assert j.view(10.0).grad_params is None  # ...but no gradient noise on one rank
    j.reallocate(Placement((0, 0)), 10.0, cost)
    j.advance(20.0)
    seen = j.view(20.0).grad_params
    assert seen is not None
    j.reallocate(Placement((0,)), 20.0, cost)
    j.advance(30.0)
    assert j.view(30.0).grad_params == seen  # back on one GPU: the last ones stay
