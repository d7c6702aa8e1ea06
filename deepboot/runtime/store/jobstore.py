"""The runtime's durable job store: SQLite in WAL mode, in the state directory.

:class:`JobStore` reads and writes its tables (``jobs``, ``gpus``, ``services``, the
append-only ``events`` log, and ``meta``), whose SQL, columns and writers
:mod:`deepboot.runtime.store.tables` describes; their rows come back as this module's
types (:class:`JobRow`, :class:`GpuRow`, :class:`ServiceRow`, :class:`EventRow`; the
event log's kinds are :class:`LogKind`).

Several processes share the file (controller, CLI); WAL lets readers run beside the
one writer, and every write is one transaction, so a SIGKILL loses nothing committed.
"""

from __future__ import annotations

import enum
import json
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from deepboot.core.errors import ConfigError
from deepboot.core.service import ServiceSpec
from deepboot.runtime.client.jobspec import JobSpec
from deepboot.runtime.store.tables import ensure_schema


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


_JOB_COLUMNS = (
    "name", "spec", "state", "submitted", "started", "finished", "generation", "workers",
    "local_bsz", "accum", "step", "loss", "restarts", "steps_lost", "attained", "cancel",
    "message", "model",
)  # fmt: skip


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


class JobStore:
    """A connection to the store (one per process; not shared across threads)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        try:
            ensure_schema(self._db, str(self.path))
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic write (BEGIN IMMEDIATE ... COMMIT)."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # -- jobs ----------------------------------------------------------------------------

    def submit(self, spec: JobSpec, now: float | None = None) -> None:
        """Insert a new job in state ``submitted``.

        Raises:
            ConfigError: a job of that name exists (names are unique forever).
        """
        now = time.time() if now is None else now
        try:
            with self.transaction() as db:
                db.execute(
                    "INSERT INTO jobs (name, spec, state, submitted) VALUES (?, ?, ?, ?)",
                    (spec.name, spec.to_json(), JobState.SUBMITTED.value, now),
                )
                self._append(
                    db,
                    now,
                    LogKind.SUBMITTED,
                    spec.name,
                    {"workers": [spec.min_workers, spec.max_workers]},
                )
        except sqlite3.IntegrityError:
            raise ConfigError(f"a job named {spec.name!r} exists already") from None

    def request_cancel(self, name: str) -> JobRow:
        """Ask the controller to cancel ``name``.

        Raises:
            ConfigError: no such job.
        """
        with self.transaction() as db:
            cur = db.execute("UPDATE jobs SET cancel = 1 WHERE name = ?", (name,))
            if cur.rowcount == 0:
                raise ConfigError(f"no job named {name!r}")
        return self.job(name)

    def job(self, name: str) -> JobRow:
        row = self._db.execute(
            f"SELECT {', '.join(_JOB_COLUMNS)} FROM jobs WHERE name = ?", (name,)
        ).fetchone()
        if row is None:
            raise ConfigError(f"no job named {name!r}")
        return _job_row(row)

    def jobs(self) -> list[JobRow]:
        rows = self._db.execute(
            f"SELECT {', '.join(_JOB_COLUMNS)} FROM jobs ORDER BY submitted, name"
        ).fetchall()
        return [_job_row(r) for r in rows]

    def save_job(self, db: sqlite3.Connection, row: JobRow) -> None:
        """Write every column of ``row`` but ``cancel`` (inside a transaction)."""
        db.execute(
            "UPDATE jobs SET state=?, started=?, finished=?, generation=?, workers=?, "
            "local_bsz=?, accum=?, step=?, loss=?, restarts=?, steps_lost=?, attained=?, "
            "message=?, model=? WHERE name=?",
            (
                row.state.value,
                row.started,
                row.finished,
                row.generation,
                json.dumps(list(row.workers)),
                row.local_bsz,
                row.accum,
                row.step,
                row.loss,
                row.restarts,
                row.steps_lost,
                row.attained,
                row.message,
                row.model,
                row.name,
            ),
        )

    # -- events --------------------------------------------------------------------------

    def append(self, kind: LogKind, job: str = "", now: float | None = None, **detail: Any) -> None:
        with self.transaction() as db:
            self._append(db, time.time() if now is None else now, kind, job, detail)

    @staticmethod
    def _append(
        db: sqlite3.Connection, now: float, kind: LogKind, job: str, detail: dict[str, Any]
    ) -> None:
        db.execute(
            "INSERT INTO events (time, kind, job, detail) VALUES (?, ?, ?, ?)",
            (now, kind.value, job, json.dumps(detail, sort_keys=True)),
        )

    def log(self, db: sqlite3.Connection, kind: LogKind, job: str = "", **detail: Any) -> None:
        """Append inside an open transaction (with the state change it records)."""
        self._append(db, time.time(), kind, job, detail)

    def prune_events(self, db: sqlite3.Connection, keep: int) -> int:
        """Drop the oldest entries of the event log beyond the newest ``keep``
        (inside an open transaction); returns how many. The bound is recorded first:
        the log's trigger refuses to delete anything newer."""
        hi = db.execute("SELECT MAX(seq) FROM events").fetchone()[0] or 0
        cutoff = hi - keep
        done = int(self.meta("events_pruned_through", "0"))
        if cutoff <= done:
            return 0
        self.set_meta(db, "events_pruned_through", str(cutoff))
        return db.execute("DELETE FROM events WHERE seq <= ?", (cutoff,)).rowcount

    def events(
        self, job: str | None = None, after: int = 0, since: float | None = None
    ) -> list[EventRow]:
        """The log's entries after ``seq`` ``after`` (of ``job``; logged at Unix time
        ``since`` or later), in ``seq`` order."""
        q = "SELECT seq, time, kind, job, detail FROM events WHERE seq > ?"
        args: list[Any] = [after]
        if job is not None:
            q += " AND job = ?"
            args.append(job)
        if since is not None:
            q += " AND time >= ?"
            args.append(since)
        rows = self._db.execute(q + " ORDER BY seq", args).fetchall()
        return [EventRow(s, t, LogKind(k), j, json.loads(d)) for s, t, k, j, d in rows]

    # -- gpus and meta -------------------------------------------------------------------

    def save_gpus(self, db: sqlite3.Connection, rows: Sequence[GpuRow]) -> None:
        db.execute("DELETE FROM gpus")
        db.executemany(
            "INSERT INTO gpus (gpu, node, idx, pool, state, holder, service, replica, hits, "
            "protect_until) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [tuple(r) for r in rows],
        )

    def gpus(self) -> list[GpuRow]:
        return [
            GpuRow(*r)
            for r in self._db.execute(
                "SELECT gpu, node, idx, pool, state, holder, service, replica, hits, "
                "protect_until FROM gpus ORDER BY node, idx"
            ).fetchall()
        ]

    # -- services ------------------------------------------------------------------------

    def register_service(self, spec: ServiceSpec, now: float | None = None) -> bool:
        """Register ``spec``; False when the same spec is registered already.

        Raises:
            ConfigError: another service of that name is registered (names are unique).
        """
        now = time.time() if now is None else now
        text = json.dumps(spec.to_json(), sort_keys=True)
        with self.transaction() as db:
            row = db.execute("SELECT spec FROM services WHERE name = ?", (spec.name,)).fetchone()
            if row is not None:
                # Compared as specs: a row written before a field existed holds its default.
                if ServiceSpec.from_json(json.loads(row[0])) == spec:
                    return False
                raise ConfigError(f"a different service named {spec.name!r} is registered already")
            db.execute(
                "INSERT INTO services (name, spec, registered) VALUES (?, ?, ?)",
                (spec.name, text, now),
            )
            self._append(
                db,
                now,
                LogKind.SERVICE_REGISTERED,
                "",
                {
                    "service": spec.name,
                    "model": spec.model,
                    "concurrency": spec.concurrency,
                    "max_replicas": spec.max_replicas,
                },
            )
        return True

    def services(self) -> list[ServiceRow]:
        rows = self._db.execute(
            "SELECT name, spec, registered, cold_start, load_failures, backoff_until "
            "FROM services ORDER BY registered, name"
        ).fetchall()
        return [
            ServiceRow(ServiceSpec.from_json(json.loads(s)), t, c, f, b)
            for _, s, t, c, f, b in rows
        ]

    def set_backoff(
        self, db: sqlite3.Connection, service: str, failures: int, until: float | None
    ) -> None:
        """Record ``service``'s crash-loop back-off (``failures`` replicas died loading
        in a row; none starts before Unix time ``until``; 0 and None: none)."""
        db.execute(
            "UPDATE services SET load_failures = ?, backoff_until = ? WHERE name = ?",
            (failures, until, service),
        )

    def set_cold_start(self, db: sqlite3.Connection, service: str, seconds: float) -> None:
        """Record the first measured cold start of ``service`` (later ones are logged)."""
        db.execute(
            "UPDATE services SET cold_start = ? WHERE name = ? AND cold_start IS NULL",
            (seconds, service),
        )

    def set_meta(self, db: sqlite3.Connection, key: str, value: str) -> None:
        db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def meta(self, key: str, default: str = "") -> str:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return str(row[0]) if row else default


def _job_row(r: Sequence[Any]) -> JobRow:
    d = dict(zip(_JOB_COLUMNS, r, strict=True))
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
