"""The controller's online goodput model: fitted from workers' real timings."""

from __future__ import annotations

import math

from deepboot.core.params import GradParams
from deepboot.elastic.protocol import Measurement, WorkerReport, WorkerStatus
from deepboot.runtime.jobspec import JobSpec
from deepboot.runtime.store import JobRow, JobState
from deepboot.runtime.world import JobRec, OnlineModel


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


def test_nonsense_timings_are_ignored() -> None:
    model = OnlineModel()
    model.add((Measurement(1, 1, 8, 0.0, 0.1), Measurement(1, 1, 8, 0.2, 0.1)))
    assert model.profile == {} and model.perf is None


def test_gradient_statistics_come_from_reports_and_pick_the_batch() -> None:
    spec = JobSpec(
        name="a", entry="m:f", batch_size=32, max_batch_size=1024, max_local_batch_size=256
    )
    rec = JobRec(JobRow("a", spec, JobState.RUNNING, 0.0))
    assert rec.batch_for(1, 4) == (8, 1)  # no model yet: the initial batch, split
    rec.model.add(_timings(1, 1, 8) + _timings(1, 2, 16) + _timings(1, 4, 64))
    report = WorkerReport("0.0", WorkerStatus.RUNNING, 1, 10, 0.5, grad_sqr=1.0, grad_var=50.0)
    rec.model.note_grad(report)
    assert rec.model.grad == GradParams(1.0, 50.0)
    local, accum = rec.batch_for(1, 4)
    assert local * accum * 4 > 32  # noisy gradients and cheap steps: a larger batch
    assert 1 <= local <= 256 and accum >= 1
    rec.model.note_grad(WorkerReport("0.0", WorkerStatus.RUNNING, 1, 10, math.nan))
    assert rec.model.grad == GradParams(1.0, 50.0)  # nan statistics leave it alone
