"""Event-time lending in the simulator: the hand-computable cases of ``test_engine``
(a job at 1 unit/s per GPU, 1,200 units, a 30 s start), decided at each event."""

from __future__ import annotations

import pytest
from test_engine import TinyApp, make_job, run

from deepboot.core import ClusterSpec, InferenceTaskSpec, Workload
from deepboot.policies.deepboot import DeepBootPolicy
from deepboot.sim.config import SimConfig
from deepboot.sim.run import simulate


def test_a_job_starts_at_its_submission_not_at_the_next_tick() -> None:
    r = run(make_job("a", submit=10.0), event_lending=True).rec("a")
    assert r.first_start == 10.0
    assert r.completion == pytest.approx(10.0 + 30.0 + 1200.0)
    assert r.queue_delay == 0.0


def test_a_finished_jobs_gpu_goes_to_the_next_job_at_once() -> None:
    out = run(make_job("a"), make_job("b"), event_lending=True)
    # a starts at 0 (its submission) and ends at 1230; b starts then, not at 1260.
    assert out.rec("a").completion == pytest.approx(1230.0)
    assert out.rec("b").first_start == pytest.approx(1230.0)
    assert out.rec("b").completion == pytest.approx(2460.0)


def test_a_second_job_takes_the_gpu_left_free_at_its_submission() -> None:
    # a takes one GPU at 0 (its size), b the other at 20; the rounds still run.
    out = run(make_job("a"), make_job("b", submit=20.0), shape="1x2", event_lending=True)
    assert out.rec("a").first_start == 0.0
    assert out.rec("b").first_start == 20.0
    assert out.result.rounds > 0


def test_an_adaptive_run_with_inference_lends_at_events_and_stays_consistent() -> None:
    """DeepBoot's allocator on a 2-node cluster with one inference node: the run ends,
    every job finishes, and the invariants hold at every event (``check_invariants``)."""
    jobs = tuple(make_job(f"j{i}", submit=30.0 * i) for i in range(4))
    tasks = tuple(
        InferenceTaskSpec(f"t{i}", 45.0 * i + 5.0, "infer-bert-1", "bert", 20.0, 1)
        for i in range(20)
    )
    workload = Workload("w", jobs, tasks)
    results = {}
    for eager in (False, True):
        results[eager] = simulate(
            workload,
            ClusterSpec.parse("2x2", inference_nodes=1),
            DeepBootPolicy(),
            {"tiny": TinyApp()},
            SimConfig(event_lending=eager, check_invariants=True),
        )
    assert all(r.completion is not None for r in results[True].jobs)
    mean = {k: sum(r.jct for r in v.jobs) / len(v.jobs) for k, v in results.items()}
    assert mean[True] < mean[False]
