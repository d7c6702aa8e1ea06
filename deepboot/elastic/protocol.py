"""What the controller and an elastic worker tell each other (plain, picklable data).

A job's workers form one *generation* at a time: a fixed membership, in rank order,
that re-forms its ``torch.distributed`` process group in a fresh rendezvous (a file
store per generation). The controller starts a new generation for every resize:

* AFE (keep-alive) resize: the survivors keep their process, model and optimizer;
  they meet the joiners in the new rendezvous at a step boundary, and rank 0 (always
  a survivor) broadcasts the training state to everyone.
* restart resize: the old generation checkpoints (``stop=True``) and leaves; the new
  one starts in fresh processes and restores the checkpoint.
* failure: the survivors of a generation whose collective failed re-form without
  the dead worker; rank 0's state (the last consistent step) wins.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class Restore(enum.Enum):
    """Where the first state of a generation's rank 0 comes from."""

    MEMORY = "memory"  # rank 0's own (a survivor's, or a fresh job's initial state)
    CHECKPOINT = "checkpoint"  # the job's checkpoint file (restart resize, recovery)


def read_checkpoint(path: str) -> tuple[int, bytes]:
    """(the generation that wrote the job's checkpoint file at ``path``, its payload);
    (-1, b"") when there is none. The file is that generation's number (8 bytes,
    little-endian), then the payload; it is replaced atomically, never written in
    place, so a reader sees a whole one."""
    try:
        with open(path, "rb") as f:
            return int.from_bytes(f.read(8), "little"), f.read()
    except FileNotFoundError:
        return -1, b""


def checkpoint_generation(path: str) -> int:
    """The generation that wrote the checkpoint at ``path`` (-1: none), reading only
    its header."""
    try:
        with open(path, "rb") as f:
            return int.from_bytes(f.read(8), "little")
    except FileNotFoundError:
        return -1


class WorkerStatus(enum.Enum):
    """What one worker is doing, as it reports it."""

    STARTING = "starting"  # the user's function has not registered its model yet
    JOINING = "joining"  # forming a generation (rendezvous, state broadcast)
    RUNNING = "running"  # training in a formed generation
    WAITING = "waiting"  # its generation broke (a peer died); waits for the next
    DEPARTED = "departed"  # left at a resize (not a member, or a restart's stop)
    DONE = "done"  # the user's function returned
    FAILED = "failed"  # the user's function raised


@dataclass(frozen=True, slots=True)
class Generation:
    """One membership of a job's workers.

    Attributes:
        number: Increases by one per generation of the job (1 = the first).
        members: Worker ids (GPU ids "node.index") in rank order; survivors first.
        store_path: The file store of this generation's rendezvous (fresh per
            generation: torch's elastic scale-up on a reused rendezvous hangs).
        local_bsz: Per-GPU micro-batch, chosen by the controller's goodput model.
        accum_steps: Micro-batches per optimizer step.
        num_nodes: Distinct nodes of the members (for throughput reports).
        restore: Where rank 0's state comes from.
        checkpoint_path: The job's checkpoint file.
        after_generation: With ``Restore.CHECKPOINT``: wait until the checkpoint was
            written by this generation (the one that stopped) or a later one.
        stop: The members checkpoint (rank 0) and leave at the next step boundary;
            ``members`` is then the generation being stopped.
    """

    number: int
    members: tuple[str, ...]
    store_path: str
    local_bsz: int
    accum_steps: int
    num_nodes: int
    restore: Restore = Restore.MEMORY
    checkpoint_path: str = ""
    after_generation: int = 0
    stop: bool = False


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """What a worker needs to run its job's training function.

    Attributes:
        job: The job's name.
        entry: The training function ("path/file.py:function" or "module:function").
        args: The job file's ``[args]`` table, as ``ctx.args``.
        log_path: The job's log file (the worker's stdout and stderr go there).
        collective_timeout: Seconds before a hung collective or rendezvous fails.
        checkpoint_every: Rank 0 checkpoints every this many steps (0 = only at stops).
        command: A command job's argv (placeholders already filled; empty for an
            ``entry`` job): the worker runs it as a process with torchrun's
            environment (:mod:`deepboot.elastic.command`) instead of calling ``entry``.
        workdir: The command's working directory (the job file's directory).
        env: Variables a command's process gets beside torchrun's (its checkpoint
            directory, the run id, the restart counts).
        gpu_reserved_gb: GPU memory, GB, that a sleeping inference server still holds
            on this worker's GPU (its service's ``sleep_gpu_gb``; 0 for most): the
            worker may not use it. It is ``DEEPBOOT_GPU_RESERVED_GB`` in the worker's
            environment (a command job's process's too), ``ctx.gpu_reserved_gb``, and
            on a CUDA device :class:`~deepboot.elastic.context.ElasticContext` caps
            torch's allocator below it (``set_per_process_memory_fraction``).
        stop_grace_s: Seconds a command's process may take to exit after SIGTERM
            before it is killed (SIGKILL).
    """

    job: str
    entry: str
    args: dict[str, Any]
    log_path: str
    collective_timeout: float = 60.0
    checkpoint_every: int = 0
    command: tuple[str, ...] = ()
    workdir: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    stop_grace_s: float = 10.0
    gpu_reserved_gb: float = 0.0


@dataclass(frozen=True, slots=True)
class Measurement:
    """One optimizer step's timing (seconds), for the online throughput fit."""

    num_nodes: int
    num_replicas: int
    local_bsz: int
    compute_time: float  # forward+backward of one micro-batch
    step_time: float  # one micro-batch's compute plus the gradient synchronization


@dataclass(frozen=True, slots=True)
class WorkerReport:
    """A worker's answer to the controller's poll.

    Attributes:
        worker: Its id ("node.index").
        status: What it is doing.
        generation: The generation it last formed (0 = none yet).
        step: Optimizer steps the job has taken, as this worker knows.
        loss: The last step's loss, averaged over all ranks (nan before a step).
        measurements: Steps timed since the previous report (rank 0 only).
        grad_sqr: Smoothed squared norm of the true gradient (nan until known).
        grad_var: Smoothed gradient variance (nan until known).
        digests: generation -> (digest of the parameters before that generation
            formed, digest after): the test of an exact resize.
        restored_step: Step at which the last generation resumed.
        broken: The newest generation that broke under this worker (a collective
            failed, or not every member arrived to form it); 0 if none.
        error: The traceback of a FAILED worker (a command's: its exit status and
            the last lines of its stderr).
        progress_at: When a command worker's process first showed progress in this
            generation (Unix seconds; nan until seen; see
            :mod:`deepboot.elastic.command`): the end of a restart, whose cost the
            controller measures from the stop to it.
    """

    worker: str
    status: WorkerStatus
    generation: int
    step: int
    loss: float
    measurements: tuple[Measurement, ...] = ()
    grad_sqr: float = float("nan")
    grad_var: float = float("nan")
    digests: dict[int, tuple[str, str]] = field(default_factory=dict)
    restored_step: int = 0
    broken: int = 0
    error: str = ""
    progress_at: float = float("nan")
