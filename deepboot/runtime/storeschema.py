"""The job store's tables: their SQL, and the upgrade of a store that an earlier
version wrote (:func:`ensure_schema`); :class:`~deepboot.runtime.store.JobStore`
reads and writes them.

Four tables (and ``meta``, a key-value table):

``jobs``: one row per submitted job; the controller keeps it current (see
:class:`~deepboot.runtime.store.JobRow` for the columns). ``deepboot submit`` inserts
rows in state ``submitted``; ``deepboot cancel`` sets ``cancel = 1``; only the
controller changes anything else.

``gpus``: the controller's view of every GPU (node, index, pool, state, holder; for
an inference replica its service, actor name, warm hits and protect end), rewritten
each loop iteration, for ``deepboot status`` and a restarted controller.

``services``: one row per registered inference service (``deepboot serve``): its
spec (JSON), the cold start measured on its first replica, and its crash-loop
back-off (replicas that died while loading in a row, and until when no new replica
starts for it).

``events``: the append-only event log; never updated or deleted. Columns:

=========  ======================================================================
seq        INTEGER, increasing from 1 (the order of the log)
time       REAL, Unix time (s)
kind       TEXT, one of :class:`~deepboot.runtime.store.LogKind`'s values
job        TEXT, the job it is about ("" for cluster events)
detail     TEXT, a JSON object (keys per kind, see :class:`~deepboot.runtime.store.LogKind`)
=========  ======================================================================
"""

from __future__ import annotations

import sqlite3

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
CREATE TRIGGER IF NOT EXISTS events_append_only_d BEFORE DELETE ON events
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


def ensure_schema(db: sqlite3.Connection) -> None:
    """Create the tables and triggers ``db`` lacks, and add the columns that a store
    written by an earlier version lacks."""
    db.executescript(_SCHEMA)
    have = {r[1] for r in db.execute("PRAGMA table_info(gpus)")}
    for column, decl in _GPU_REPLICA_COLUMNS:
        if column not in have:  # a store written before services existed
            db.execute(f"ALTER TABLE gpus ADD COLUMN {column} {decl}")
    have = {r[1] for r in db.execute("PRAGMA table_info(services)")}
    for column, decl in _SERVICE_BACKOFF_COLUMNS:
        if column not in have:  # a store written before back-offs existed
            db.execute(f"ALTER TABLE services ADD COLUMN {column} {decl}")
