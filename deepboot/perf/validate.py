"""Time-to-completion of one job on a fixed placement, to compare ground-truth models.

Used to check that the shipped catalog is a good stand-in for the measured profiles
(``docs/perf.md``) and by the tests. It advances a job epoch by epoch exactly as the
reference simulator does (progress accrues at ``gain / step`` per second), with no
restarts and no scheduler.
"""

from __future__ import annotations

import enum

from deepboot.perf import detmath
from deepboot.perf.application import Application
from deepboot.perf.goodput import NUM_CANDIDATES, fixed_batch_split, initial_batch_size


class BatchRule(enum.Enum):
    """How the batch is chosen each epoch.

    INITIAL: the fixed batch an adaptive job starts with, max(M0, K * min_local_bsz).
    ORACLE: the batch with the best true goodput this epoch (an ideal adaptive job).
    """

    INITIAL = "initial"
    ORACLE = "oracle"


def true_goodput(app: Application, shape: tuple[int, ...], batch_size: int, epoch: int) -> float:
    """Progress per second at a fixed total batch during ``epoch`` (reference semantics).

    The batch is split with :func:`~deepboot.perf.goodput.fixed_batch_split`; the step
    takes ``step + accum * (step - sync)`` seconds and yields ``gain`` progress, with
    gain = (var + sqr) / (var / scale + sqr), scale = batch / M0.
    """
    replicas = sum(shape)
    atomic, accum = fixed_batch_split(replicas, batch_size, app.limits)
    step, sync = app.step_time(shape, atomic)
    total = step + accum * (step - sync)
    batch = replicas * atomic * (accum + 1)
    scale = batch / app.limits.init_batch_size
    sqr, var = app.grad_stats(batch, epoch)
    denom = var / scale + sqr
    gain = (var + sqr) / denom if denom > 0 else 1.0
    return gain / total


def completion_time(app: Application, shape: tuple[int, ...], rule: BatchRule) -> float:
    """Seconds to train ``app`` to ``max_epochs`` on ``shape`` (GPUs per node).

    Raises:
        ValueError: ``shape`` has no GPU.
    """
    replicas = sum(shape)
    if replicas < 1:
        raise ValueError("shape needs at least one GPU")
    lim = app.limits
    start = initial_batch_size(lim, replicas)
    if rule is BatchRule.ORACLE:
        lo = min(start, lim.max_batch_size)
        candidates = sorted(
            {int(b) for b in detmath.geomspace(lo, lim.max_batch_size, NUM_CANDIDATES)}
        )
    else:
        candidates = [start]
    total = 0.0
    for epoch in range(app.max_epochs):
        work = app.progress_at(epoch + 1) - app.progress_at(epoch)
        best = max(true_goodput(app, shape, b, epoch) for b in candidates)
        total += work / best
    return total
