"""Optimus: one GPU at a time to the job whose remaining time falls the most."""

from __future__ import annotations

import numpy as np

from deepboot.core import Placement
from deepboot.policies import OptimusPolicy

from .builders import PERF, POOR_PERF, make_job, make_state

RNG = np.random.default_rng(0)


def test_extra_gpus_go_to_the_job_with_the_most_remaining_work() -> None:
    short = make_job(
        "short", submit_time=0, fitted=True, target_batch_size=512, remaining_progress=1_000
    )
    long = make_job(
        "long", submit_time=1, fitted=True, target_batch_size=512, remaining_progress=10_000
    )
    counts = OptimusPolicy().gpu_counts(make_state([short, long], nodes=1, gpus=3))
    assert counts == {"short": 1, "long": 2}


def test_extra_gpus_go_to_the_job_that_scales() -> None:
    scales = make_job(
        "scales", submit_time=1, perf=PERF, target_batch_size=512, remaining_progress=5_000
    )
    stalls = make_job(
        "stalls", submit_time=0, perf=POOR_PERF, target_batch_size=512, remaining_progress=5_000
    )
    counts = OptimusPolicy().gpu_counts(make_state([scales, stalls], nodes=1, gpus=4))
    assert counts == {"scales": 3, "stalls": 1}


def test_no_gpu_is_given_where_it_would_slow_the_job_down() -> None:
    stalls = make_job("stalls", perf=POOR_PERF, target_batch_size=512, remaining_progress=5_000)
    assert OptimusPolicy().gpu_counts(make_state([stalls], nodes=1)) == {"stalls": 1}


def test_every_job_first_gets_one_gpu_in_submission_order() -> None:
    jobs = [make_job(f"j{i}", submit_time=i, fitted=True, remaining_progress=1e4) for i in range(3)]
    counts = OptimusPolicy().gpu_counts(make_state(jobs, nodes=1, gpus=2))
    assert counts == {"j0": 1, "j1": 1, "j2": 0}


def test_caps_are_max_replicas_and_batch_over_min_local_batch() -> None:
    capped = make_job(
        "capped", fitted=True, max_replicas=2, target_batch_size=2048, remaining_progress=1e5
    )
    small_batch = make_job(
        "small",
        fitted=True,
        target_batch_size=64,  # 64 / 32 = 2
        remaining_progress=1e5,
    )
    counts = OptimusPolicy().gpu_counts(make_state([capped, small_batch], nodes=2))
    assert counts == {"capped": 2, "small": 2}


def test_jobs_without_a_model_scale_linearly() -> None:
    jobs = [
        make_job("a", submit_time=0, remaining_progress=100.0),
        make_job("b", submit_time=1, remaining_progress=300.0),
    ]
    counts = OptimusPolicy().gpu_counts(make_state(jobs, nodes=1))
    # Remaining time r/k: b (300 -> 150) then a or b (100 -> 50 vs 150 -> 100): both 50,
    # the tie goes to the earlier job.
    assert counts == {"a": 2, "b": 2}


def test_unchanged_counts_keep_their_placement() -> None:
    a = make_job("a", submit_time=0, placement=(1,), remaining_progress=10.0, max_replicas=1)
    b = make_job("b", submit_time=1, remaining_progress=10.0, max_replicas=1)
    alloc = OptimusPolicy().allocate(make_state([a, b], nodes=2), RNG)
    assert alloc["a"] == Placement((1,))
    assert alloc["b"] == Placement((0,))
