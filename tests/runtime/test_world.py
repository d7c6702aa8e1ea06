"""The controller's online goodput model: fitted from workers' real timings."""

from __future__ import annotations

import math

from deepboot.core.cluster import ClusterSpec, Node, Pool
from deepboot.core.modes import JobMode
from deepboot.core.params import GradParams
from deepboot.core.placement import Placement
from deepboot.elastic.protocol import Measurement, WorkerReport, WorkerStatus
from deepboot.policies.packing import requested_replicas
from deepboot.runtime.client.jobspec import JobSpec
from deepboot.runtime.controller.jobrecords import JobRec, OnlineModel
from deepboot.runtime.store.jobstore import JobRow, JobState
from deepboot.world.gpus import GpuBoard


def _timings(nodes: int, replicas: int, bsz: int, n: int = 3) -> tuple[Measurement, ...]:
    # A job whose compute grows with the batch and whose sync grows with replicas.
    compute = 0.01 + 0.002 * bsz
    sync = 0.0 if replicas == 1 else 0.02 + 0.005 * (replicas - 2)
    return tuple(Measurement(nodes, replicas, bsz, compute, compute + sync) for _ in range(n))


def test_the_model_is_fitted_from_measurements_and_round_trips() -> None:
    model = OnlineModel()
    model.add(_timings(1, 1, 8))
    assert model.perf is not None
    first = model.perf
    model.add(_timings(1, 2, 16) + _timings(2, 4, 16))
    assert model.perf != first  # a new configuration refits
    assert len(model.profile) == 3 and model.profile[(1, 1, 8)][0] == 3
    again = OnlineModel.from_json(model.to_json())
    assert again.profile == model.profile and again.perf == model.perf


def test_the_model_is_refitted_as_a_configurations_mean_settles() -> None:
    """A configuration's first step (after a resize) is slow; the fit follows its
    mean as samples come (at 2, 4, 8, ... of them), not that first sample alone."""
    model = OnlineModel()
    model.add(_timings(1, 1, 8, n=1))
    slow = (Measurement(2, 4, 16, 0.2, 0.6),)  # its first step: three times the rest
    model.add(slow)
    first = model.perf
    model.add(_timings(2, 4, 16, n=1))  # the second sample: a refit
    assert model.perf != first
    second = model.perf
    model.add(_timings(2, 4, 16, n=1))  # the third: none
    assert model.perf == second
    model.add(_timings(2, 4, 16, n=1))  # the fourth: again
    assert model.perf != second


def test_nonsense_timings_are_ignored() -> None:
    model = OnlineModel()
    model.add((Measurement(1, 1, 8, 0.0, 0.1), Measurement(1, 1, 8, 0.2, 0.1)))
    assert model.profile == {} and model.perf is None


def test_gradient_statistics_come_from_reports_and_pick_the_batch() -> None:
    spec = JobSpec(
        name="a", entry="m:f", batch_size=32, max_batch_size=1024, max_local_batch_size=256
    )
    rec = JobRec(JobRow("a", spec, JobState.RUNNING, 0.0))
    assert rec.batch_for(1, 4, JobMode.ADAPTIVE) == (8, 1)  # no model yet: the initial batch, split
    rec.model.add(_timings(1, 1, 8) + _timings(1, 2, 16) + _timings(1, 4, 64))
    report = WorkerReport("0.0", WorkerStatus.RUNNING, 1, 10, 0.5, grad_sqr=1.0, grad_var=50.0)
    rec.model.note_grad(report)
    assert rec.model.grad == GradParams(1.0, 50.0)
    local, accum = rec.batch_for(1, 4, JobMode.ADAPTIVE)
    assert local * accum * 4 > 32  # noisy gradients and cheap steps: a larger batch
    assert 1 <= local <= 256 and accum >= 1
    # A policy that keeps the user's batch (fifo, tiresias; optimus) splits it instead.
    for mode in (JobMode.FIXED, JobMode.FIXED_BATCH):
        assert rec.batch_for(1, 4, mode) == (8, 1)
    rec.model.note_grad(WorkerReport("0.0", WorkerStatus.RUNNING, 1, 10, math.nan))
    assert rec.model.grad == GradParams(1.0, 50.0)  # nan statistics leave it alone


def test_a_policys_job_mode_sizes_the_runtimes_jobs_as_the_simulators() -> None:
    spec = JobSpec(
        name="a", entry="m:f", min_workers=1, max_workers=6, workers=3, batch_size=64,
        max_batch_size=256, min_local_batch_size=32,
    )  # fmt: skip
    rec = JobRec(JobRow("a", spec, JobState.QUEUED, 0.0))
    board = GpuBoard(ClusterSpec((Node(0, 8, Pool.TRAINING),)))
    # adaptive (pollux, deepboot): up to max_workers, and max_batch // min_local (8)
    # fixed batch (optimus): 64 // 32 = 2 workers at most; fixed (fifo): the 3 asked
    for mode, most, batch in (
        (JobMode.ADAPTIVE, 6, None), (JobMode.FIXED_BATCH, 2, 64), (JobMode.FIXED, 3, 64),
    ):  # fmt: skip
        view = rec.view(board, mode)
        assert (view.min_replicas, view.max_replicas) == (1, most), mode
        assert view.target_num_replicas == 3 and view.target_batch_size == batch
        assert view.placement == Placement.of(())
    # what FIFO runs it on: the request
    assert requested_replicas(rec.view(board, JobMode.FIXED)) == 3
    # without a request, a fixed-size policy runs it at min_workers
    plain = JobRec(JobRow("b", JobSpec(name="b", entry="m:f", min_workers=2), JobState.QUEUED, 0))
    assert requested_replicas(plain.view(board, JobMode.FIXED)) == 2
