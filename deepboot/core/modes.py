"""How a policy wants the simulator/runtime to size each job's batch and replicas."""

from __future__ import annotations

import enum


class JobMode(enum.Enum):
    """Batch/replica regime a training policy assumes.

    ADAPTIVE: batch size and accumulation re-optimized by the goodput model (Pollux,
        DeepBoot); replicas chosen by the policy.
    FIXED_BATCH: the user's total batch size is kept; replicas chosen by the policy
        (Optimus, AFS).
    FIXED: the user's batch size and replica count are both kept (Tiresias, FIFO).
    """

    ADAPTIVE = "adaptive"
    FIXED_BATCH = "fixed_batch"
    FIXED = "fixed"
