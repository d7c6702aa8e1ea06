"""The ground-truth application model the simulator advances jobs with.

Two implementations exist (both owned by perf/):

* ``perf.profiles.ProfiledApplication``: interpolates the measured reference traces
  (``--profiles DIR``), exactly as the reference simulators do.
* ``perf.catalog.CatalogApplication``: the compact fitted model shipped in the package.
"""

from __future__ import annotations

from typing import Protocol

from deepboot.core.params import BatchLimits


class Application(Protocol):
    """Ground truth for one model. Implementations are immutable after construction.

    Attributes:
        name: Model name ("cifar10", ...).
        limits: Batch-size limits.
        max_epochs: Epochs to completion.
    """

    name: str
    limits: BatchLimits
    max_epochs: int

    def step_time(self, shape: tuple[int, ...], local_bsz: int) -> tuple[float, float]:
        """(step_time, sync_time) in seconds of one optimizer step without accumulation.

        Args:
            shape: GPUs per used node in node order, e.g. (2, 2). Rotations are the
                same placement (the reference canonicalizes to the smallest rotation);
                the catalog only looks at node and replica counts.
            local_bsz: Per-GPU batch of one micro-step.
        """
        ...

    def grad_stats(self, batch_size: int, epoch: int) -> tuple[float, float]:
        """(grad_sqr, grad_var) during ``epoch`` (0-based) at total ``batch_size``."""
        ...

    def progress_at(self, epoch: int) -> float:
        """Cumulative statistical progress at the end of ``epoch`` epochs (0 -> 0.0)."""
        ...
