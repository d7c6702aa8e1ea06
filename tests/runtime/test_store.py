"""The job store: a real SQLite file in WAL mode, shared by processes."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from deepboot.core.errors import ConfigError
from deepboot.runtime.jobspec import JobSpec
from deepboot.runtime.store import JobState, JobStore, LogKind


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
        "import sys; from deepboot.runtime.store import JobStore; "
        "from deepboot.runtime.jobspec import JobSpec; "
        f"JobStore({str(path)!r}).submit(JobSpec(name='other', entry='m:f'))"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert [r.name for r in store.jobs()] == ["other"]


def test_status_reports_the_loop_s_decisions_from_the_store(tmp_path: Path) -> None:
    """``deepboot status --json``'s ``scheduler``: what the controller last wrote to
    the store (a real SQLite file), null before any round."""
    from deepboot.cli.runtime import status_document
    from deepboot.runtime.statedir import StateDir

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
