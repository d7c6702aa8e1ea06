"""The runtime's durable job store: SQLite in WAL mode, in the state directory.

:class:`JobStore` reads and writes its tables (``jobs``, ``gpus``, ``services``, the
append-only ``events`` log, and ``meta``), whose SQL, columns and writers
:mod:`deepboot.runtime.store.tables` describes; their rows come back as the types of
:mod:`deepboot.runtime.store.storerows` (:class:`JobRow`, :class:`GpuRow`,
:class:`ServiceRow`, :class:`EventRow`; the event log's kinds are :class:`LogKind`),
importable from here too.

Several processes share the file (controller, CLI); WAL lets readers run beside the
one writer, and every write is one transaction, so a SIGKILL loses nothing committed.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from deepboot.core.errors import ConfigError
from deepboot.core.service import ServiceSpec
from deepboot.runtime.client.jobspec import JobSpec
from deepboot.runtime.store.storerows import (
    JOB_COLUMNS,
    EventRow,
    GpuRow,
    JobRow,
    JobState,
    LogKind,
    ServiceRow,
    job_row,
)
from deepboot.runtime.store.tables import ensure_schema

__all__ = ["EventRow", "GpuRow", "JobRow", "JobState", "JobStore", "LogKind", "ServiceRow"]


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
            f"SELECT {', '.join(JOB_COLUMNS)} FROM jobs WHERE name = ?", (name,)
        ).fetchone()
        if row is None:
            raise ConfigError(f"no job named {name!r}")
        return job_row(row)

    def jobs(self) -> list[JobRow]:
        rows = self._db.execute(
            f"SELECT {', '.join(JOB_COLUMNS)} FROM jobs ORDER BY submitted, name"
        ).fetchall()
        return [job_row(r) for r in rows]

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
