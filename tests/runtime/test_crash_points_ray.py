"""Crash points on a real cluster (the rest of the matrix runs in-process, with fake
actors: ``test_crash_points.py``). The controller SIGKILLs itself at the point its
``controller.json`` names; ``deepboot up`` brings a new one back. At
``finish.recorded`` the job is FINISHED in the store while its real workers still
run; a new controller dying at ``recovery.planned`` changes nothing; the next one
kills the finished job's workers and runs nothing again."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from deepboot.runtime.store import LogKind  # noqa: E402
from tests.runtime.cluster_helpers import (  # noqa: E402
    alive,
    cli,
    controller_pid,
    events,
    job,
    local_cluster,
    wait_for,
    worker_pids,
    write_job,
)

pytestmark = pytest.mark.runtime


def crash_at(state: Path, point: str) -> None:
    """Name the point the next controller dies at (in its settings file)."""
    path = state / "controller.json"
    raw = json.loads(path.read_text())
    raw["crash_at"] = point
    path.write_text(json.dumps(raw))


def stop(state: Path) -> None:
    pid = controller_pid(state)
    assert pid is not None
    os.kill(pid, signal.SIGTERM)
    wait_for("the controller to stop", lambda: not alive(pid), 60)


def test_a_controller_killed_as_a_job_finishes_never_runs_it_again(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with local_cluster(state, "--training-nodes", "1", "--gpus-per-node", "2"):
        stop(state)
        crash_at(state, "finish.recorded")
        assert "restarted the controller" in cli(state, "up").stdout
        doomed = controller_pid(state)
        assert doomed is not None
        quick = write_job(tmp_path, "quick", threshold=0.01, delay=0.02, max_workers=2)
        cli(state, "submit", str(quick))
        wait_for("the controller to die at finish.recorded", lambda: not alive(doomed), 600)
        workers = worker_pids(state, "quick")
        assert job(state, "quick")["state"] == "finished"  # durable before the kill
        assert any(alive(p) for p in workers), "the workers died with the controller"

        crash_at(state, "recovery.planned")
        failed = cli(state, "up", check=False)  # it dies recovering, before it serves HTTP
        assert failed.returncode != 0
        second = int((state / "controller.pid").read_text())  # it wrote it, then died
        assert second != doomed and not alive(second)
        assert any(alive(p) for p in workers)  # it acted on nothing

        crash_at(state, "")
        assert "restarted the controller" in cli(state, "up").stdout
        wait_for("the finished job's workers killed", lambda: not any(alive(p) for p in workers))
        log = events(state, "quick")
        assert [e.kind for e in log].count(LogKind.FINISHED) == 1
        assert [e.kind for e in log].count(LogKind.STARTED) == 1
        assert worker_pids(state, "quick") == workers, "a worker started again"
        assert job(state, "quick")["state"] == "finished"
