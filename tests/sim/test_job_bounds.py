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


def _job(runtime_bounds: bool, grad_min_replicas: int = 1, profile_steps: int = 0) -> SimJob:
    spec = TrainingJobSpec("a", 0.0, "tiny", 1, 100)
    return SimJob(
        spec, GroundTruth(TinyApp()), JobMode.ADAPTIVE, app_replica_cap=4,
        runtime_bounds=runtime_bounds, grad_min_replicas=grad_min_replicas,
        profile_steps=profile_steps,
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
    with pytest.raises(ConfigError, match="profile_steps"):
        SimConfig(profile_steps=-1)


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


def test_a_configuration_is_measured_at_once_by_default() -> None:
    j = _job(runtime_bounds=True)
    j.reallocate(Placement((0,)), 0.0, FlatRestartCost(1.0))
    j.advance(1.2)  # 0.2 s of a 1 s step
    assert j.view(1.2).perf_params is not None


def test_with_profile_steps_a_configuration_is_measured_after_that_many_steps() -> None:
    """As the runtime, which times a generation's steps from its second: on 1 GPU a
    step takes 1 s (TinyApp), so after a 1 s restart delay the configuration is
    measured once 2 s more have run, not before; a configuration measured once is
    known at once when the job comes back to it."""
    j = _job(runtime_bounds=True, profile_steps=2)
    cost = FlatRestartCost(1.0)
    j.reallocate(Placement((0,)), 0.0, cost)
    j.advance(2.5)  # 1.5 steps run
    assert j.view(2.5).perf_params is None
    j.advance(3.2)  # 2.2 steps
    one = j.view(3.2).perf_params
    assert one is not None
    j.reallocate(Placement((0, 0)), 3.2, cost)
    j.advance(4.5)  # 0.3 s on 2 GPUs (0.5 s steps): not yet
    assert j.view(4.5).perf_params == one
    j.advance(5.3)  # 2.2 steps
    two = j.view(5.3).perf_params
    assert two is not None and two != one
    j.reallocate(Placement((0,)), 5.3, cost)
    j.advance(6.4)  # back on 1 GPU, 0.1 s in: known already, nothing new
    assert j.view(6.4).perf_params == two
