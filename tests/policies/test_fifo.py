"""FIFO: submission order, whole requests, non-preemptive, head-of-line blocking."""

from __future__ import annotations

import numpy as np

from deepboot.core import ClusterState, Placement
from deepboot.policies import registry

from .builders import make_job, make_state

RNG = np.random.default_rng(0)


def allocate(state: ClusterState) -> dict[str, Placement]:
    return dict(registry.create("fifo").allocate(state, RNG))


def test_head_of_line_job_blocks_later_ones() -> None:
    running = make_job("running", submit_time=0, target_num_replicas=4, placement=(0, 0, 0, 0))
    big = make_job("big", submit_time=10, target_num_replicas=6)
    small = make_job("small", submit_time=20, target_num_replicas=2)
    alloc = allocate(make_state([running, big, small], nodes=2))
    assert alloc == {"running": Placement((0, 0, 0, 0))}


def test_jobs_start_in_submission_order_while_they_fit() -> None:
    jobs = [make_job(f"j{i}", submit_time=i, target_num_replicas=3) for i in range(3)]
    alloc = allocate(make_state(jobs, nodes=2))
    assert set(alloc) == {"j0", "j1"}
    assert all(p.num_replicas == 3 and p.num_nodes == 1 for p in alloc.values())


def test_running_jobs_are_never_preempted_by_earlier_queued_jobs() -> None:
    early = make_job("early", submit_time=0, target_num_replicas=4)
    late = make_job("late", submit_time=50, target_num_replicas=2, placement=(0, 0))
    alloc = allocate(make_state([early, late], nodes=1))
    assert alloc == {"late": Placement((0, 0))}


def test_new_jobs_get_the_fewest_nodes_best_fit() -> None:
    holder = make_job("holder", submit_time=0, target_num_replicas=2, placement=(1, 1))
    new = make_job("new", submit_time=1, target_num_replicas=2)
    alloc = allocate(make_state([holder, new], nodes=2))
    assert alloc["new"] == Placement((1, 1))  # the node with exactly 2 free


def test_a_job_that_lost_its_gpus_rejoins_the_queue() -> None:
    a = make_job("a", submit_time=0, target_num_replicas=2, placement=(0, 0))
    alloc = allocate(make_state([a], nodes=2, capacity={0: 1, 1: 4}))
    assert alloc == {"a": Placement((1, 1))}


def test_a_job_that_can_never_run_does_not_block_the_queue() -> None:
    stuck = make_job("stuck", submit_time=0, target_num_replicas=8, max_replicas=4)
    after = make_job("after", submit_time=1, target_num_replicas=1)
    assert set(allocate(make_state([stuck, after], nodes=1))) == {"after"}
