"""What the control loop asks a world (simulator or runtime) to carry out.

A :class:`Step` of :class:`~deepboot.scheduler.control.ControlLoop` lists operations in
the order they must be applied. Training-job operations (``Start``, ``Resize``,
``Preempt``, :mod:`deepboot.scheduler.decision`) say which nodes a job runs on; the
GPU operations below say which GPUs change hands and which replicas start, protect,
sleep or go. A job operation never moves a GPU itself: the GPU operations before it
in the same step already did.

Every operation is a frozen value naming GPUs as ``(node_id, index)``. A replica that
spans several GPUs of one node (``ServiceSpec.gpus_per_replica`` > 1) is named by its
lead GPU (``gpu``, the lowest index of its set) and lists all of its GPUs in ``gpus``;
for a one-GPU replica ``gpus`` is empty and ``gpu`` is all of it (:func:`members`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TypeAlias

from deepboot.core.gpu import GpuId
from deepboot.scheduler.decision import Preempt, Resize, Start


@dataclass(frozen=True, slots=True)
class Bind:
    """A training job takes a FREE training-pool GPU (it becomes TRAINING)."""

    gpu: GpuId
    job: str


@dataclass(frozen=True, slots=True)
class Lend:
    """A training job borrows an idle (FREE) inference-pool GPU (it becomes LENT).

    A SLEEP replica on the GPU is evicted first, by an ``EvictReplica`` just before.
    """

    gpu: GpuId
    job: str


@dataclass(frozen=True, slots=True)
class Release:
    """A training job gives up a GPU it holds (TRAINING or LENT -> FREE) when it shrinks
    or is preempted."""

    gpu: GpuId
    job: str


@dataclass(frozen=True, slots=True)
class Reclaim:
    """Inference takes a LENT GPU back from ``job`` (-> FREE); a ``Resize`` of the job
    to its remaining GPUs follows in the same step.

    Attributes:
        proactive: Taken ahead of demand, for a ``WarmReplica`` later in the step,
            rather than for a request that is here (the simulator counts these apart).
    """

    gpu: GpuId
    job: str
    proactive: bool = False


@dataclass(frozen=True, slots=True)
class StartReplica:
    """Inference task ``task`` of ``service`` runs on ``gpu`` (-> RUNNING).

    Attributes:
        cold: A new replica is started (the model's start-up time first); False for a
            warm reuse of the service's PROTECT or SLEEP replica on that GPU, or for
            a task joining its RUNNING replica (a free slot of ``concurrency``, or a
            replica of ``WarmReplica`` still loading; the task starts once the replica
            is loaded).
        hits: The replica's warm-reuse count from now on.
        gpus: Every GPU of the replica when it spans several
            (``gpus_per_replica`` > 1), ``gpu`` (its lead) first, all on one node;
            empty for a one-GPU replica (then ``gpu`` alone).
    """

    gpu: GpuId
    service: str
    task: str
    cold: bool
    hits: int
    gpus: tuple[GpuId, ...] = ()


@dataclass(frozen=True, slots=True)
class WarmReplica:
    """A replica of ``service`` starts on a FREE inference-pool GPU with no task
    (FREE -> RUNNING): a cold start ahead of demand.

    The GPU is FREE at this point of the step: another service's SLEEP replica is
    evicted first (``EvictReplica``), a LENT GPU reclaimed first (``Reclaim`` with
    ``proactive=True`` and the job's ``Resize``). While it loads, a task of the
    service joins it (``StartReplica`` with ``cold=False``; the task starts when the
    replica is ready) rather than cold-starting another. When it is ready the world
    reports ``REPLICA_WARM``; a replica that took no task then goes RUNNING -> PROTECT
    until ``until`` (and on to SLEEP at once when ``until`` has passed).

    Attributes:
        until: When the ready replica's protect time ends.
        gpus: Every GPU of the replica when it spans several
            (``gpus_per_replica`` > 1), ``gpu`` (its lead) first, all on one node;
            empty for a one-GPU replica (then ``gpu`` alone).
    """

    gpu: GpuId
    service: str
    until: float
    gpus: tuple[GpuId, ...] = ()


@dataclass(frozen=True, slots=True)
class ProtectReplica:
    """A replica's task ended: RUNNING -> PROTECT until ``until`` (then ``SleepReplica``,
    when the world reports ``PROTECT_EXPIRED``).

    Attributes:
        gpu: The replica's (lead) GPU.
        gpus: Every GPU of the replica when it spans several
            (``gpus_per_replica`` > 1), ``gpu`` (its lead) first, all on one node;
            empty for a one-GPU replica (then ``gpu`` alone).
    """

    gpu: GpuId
    until: float
    gpus: tuple[GpuId, ...] = ()


@dataclass(frozen=True, slots=True)
class SleepReplica:
    """PROTECT -> SLEEP: the replica stays loaded, and the GPU may be lent.

    Attributes:
        gpu: The replica's (lead) GPU.
        gpus: Every GPU of the replica when it spans several
            (``gpus_per_replica`` > 1), ``gpu`` (its lead) first, all on one node;
            empty for a one-GPU replica (then ``gpu`` alone).
    """

    gpu: GpuId
    gpus: tuple[GpuId, ...] = ()


@dataclass(frozen=True, slots=True)
class EvictReplica:
    """A SLEEP replica is unloaded (-> FREE), for another service or for training; a
    replica of several GPUs goes as a whole (never one of its GPUs alone).

    Attributes:
        gpu: The replica's (lead) GPU.
        gpus: Every GPU of the replica when it spans several
            (``gpus_per_replica`` > 1), ``gpu`` (its lead) first, all on one node;
            empty for a one-GPU replica (then ``gpu`` alone).
    """

    gpu: GpuId
    gpus: tuple[GpuId, ...] = ()


def members(
    op: StartReplica | WarmReplica | ProtectReplica | SleepReplica | EvictReplica,
) -> tuple[GpuId, ...]:
    """Every GPU of the replica ``op`` names, lead first."""
    return op.gpus or (op.gpu,)


class WaitReason(enum.Enum):
    """Why a job or an inference task got no GPU this step.

    INSUFFICIENT_CAPACITY: the job's smallest size exceeds every GPU training may use
        now (the training pool, plus lendable inference GPUs).
    NOT_SELECTED: there was room, but the policy gave it to other jobs.
    NO_IDLE_GPU: no GPU is FREE, idle (SLEEP) or reclaimable for the task.
    BEHIND_SAME_SERVICE: an earlier queued task of the same service found no GPU in
        this pass, so this one was not tried.
    """

    INSUFFICIENT_CAPACITY = "insufficient_capacity"
    NOT_SELECTED = "not_selected"
    NO_IDLE_GPU = "no_idle_gpu"
    BEHIND_SAME_SERVICE = "behind_same_service"


@dataclass(frozen=True, slots=True)
class Unplaced:
    """A training job or inference task left waiting, and why.

    For an inference task the world queues it (in arrival order) and the loop tries it
    again whenever a GPU may have come free.
    """

    name: str
    reason: WaitReason
    inference: bool = False


GpuOperation: TypeAlias = (
    Bind
    | Lend
    | Release
    | Reclaim
    | StartReplica
    | WarmReplica
    | ProtectReplica
    | SleepReplica
    | EvictReplica
)
AnyOperation: TypeAlias = Start | Resize | Preempt | GpuOperation
