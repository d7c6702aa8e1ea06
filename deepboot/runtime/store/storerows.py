"""The job store's rows as values: a job (:class:`JobRow`, where it stands:
:class:`JobState`), a GPU (:class:`GpuRow`), a service (:class:`ServiceRow`) and an
entry of the event log (:class:`EventRow`, whose kinds and details
:class:`LogKind` lists).

:class:`~deepboot.runtime.store.jobstore.JobStore` reads and writes them (the tables
they come from: :mod:`deepboot.runtime.store.tables`). A ``jobs`` row is selected as
:data:`JOB_COLUMNS` and made a :class:`JobRow` by :func:`job_row`. Values only: no
SQL runs here.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from deepboot.core.service import ServiceSpec
from deepboot.runtime.client.jobspec import JobSpec


class JobState(enum.Enum):
    """Where a job stands."""

    SUBMITTED = "submitted"  # in the store; the controller has not seen it yet
    QUEUED = "queued"  # known to the scheduler, holds no GPU
    RUNNING = "running"  # holds GPUs (possibly mid-resize)
    FINISHED = "finished"  # its function returned on every worker
    FAILED = "failed"  # its function raised
    CANCELLED = "cancelled"  # by 'deepboot cancel'

    @property
    def ended(self) -> bool:
        return self in (JobState.FINISHED, JobState.FAILED, JobState.CANCELLED)


class LogKind(enum.Enum):
    """Kinds of event-log entries, and the keys of their ``detail``.

    controller_started: {policy, afe, recovered: [job names]}
    submitted: {workers: [min, max]}
    started: {generation, workers: [gpu ids], local_bsz, accum}
    resized: {generation, how: afe|restart|failure, from: [ids], to: [ids], local_bsz,
              accum, digests: {gpu id: [before, after]}, steps_lost, seconds}
    worker_failed: {worker, generation, step}
    preempted: {generation, workers: [ids]}
    gpu: {gpu, op: bind|lend|release|reclaim, job, proactive (reclaim: true when the
              SLO guard took it back ahead of demand, false when a waiting request
              did)}
    finished: {step, loss, seconds}
    failed: {error}
    cancelled: {}
    reconciled: {kept: [actor names], killed: [actor names]}
    service_registered: {service, model, concurrency, max_replicas}
    decision_rejected: {event, error}: a step of the control loop raised; the
              controller skipped the event and kept running
    replica: {gpu, service, op: start|ready|sleep|evict|died, cold (start: always
              true, a new replica; warm reuses and PROTECT are not logged, they
              happen at every request of a lull, and sleep is logged once per
              replica, its first), prewarm (start: true when the SLO guard started
              it ahead of demand), seconds, load_seconds and start
              (ready: cold, a full load, or host, restored from the node's model
              cache), cache (evict, with --host-cache-gb: exported|held|none|
              not-kept|failed), error, phase (load|serve) and backoff_s (died:
              seconds before the service's next replica may start; 0 unless it
              died loading)}
    node: {node, op: left|returned, gpus: [ids]}: a Ray node left the cluster (its
              GPUs DOWN, out of the ledger) or came back (FREE again)
    slo: {service, within, over}: the service's answers within and over its
              slo_wait_s since this controller started (as its Prometheus counters
              count them); written when they changed, at most once a minute per
              service, and at shutdown
    moved: {from, to}: a job's state changed (the controller's checked move, by
              its JOB_TRANSITIONS table) to a state that has no record of its own:
              queued (seen by the controller, preempted, every worker lost) or
              running (a generation offered); finished, failed and cancelled are
              their own records
    progressed: {generation, how: start|restart, seconds}: a command job's first
              progress after a start or a restart (its first stdout line or
              report() call); ``seconds`` from the decision (a restart: the stop)
              to it is the change's measured cost (the policy's restart cost for
              the job: their median)
    retrying: {failures, max_restarts, backoff_s, error}: a command job's rank
              failed; the group stops and starts again after ``backoff_s``
    """

    CONTROLLER_STARTED = "controller_started"
    SUBMITTED = "submitted"
    STARTED = "started"
    RESIZED = "resized"
    WORKER_FAILED = "worker_failed"
    PREEMPTED = "preempted"
    GPU = "gpu"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"
    RECONCILED = "reconciled"
    SERVICE_REGISTERED = "service_registered"
    REPLICA = "replica"
    DECISION_REJECTED = "decision_rejected"
    NODE = "node"
    SLO = "slo"
    MOVED = "moved"
    PROGRESSED = "progressed"
    RETRYING = "retrying"


JOB_COLUMNS = (
    "name", "spec", "state", "submitted", "started", "finished", "generation", "workers",
    "local_bsz", "accum", "step", "loss", "restarts", "steps_lost", "attained", "cancel",
    "message", "model",
)  # fmt: skip
"""The columns of ``jobs``, in the order :func:`job_row` reads them."""


@dataclass(frozen=True, slots=True)
class JobRow:
    """One row of ``jobs``.

    Attributes:
        name, spec, state: The job, its file's content, where it stands.
        submitted, started, finished: Unix times (None until they happen).
        generation: Its workers' current generation (0 before the first).
        workers: GPU ids "node.index" of its workers, in rank order.
        local_bsz, accum: Per-GPU micro-batch and accumulation steps.
        step, loss: Optimizer steps taken and the last mean loss.
        restarts: Resizes and recoveries so far.
        steps_lost: Steps redone after failures, in all.
        attained: GPU-seconds held so far.
        cancel: 'deepboot cancel' asked for it.
        message: Why it failed, or other news for the user.
        model: The controller's online goodput model (JSON: profile, fit, gradient).
    """

    name: str
    spec: JobSpec
    state: JobState
    submitted: float
    started: float | None = None
    finished: float | None = None
    generation: int = 0
    workers: tuple[str, ...] = ()
    local_bsz: int = 0
    accum: int = 1
    step: int = 0
    loss: float | None = None
    restarts: int = 0
    steps_lost: int = 0
    attained: float = 0.0
    cancel: bool = False
    message: str = ""
    model: str = "{}"


@dataclass(frozen=True, slots=True)
class EventRow:
    seq: int
    time: float
    kind: LogKind
    job: str
    detail: dict[str, Any]


class GpuRow(NamedTuple):
    """One row of ``gpus``."""

    gpu: str
    node: int
    idx: int
    pool: str
    state: str
    holder: str = ""
    service: str = ""
    replica: str = ""
    hits: int = 0
    protect_until: float | None = None


@dataclass(frozen=True, slots=True)
class ServiceRow:
    """One row of ``services``: the spec, when it was registered, its measured cold
    start (None until a replica has started), and its crash-loop back-off: replicas
    that died loading in a row, and the Unix time before which none starts (None:
    no back-off)."""

    spec: ServiceSpec
    registered: float
    cold_start: float | None
    load_failures: int = 0
    backoff_until: float | None = None


def job_row(r: Sequence[Any]) -> JobRow:
    """The :class:`JobRow` of a ``jobs`` row selected as :data:`JOB_COLUMNS`."""
    d = dict(zip(JOB_COLUMNS, r, strict=True))
    return JobRow(
        name=d["name"],
        spec=JobSpec.from_json(d["spec"]),
        state=JobState(d["state"]),
        submitted=d["submitted"],
        started=d["started"],
        finished=d["finished"],
        generation=d["generation"],
        workers=tuple(json.loads(d["workers"])),
        local_bsz=d["local_bsz"],
        accum=d["accum"],
        step=d["step"],
        loss=d["loss"],
        restarts=d["restarts"],
        steps_lost=d["steps_lost"],
        attained=d["attained"],
        cancel=bool(d["cancel"]),
        message=d["message"],
        model=d["model"],
    )
