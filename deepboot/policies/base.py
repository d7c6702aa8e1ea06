"""The contract every training-allocation policy implements."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from deepboot.core.modes import JobMode
from deepboot.core.placement import Allocation
from deepboot.core.state import ClusterState


class TrainingPolicy(Protocol):
    """A pure decision function over an immutable snapshot.

    ``allocate`` must:
      * never mutate ``state``;
      * return placements only for jobs in ``state.jobs``;
      * never use more GPUs on a node than ``state.capacity`` allows;
      * be deterministic given the state and the generator's seed.

    Policies hold configuration only (frozen dataclass fields), never per-job state:
    anything carried across rounds must be in the snapshot.
    """

    # Read-only properties, so that frozen dataclasses (and plain attributes) satisfy it.
    @property
    def name(self) -> str:
        """Registry name of the policy."""
        ...

    @property
    def job_mode(self) -> JobMode:
        """How the simulator/runtime sizes the batch of this policy's jobs."""
        ...

    def allocate(self, state: ClusterState, rng: np.random.Generator) -> Allocation:
        """Return the new allocation: job name -> placement (absent = no GPUs)."""
        ...
