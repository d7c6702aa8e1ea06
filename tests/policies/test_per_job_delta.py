"""Per-job restart costs (``JobView.restart_cost``) in the policies that weigh a resize
against its cost: Pollux's realloc factor and DeepBoot's restart penalty."""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt
import pytest

from deepboot.core import ClusterState, JobView, Placement
from deepboot.core.placement import Allocation
from deepboot.perf.speedup import SpeedupFn
from deepboot.policies import registry
from deepboot.policies.allocation import realloc_factor, restart_delta
from deepboot.policies.deepboot import DeepBootConfig, DeepBootPolicy, restart_penalty
from deepboot.policies.pollux import pollux_allocate
from deepboot.policies.pollux_fitness import PolluxConfig, PolluxProblem

from .builders import make_job, make_state

RNG = np.random.default_rng(0)
NOW = 3600.0
RESTART_S = 600.0
"""A restart cost so dear that two restarts in 1,000 s leave nothing to gain."""


def linear(job: JobView) -> SpeedupFn:
    """Every job scales linearly (the speedup of K GPUs is K)."""

    def speedup(n: npt.NDArray[np.int64], k: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        return np.asarray(k, dtype=np.float64)

    return speedup


def running(name: str, restart_cost: float | None, submit_time: float = NOW - 1000.0) -> JobView:
    """A 1,000 s old job with two restarts, on 1 GPU of node 0, that could use 4."""
    job = make_job(name, submit_time=submit_time, num_restarts=2, placement=(0,), max_replicas=4)
    return dataclasses.replace(job, restart_cost=restart_cost)


def test_restart_delta_takes_the_jobs_own_cost_when_asked() -> None:
    afe, dear = running("afe", None), running("dear", RESTART_S)
    assert restart_delta(afe, 30.0) == 30.0
    assert restart_delta(dear, 30.0) == RESTART_S
    assert restart_delta(dear, 30.0, per_job=False) == 30.0
    # The policy's default is the floor: a cheaper own cost is never weighed as cheaper
    # than a job of unknown cost (an AFE job).
    cheap = dataclasses.replace(afe, restart_cost=5.0)
    assert restart_delta(cheap, 30.0) == 30.0
    assert restart_delta(cheap, 2.0) == 5.0
    assert restart_penalty(dear, NOW, 10.0) == realloc_factor(1000.0, 2, 10.0)


def test_a_view_refuses_a_negative_or_infinite_cost() -> None:
    with pytest.raises(ValueError, match="restart_cost must be finite and >= 0"):
        running("a", -1.0)
    with pytest.raises(ValueError, match="restart_cost must be finite and >= 0"):
        running("a", float("inf"))


def deepboot_counts(state: ClusterState, **params: str) -> dict[str, int]:
    policy = registry.create("deepboot", **params)
    assert isinstance(policy, DeepBootPolicy)
    return policy.gpu_counts(state)


def test_deepboot_resizes_an_afe_job_and_keeps_a_dear_restart_job() -> None:
    # Alone on a 4-GPU node: the AFE job (delta 10 s, penalty 0.97) grows to 4 GPUs;
    # the same job at 600 s a restart (penalty 0) stays on its one.
    assert deepboot_counts(make_state([running("j", None)], nodes=1)) == {"j": 4}
    assert deepboot_counts(make_state([running("j", RESTART_S)], nodes=1)) == {"j": 1}
    # The uniform ablation weighs it as any other job.
    uniform = make_state([running("j", RESTART_S)], nodes=1)
    assert deepboot_counts(uniform, per_job_delta="false") == {"j": 4}


def test_deepboot_gives_the_spare_gpus_to_the_afe_job() -> None:
    afe = running("afe", None)
    restart = running("restart", RESTART_S, submit_time=NOW - 1000.0 + 1)
    state = make_state([afe, restart], nodes=1)
    assert deepboot_counts(state) == {"afe": 3, "restart": 1}


def pollux(state: ClusterState, **config: bool) -> Allocation:
    return pollux_allocate(state, PolluxConfig(**config), linear)


def test_pollux_reallocates_an_afe_job_and_keeps_a_dear_restart_job() -> None:
    grown = pollux(make_state([running("j", None)], nodes=1))
    assert grown["j"].num_replicas == 4
    kept = pollux(make_state([running("j", RESTART_S)], nodes=1))
    assert kept["j"] == Placement((0,))
    uniform = pollux(make_state([running("j", RESTART_S)], nodes=1), per_job_delta=False)
    assert uniform["j"].num_replicas == 4


def test_pollux_gives_the_spare_gpus_to_the_afe_job() -> None:
    afe = running("afe", None)
    restart = dataclasses.replace(running("restart", RESTART_S), placement=Placement((0,)))
    state = make_state([afe, restart], nodes=1)
    alloc = pollux(state)
    assert alloc["restart"] == Placement((0,))
    assert alloc["afe"].num_replicas == 3
    # Without the per-job cost both are worth moving, and the fair power mean splits
    # the spare GPUs.
    uniform = pollux(state, per_job_delta=False)
    assert uniform["restart"].num_replicas == uniform["afe"].num_replicas == 2


def test_pollux_factor_uses_each_jobs_delta() -> None:
    jobs = [running("afe", None), running("restart", RESTART_S), running("cheap", 0.0)]
    problem = PolluxProblem(make_state(jobs, nodes=1), PolluxConfig(), linear)
    factor = dict(zip((j.name for j in problem.jobs), problem.factor.tolist(), strict=True))
    assert factor["afe"] == factor["cheap"] == (1000 - 2 * 30) / (1000 + 30)
    assert factor["restart"] == 0.0


@pytest.mark.parametrize("name", ["pollux", "deepboot"])
def test_the_ablation_is_a_registered_parameter(name: str) -> None:
    policy = registry.create(name, per_job_delta="false")
    assert policy.config.per_job_delta is False  # type: ignore[attr-defined]
    assert DeepBootConfig().per_job_delta is PolluxConfig().per_job_delta is True
