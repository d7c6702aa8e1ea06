"""The job store: a real SQLite file in WAL mode, shared by processes."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from deepboot.core.errors import ConfigError
from deepboot.runtime.client.jobspec import JobSpec
from deepboot.runtime.store.jobstore import JobState, JobStore, LogKind
from deepboot.runtime.store.tables import SCHEMA_VERSION, StoreVersionError


def make_spec(name: str = "a") -> JobSpec:
    return JobSpec(name=name, entry="m:f", min_workers=1, max_workers=2)


def test_submit_then_read_back_in_wal_mode(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "db")
    store.submit(make_spec("a"), now=10.0)
    [row] = store.jobs()
    assert (row.name, row.state, row.submitted, row.spec) == (
        "a",
        JobState.SUBMITTED,
        10.0,
        make_spec("a"),
    )
    mode = sqlite3.connect(tmp_path / "db").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    [ev] = store.events()
    assert ev.kind is LogKind.SUBMITTED and ev.job == "a" and ev.detail == {"workers": [1, 2]}


def test_names_are_unique_and_cancel_needs_a_job(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "db")
    store.submit(make_spec("a"))
    with pytest.raises(ConfigError, match="exists already"):
        store.submit(make_spec("a"))
    with pytest.raises(ConfigError, match="no job named 'b'"):
        store.request_cancel("b")
    assert store.request_cancel("a").cancel


def test_event_log_is_append_only(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "db")
    store.append(LogKind.STARTED, "a", generation=1)
    db = sqlite3.connect(tmp_path / "db")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        db.execute("UPDATE events SET kind = 'x'")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        db.execute("DELETE FROM events")


def test_save_job_round_trips_every_column(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "db")
    store.submit(make_spec("a"), now=1.0)
    row = replace(
        store.job("a"),
        state=JobState.RUNNING,
        started=2.0,
        generation=3,
        workers=("0.1", "1.0"),
        local_bsz=16,
        accum=2,
        step=40,
        loss=0.5,
        restarts=2,
        steps_lost=1,
        attained=12.5,
        message="m",
        model='{"perf": null}',
    )
    with store.transaction() as db:
        store.save_job(db, row)
    assert store.job("a") == row


def test_a_write_in_another_process_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "db"
    store = JobStore(path)
    code = (
        "import sys; from deepboot.runtime.store.jobstore import JobStore; "
        "from deepboot.runtime.client.jobspec import JobSpec; "
        f"JobStore({str(path)!r}).submit(JobSpec(name='other', entry='m:f'))"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert [r.name for r in store.jobs()] == ["other"]


def test_status_reports_the_loop_s_decisions_from_the_store(tmp_path: Path) -> None:
    """``deepboot status --json``'s ``scheduler``: what the controller last wrote to
    the store (a real SQLite file), null before any round."""
    from deepboot.cli.runtime import status_document
    from deepboot.runtime.store.statedir import StateDir

    state = StateDir.at(tmp_path / "state").ensure()
    store = JobStore(state.db)
    store.submit(make_spec("a"))
    assert status_document(state)["scheduler"] == {
        "rounds": 0,
        "decision_ms_median": None,
        "decision_ms_max": None,
    }
    with store.transaction() as db:
        store.set_meta(db, "rounds", "7")
        store.set_meta(db, "decision_ms_median", repr(0.41234))
        store.set_meta(db, "decision_ms_max", repr(3.1))
    assert status_document(state)["scheduler"] == {
        "rounds": 7,
        "decision_ms_median": 0.412,
        "decision_ms_max": 3.1,
    }
    store.close()


# The store as b8fac06 (the last code before schema versions) created it, a job and a
# GPU in it: no user_version, no replica or back-off columns.
B8FAC06_SCHEMA = """
CREATE TABLE jobs (name TEXT PRIMARY KEY, spec TEXT NOT NULL, state TEXT NOT NULL,
    submitted REAL NOT NULL, started REAL, finished REAL,
    generation INTEGER NOT NULL DEFAULT 0, workers TEXT NOT NULL DEFAULT '[]',
    local_bsz INTEGER NOT NULL DEFAULT 0, accum INTEGER NOT NULL DEFAULT 1,
    step INTEGER NOT NULL DEFAULT 0, loss REAL, restarts INTEGER NOT NULL DEFAULT 0,
    steps_lost INTEGER NOT NULL DEFAULT 0, attained REAL NOT NULL DEFAULT 0,
    cancel INTEGER NOT NULL DEFAULT 0, message TEXT NOT NULL DEFAULT '',
    model TEXT NOT NULL DEFAULT '{}');
CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL,
    kind TEXT NOT NULL, job TEXT NOT NULL, detail TEXT NOT NULL);
CREATE TABLE gpus (gpu TEXT PRIMARY KEY, node INTEGER NOT NULL, idx INTEGER NOT NULL,
    pool TEXT NOT NULL, state TEXT NOT NULL, holder TEXT NOT NULL DEFAULT '');
CREATE TABLE services (name TEXT PRIMARY KEY, spec TEXT NOT NULL,
    registered REAL NOT NULL, cold_start REAL);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO gpus VALUES ('0.0', 0, 0, 'training', 'training', 'old-job');
"""


def test_a_store_written_before_schema_versions_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "deepboot.db"
    db = sqlite3.connect(path)
    db.executescript(B8FAC06_SCHEMA)
    spec = make_spec("old-job")
    db.execute(
        "INSERT INTO jobs (name, spec, state, submitted, workers) VALUES (?, ?, ?, ?, ?)",
        ("old-job", spec.to_json(), "running", 1.0, '["0.0"]'),
    )
    db.commit()
    db.close()
    store = JobStore(path)
    [row] = store.jobs()
    assert row.name == "old-job" and row.spec == spec and row.workers == ("0.0",)
    [gpu] = store.gpus()
    assert gpu.holder == "old-job" and gpu.replica == "" and gpu.protect_until is None
    store.close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.close()
    JobStore(path).close()  # opening a current store again changes nothing
    # Version 1's trigger refused every delete; version 2's lets retention prune.
    db = sqlite3.connect(path)
    triggers = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='trigger'")}
    db.close()
    assert "events_append_only_d" not in triggers and "events_retention_only" in triggers


def test_retention_drops_the_oldest_entries_and_nothing_else(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "deepboot.db")
    with store.transaction() as db:
        for i in range(10):
            store.log(db, LogKind.SUBMITTED, f"j{i}")
    with store.transaction() as db:
        assert store.prune_events(db, keep=4) == 6
        assert store.prune_events(db, keep=4) == 0
    assert [e.job for e in store.events()] == ["j6", "j7", "j8", "j9"]
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        store._db.execute("DELETE FROM events WHERE seq = 8")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        store._db.execute("UPDATE events SET job = 'x' WHERE seq = 9")
    with store.transaction() as db:
        store.log(db, LogKind.SUBMITTED, "j10")
        assert store.prune_events(db, keep=4) == 1
    assert [e.seq for e in store.events()] == [8, 9, 10, 11]
    store.close()


def test_a_store_a_newer_deepboot_wrote_is_refused_in_one_line(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    db = sqlite3.connect(state / "deepboot.db")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreVersionError, match="written by a newer deepboot"):
        JobStore(state / "deepboot.db")
    out = subprocess.run(
        [sys.executable, "-m", "deepboot.cli.main", "status", "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    [line] = out.stderr.strip().splitlines()
    assert f"deepboot.db: written by a newer deepboot (store schema {SCHEMA_VERSION + 1}" in line
