"""AFS: one GPU at a time, by marginal throughput gain ratio; first GPUs by remaining time."""

from __future__ import annotations

import numpy as np
import pytest

from deepboot.core import JobMode, Placement
from deepboot.policies import AfsPolicy, registry
from deepboot.policies.afs import MAX_REMAINING_TIME, AfsConfig, remaining_times

from .builders import PERF, POOR_PERF, make_job, make_state

RNG = np.random.default_rng(0)


def test_first_gpus_go_to_the_shortest_jobs() -> None:
    jobs = [
        make_job("long", submit_time=0, remaining_progress=9e4, target_batch_size=128),
        make_job("short", submit_time=1, remaining_progress=1e3, target_batch_size=128),
        make_job("mid", submit_time=2, remaining_progress=5e4, target_batch_size=128),
    ]
    counts = AfsPolicy().gpu_counts(make_state(jobs, nodes=1, gpus=2))
    assert counts == {"long": 0, "short": 1, "mid": 1}


def test_every_job_gets_a_gpu_before_any_gets_a_second() -> None:
    jobs = [make_job(f"j{i}", submit_time=i, fitted=True, target_batch_size=512) for i in range(5)]
    counts = AfsPolicy().gpu_counts(make_state(jobs, nodes=1, gpus=6))
    assert sorted(counts.values()) == [1, 1, 1, 1, 2]


def test_extra_gpus_go_to_the_job_with_the_higher_gain_ratio() -> None:
    scales = make_job("scales", submit_time=1, perf=PERF, target_batch_size=512)
    stalls = make_job("stalls", submit_time=0, perf=POOR_PERF, target_batch_size=512)
    counts = AfsPolicy().gpu_counts(make_state([scales, stalls], nodes=1, gpus=4))
    assert counts == {"scales": 3, "stalls": 1}


def test_linear_jobs_split_evenly() -> None:
    # Without a model throughput is linear: the ratio 1 / (k + 1) favours the job with
    # fewer GPUs, so counts stay within one of each other.
    jobs = [make_job(f"j{i}", submit_time=i, target_batch_size=1024) for i in range(3)]
    counts = AfsPolicy().gpu_counts(make_state(jobs, nodes=2, gpus=4))
    assert sorted(counts.values()) == [2, 3, 3]


@pytest.mark.parametrize(
    ("require_gain", "expected"),
    [(True, 1), (False, 4)],
    ids=["only-if-faster", "every-gpu-like-the-artifact"],
)
def test_gpus_that_would_not_help(require_gain: bool, expected: int) -> None:
    stalls = make_job("stalls", perf=POOR_PERF, target_batch_size=512, remaining_progress=5e3)
    policy = AfsPolicy(AfsConfig(require_gain=require_gain))
    assert policy.gpu_counts(make_state([stalls], nodes=1)) == {"stalls": expected}


def test_caps_are_max_replicas_and_batch_over_min_local_batch() -> None:
    capped = make_job("capped", submit_time=0, max_replicas=2, target_batch_size=2048)
    small = make_job("small", submit_time=1, target_batch_size=64)  # 64 / 32 = 2
    counts = AfsPolicy().gpu_counts(make_state([capped, small], nodes=2))
    assert counts == {"capped": 2, "small": 2}


def test_remaining_times_use_the_fitted_rate_or_the_mean_one() -> None:
    fitted = make_job("fitted", fitted=True, target_batch_size=128, remaining_progress=1000.0)
    unfitted = make_job("unfitted", target_batch_size=128, remaining_progress=1000.0)
    done = make_job("done", fitted=True, target_batch_size=128, remaining_progress=0.0)
    times = remaining_times([fitted, unfitted, done], [4])
    assert times[0] == pytest.approx(times[1])  # the mean fitted rate stands in
    assert 0 < times[2] < times[0] < MAX_REMAINING_TIME


def test_unchanged_counts_keep_their_placement() -> None:
    a = make_job("a", submit_time=0, placement=(1,), max_replicas=1, target_batch_size=64)
    b = make_job("b", submit_time=1, max_replicas=1, target_batch_size=64)
    alloc = AfsPolicy().allocate(make_state([a, b], nodes=2), RNG)
    assert alloc["a"] == Placement((1,))
    assert alloc["b"].num_replicas == 1


def test_registered_with_a_fixed_batch() -> None:
    policy = registry.create("afs", require_gain="false")
    assert policy.name == "afs"
    assert policy.job_mode is JobMode.FIXED_BATCH
    assert policy.config == AfsConfig(require_gain=False)  # type: ignore[attr-defined]
