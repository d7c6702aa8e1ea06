"""How large a job may be, and with which batch, under its policy's job mode: one
rule for both worlds.

A policy declares a :class:`~deepboot.core.modes.JobMode`: Pollux and DeepBoot
(``ADAPTIVE``) choose replicas while the goodput model re-picks the batch; Optimus,
AFS and Lyra (``FIXED_BATCH``) choose replicas around the user's total batch; FIFO
and Tiresias (``FIXED``) run the user's replica count with the user's batch. The
simulator's jobs and the runtime's jobs take their bounds and their batch from here,
so a policy sizes jobs the same way in both worlds. What each world feeds in differs
where the worlds do (see :func:`replica_cap`).
"""

from __future__ import annotations

from deepboot.core.modes import JobMode
from deepboot.core.params import BatchLimits


def replica_cap(
    mode: JobMode,
    limits: BatchLimits,
    *,
    requested: int,
    batch_size: int,
    adaptive_cap: int | None = None,
    cap: int | None = None,
) -> int:
    """Most GPUs a policy may give a job now; never below 1.

    Args:
        mode: The policy's job mode.
        limits: The job's batch limits.
        requested: The replica count the user asked for (``FIXED`` runs exactly it).
        batch_size: The user's total batch (``FIXED_BATCH`` gives each replica at
            least ``min_local_bsz`` of it).
        adaptive_cap: ``ADAPTIVE`` only: a growth bound of its own (the simulator's
            reference rule: 2 x the most replicas the job has run on, and 64); None
            for none (the runtime: the user's ``max_workers``, as ``cap``, bounds it).
        cap: A bound on ``ADAPTIVE`` and ``FIXED_BATCH`` (the simulator's
            per-application cap; the runtime's ``max_workers``); None for none.

    ``ADAPTIVE``: ``max_batch_size // min_local_bsz`` and ``adaptive_cap``;
    ``FIXED_BATCH``: ``batch_size // min_local_bsz``; both then ``cap``. ``FIXED``:
    ``requested``.
    """
    if mode is JobMode.FIXED:
        return max(requested, 1)
    if mode is JobMode.FIXED_BATCH:
        most = batch_size // limits.min_local_bsz
    else:
        most = limits.max_batch_size // limits.min_local_bsz
        if adaptive_cap is not None:
            most = min(adaptive_cap, most)
    if cap is not None:
        most = min(most, cap)
    return max(most, 1)


def target_batch(mode: JobMode, batch_size: int, adaptive: int | None = None) -> int | None:
    """The total batch a job keeps whatever its size (``select_batch`` splits it over
    the replicas), or None when the goodput model picks it (``ADAPTIVE``, unless
    ``adaptive`` forces one: the simulator's per-application setting)."""
    if mode is JobMode.ADAPTIVE:
        return adaptive
    return batch_size
