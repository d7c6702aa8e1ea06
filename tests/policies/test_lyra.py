"""Lyra / Aryl: a knapsack over jobs valued by remaining time * w / (w + min + 1)."""

from __future__ import annotations

import numpy as np
import pytest

from deepboot.core import JobMode, Placement
from deepboot.policies import LyraPolicy, registry
from deepboot.policies.lyra import LyraConfig, lyra_items

from .builders import make_job, make_state

RNG = np.random.default_rng(0)


@pytest.mark.parametrize(
    ("min_replicas", "most", "low", "values"),
    [
        (0, 1, 1, [100.0]),
        (1, 1, 1, [100.0]),
        (0, 3, 1, [50.0, 100 * 2 / 3, 75.0]),
        (1, 3, 2, [100 / 3, 50.0]),
        (0, 0, 1, []),
        (2, 2, 3, []),
    ],
    ids=["one-gpu", "one-gpu-min-one", "elastic", "min-one", "no-gpu", "max-at-min"],
)
def test_items(min_replicas: int, most: int, low: int, values: list[float]) -> None:
    job = make_job(min_replicas=min_replicas)
    got_low, got = lyra_items(job, 100.0, most)
    assert got_low == low
    np.testing.assert_allclose(got, values)


def test_jobs_are_ordered_by_remaining_time() -> None:
    jobs = [
        make_job("long", submit_time=0, remaining_progress=9e4),
        make_job("short", submit_time=1, remaining_progress=1e3),
    ]
    order = [j.name for j, _ in LyraPolicy().ordered(make_state(jobs))]
    assert order == ["short", "long"]


def test_a_single_gpu_goes_to_the_longest_job() -> None:
    # The artifact's values grow with remaining time: with one GPU the longest job wins.
    jobs = [
        make_job("long", submit_time=0, remaining_progress=9e4, target_num_replicas=1),
        make_job("short", submit_time=1, remaining_progress=1e3, target_num_replicas=1),
    ]
    counts = LyraPolicy().gpu_counts(make_state(jobs, nodes=1, gpus=1))
    assert counts == {"long": 1, "short": 0}


def test_first_workers_are_worth_more_than_extra_ones() -> None:
    # Equal remaining times: value w / (w + 1) is concave, so 4 GPUs split 2 + 2.
    jobs = [
        make_job(f"j{i}", submit_time=i, remaining_progress=1e3, target_num_replicas=4)
        for i in range(2)
    ]
    counts = LyraPolicy().gpu_counts(make_state(jobs, nodes=1, gpus=4))
    assert counts == {"j0": 2, "j1": 2}


@pytest.mark.parametrize(
    ("cap_at_requested", "expected"),
    [(True, 2), (False, 8)],
    ids=["artifact-cap", "max-replicas-only"],
)
def test_cap_at_requested(cap_at_requested: bool, expected: int) -> None:
    job = make_job("j", target_num_replicas=2, max_replicas=8, remaining_progress=1e3)
    policy = LyraPolicy(LyraConfig(cap_at_requested=cap_at_requested))
    assert policy.gpu_counts(make_state([job], nodes=2)) == {"j": expected}


def test_unchanged_counts_keep_their_placement() -> None:
    a = make_job("a", submit_time=0, placement=(1, 1), target_num_replicas=2)
    b = make_job("b", submit_time=1, target_num_replicas=2)
    alloc = LyraPolicy().allocate(make_state([a, b], nodes=2), RNG)
    assert alloc["a"] == Placement((1, 1))
    assert alloc["b"].num_replicas == 2


def test_registered_with_a_fixed_batch() -> None:
    policy = registry.create("lyra", cap_at_requested="no")
    assert policy.name == "lyra"
    assert policy.job_mode is JobMode.FIXED_BATCH
    assert policy.config == LyraConfig(cap_at_requested=False)  # type: ignore[attr-defined]
