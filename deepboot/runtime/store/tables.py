"""The job store's tables: their SQL, and the upgrade of a store that an earlier
version wrote (:func:`ensure_schema`); :class:`~deepboot.runtime.store.jobstore.JobStore`
reads and writes them.

The store carries its schema's version (SQLite's ``user_version``):
:data:`SCHEMA_VERSION` now; 0 in a store written before versions existed (code of
``b8fac06`` and earlier), which is migrated in place; a store of a later version
(a newer deepboot wrote it) is refused with one line, never read as if it were
this one's.

Four tables (and ``meta``, a key-value table):

``jobs``: one row per submitted job; the controller keeps it current (see
:class:`~deepboot.runtime.store.jobstore.JobRow` for the columns). ``deepboot submit`` inserts
rows in state ``submitted``; ``deepboot cancel`` sets ``cancel = 1``; only the
controller changes anything else.

``gpus``: the controller's view of every GPU (node, index, pool, state, holder; for
an inference replica its service, actor name, warm hits and protect end), rewritten
each loop iteration, for ``deepboot status`` and a restarted controller.

``services``: one row per registered inference service (``deepboot serve``): its
spec (JSON), the cold start measured on its first replica, and its crash-loop
back-off (replicas that died while loading in a row, and until when no new replica
starts for it).

``events``: the event log, append-only: never updated, and never deleted but by
its retention bound (:meth:`~deepboot.runtime.store.jobstore.JobStore.prune_events` drops the
oldest entries, up to the seq it records in ``meta`` first; a trigger refuses any
other delete). Columns:

=========  ======================================================================
seq        INTEGER, increasing from 1 (the order of the log)
time       REAL, Unix time (s)
kind       TEXT, one of :class:`~deepboot.runtime.store.jobstore.LogKind`'s values
job        TEXT, the job it is about ("" for cluster events)
detail     TEXT, a JSON object (keys per kind: :class:`~.jobstore.LogKind`)
=========  ======================================================================
"""

from __future__ import annotations

import sqlite3

from deepboot.core.errors import ConfigError

SCHEMA_VERSION = 2
"""The store's schema version (``PRAGMA user_version``). 1: the gpus table's replica
columns and the services table's back-off columns (a store of version 0 may lack
them: they are added). 2: the event log's retention (the trigger that refused every
delete gives way to one that lets retention drop the oldest entries)."""


class StoreVersionError(ConfigError):
    """A store a newer deepboot wrote."""


_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    name TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    submitted REAL NOT NULL,
    started REAL,
    finished REAL,
    generation INTEGER NOT NULL DEFAULT 0,
    workers TEXT NOT NULL DEFAULT '[]',
    local_bsz INTEGER NOT NULL DEFAULT 0,
    accum INTEGER NOT NULL DEFAULT 1,
    step INTEGER NOT NULL DEFAULT 0,
    loss REAL,
    restarts INTEGER NOT NULL DEFAULT 0,
    steps_lost INTEGER NOT NULL DEFAULT 0,
    attained REAL NOT NULL DEFAULT 0,
    cancel INTEGER NOT NULL DEFAULT 0,
    message TEXT NOT NULL DEFAULT '',
    model TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    job TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS gpus (
    gpu TEXT PRIMARY KEY,
    node INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    pool TEXT NOT NULL,
    state TEXT NOT NULL,
    holder TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS services (
    name TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    registered REAL NOT NULL,
    cold_start REAL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TRIGGER IF NOT EXISTS events_append_only_u BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'the event log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS events_retention_only BEFORE DELETE ON events
WHEN old.seq > COALESCE(
    (SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'events_pruned_through'), 0)
BEGIN SELECT RAISE(ABORT, 'the event log is append-only'); END;
"""

_GPU_REPLICA_COLUMNS = (
    ("service", "TEXT NOT NULL DEFAULT ''"),
    ("replica", "TEXT NOT NULL DEFAULT ''"),
    ("hits", "INTEGER NOT NULL DEFAULT 0"),
    ("protect_until", "REAL"),
)

_SERVICE_BACKOFF_COLUMNS = (
    ("load_failures", "INTEGER NOT NULL DEFAULT 0"),
    ("backoff_until", "REAL"),
)


def schema_version(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def ensure_schema(db: sqlite3.Connection, where: str) -> None:
    """Create the tables and triggers ``db`` lacks, and migrate a store an earlier
    version wrote to :data:`SCHEMA_VERSION` (in one transaction: two processes that
    open an old store at once migrate it once).

    Args:
        db: An autocommit connection (``isolation_level=None``).
        where: The store's path, for the error.

    Raises:
        StoreVersionError: a newer deepboot wrote the store.
    """
    _refuse_newer(db, where)
    db.executescript(_SCHEMA)  # idempotent; commits
    if schema_version(db) == SCHEMA_VERSION:
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        _refuse_newer(db, where)
        have = {r[1] for r in db.execute("PRAGMA table_info(gpus)")}
        for column, decl in _GPU_REPLICA_COLUMNS:
            if column not in have:  # a store written before services existed
                db.execute(f"ALTER TABLE gpus ADD COLUMN {column} {decl}")
        have = {r[1] for r in db.execute("PRAGMA table_info(services)")}
        for column, decl in _SERVICE_BACKOFF_COLUMNS:
            if column not in have:  # a store written before back-offs existed
                db.execute(f"ALTER TABLE services ADD COLUMN {column} {decl}")
        db.execute("DROP TRIGGER IF EXISTS events_append_only_d")  # version 2
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _refuse_newer(db: sqlite3.Connection, where: str) -> None:
    version = schema_version(db)
    if version > SCHEMA_VERSION:
        raise StoreVersionError(
            f"{where}: written by a newer deepboot (store schema {version}; this one "
            f"reads up to {SCHEMA_VERSION}): run that version, or use another --state-dir"
        )
