"""Tiresias: two-queue LAS, FIFO within a queue, preemption, whole requests."""

from __future__ import annotations

import numpy as np
import pytest

from deepboot.core import Placement
from deepboot.policies import TiresiasConfig, TiresiasPolicy

from .builders import make_job, make_state

HOUR = 3600.0
RNG = np.random.default_rng(0)


@pytest.mark.parametrize(
    ("attained_hours", "threshold", "queue"),
    [(0.0, 16.0, 0), (15.99, 16.0, 0), (16.0, 16.0, 1), (40.0, 16.0, 1), (10.0, 8.0, 1)],
    ids=["fresh", "just-below", "at-threshold", "far-above", "custom-threshold"],
)
def test_queue_by_attained_service(attained_hours: float, threshold: float, queue: int) -> None:
    policy = TiresiasPolicy(TiresiasConfig(queue_threshold_gpu_hours=threshold))
    assert policy.queue_of(make_job(attained_service=attained_hours * HOUR)) == queue


@pytest.mark.parametrize(
    ("old_hours", "threshold", "winner"),
    [(17.0, 16.0, "new"), (17.0, 20.0, "old"), (3.0, 16.0, "old")],
    ids=["demoted-old-job-is-preempted", "higher-threshold-keeps-it", "both-in-queue-0-fifo"],
)
def test_demotion_decides_preemption(old_hours: float, threshold: float, winner: str) -> None:
    old = make_job(
        "old",
        submit_time=0,
        attained_service=old_hours * HOUR,
        target_num_replicas=4,
        placement=(0, 0, 0, 0),
    )
    new = make_job("new", submit_time=100, target_num_replicas=4)
    policy = TiresiasPolicy(TiresiasConfig(queue_threshold_gpu_hours=threshold))
    alloc = policy.allocate(make_state([old, new], nodes=1), RNG)
    assert set(alloc) == {winner}
    if winner == "old":
        assert alloc["old"] == Placement((0, 0, 0, 0))  # kept where it was


def test_preemption_order_follows_queues_then_submission() -> None:
    jobs = [
        make_job("q1-early", submit_time=0, attained_service=30 * HOUR, target_num_replicas=2),
        make_job("q1-late", submit_time=5, attained_service=20 * HOUR, target_num_replicas=2),
        make_job("q0-late", submit_time=9, target_num_replicas=2),
        make_job("q0-early", submit_time=8, target_num_replicas=2),
    ]
    policy = TiresiasPolicy()
    order = [j.name for j in policy.priority_order(make_state(jobs, nodes=1))]
    assert order == ["q0-early", "q0-late", "q1-early", "q1-late"]
    alloc = policy.allocate(make_state(jobs, nodes=1, gpus=6), RNG)
    assert set(alloc) == {"q0-early", "q0-late", "q1-early"}


def test_a_job_runs_only_when_its_whole_request_fits_and_later_jobs_backfill() -> None:
    wide = make_job("wide", submit_time=0, target_num_replicas=6)
    narrow = make_job("narrow", submit_time=1, target_num_replicas=3)
    alloc = TiresiasPolicy().allocate(make_state([wide, narrow], nodes=1), RNG)
    assert dict(alloc) == {"narrow": Placement((0, 0, 0))}


def test_new_jobs_take_the_node_with_most_free_gpus() -> None:
    holder = make_job("holder", submit_time=0, target_num_replicas=3, placement=(0, 0, 0))
    new = make_job("new", submit_time=1, target_num_replicas=1)
    alloc = TiresiasPolicy().allocate(make_state([holder, new], nodes=2), RNG)
    assert alloc["holder"] == Placement((0, 0, 0))
    assert alloc["new"] == Placement((1,))
