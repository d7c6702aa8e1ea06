"""Crash points on a real cluster (the rest of the matrix runs in-process, with fake
actors: ``test_crash_points.py``). The controller SIGKILLs itself at the point its
``controller.json`` names; ``deepboot up`` brings a new one back. At
``finish.recorded`` the job is FINISHED in the store while its real workers still
run; a new controller dying at ``recovery.planned`` changes nothing; the next one
kills the finished job's workers and runs nothing again. At ``reclaim.applied`` the
controller dies with a reclaim on its ledger only: the next one finds the GPU still
lent to the live worker, reclaims it again for the next request, and the job shrinks
and finishes. And the deadlines: lent workers that ignore everything are killed after
``leave_timeout`` once their GPUs are reclaimed, and the job goes on without them."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from deepboot.runtime.store.jobstore import LogKind  # noqa: E402
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
from tests.runtime.serving_helpers import gated_job, open_gate, post, service_file  # noqa: E402

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


def _lent_everywhere(state: Path, name: str) -> bool:
    t = job(state, name)
    return len(t["lent_gpus"]) == 2 and set(t["lent_gpus"]) <= set(t["workers"]) and t["step"] > 5


def _reclaims(state: Path) -> int:
    return sum(1 for e in events(state) if e.kind is LogKind.GPU and e.detail["op"] == "reclaim")


def test_a_controller_killed_as_it_reclaims_loses_no_job(tmp_path: Path) -> None:
    state = tmp_path / "state"
    flags = ("--training-nodes", "1", "--inference-nodes", "1", "--gpus-per-node", "2")
    with local_cluster(state, *flags, "--protect-factor", "0.05"):
        cli(state, "serve", str(service_file(tmp_path, "echo", delay=0.02, max_replicas=2)))
        assert post(state, "echo", "warm-up", {"x": [0.0]})[0] == 200
        gate = tmp_path / "gate"
        cli(state, "submit", str(gated_job(tmp_path, "trainer", gate, max_workers=4)))
        wait_for(
            "the job to borrow both inference GPUs", lambda: _lent_everywhere(state, "trainer")
        )

        stop(state)
        crash_at(state, "reclaim.applied")
        assert "restarted the controller" in cli(state, "up").stdout
        doomed = controller_pid(state)
        assert doomed is not None
        wait_for("the job to run on", lambda: _lent_everywhere(state, "trainer"))
        before = _reclaims(state)
        # This request needs a lent GPU back: the controller dies reclaiming it (the
        # client sees its connection close; a client retries).
        lost: dict[str, object] = {}
        t = threading.Thread(
            target=lambda: lost.update(r=_attempt(state, "dies-with-it")), daemon=True
        )
        t.start()
        wait_for("the controller to die at reclaim.applied", lambda: not alive(doomed), 600)
        t.join(300)
        workers = worker_pids(state, "trainer")
        live = [p for p in workers if alive(p)]
        assert 0 < len(live) <= 4, live

        crash_at(state, "")
        assert "restarted the controller" in cli(state, "up").stdout
        assert job(state, "trainer")["state"] == "running"
        assert _reclaims(state) == before, "the dead controller's reclaim was recorded"
        code, body = post(state, "echo", "after", {"x": [1.0]})
        assert code == 200, body
        assert _reclaims(state) > before
        assert len([p for p in worker_pids(state, "trainer") if alive(p)]) <= 4
        open_gate(state, "trainer", gate)
        wait_for("trainer to finish", lambda: job(state, "trainer")["state"] == "finished", 600)
        log = events(state, "trainer")
        assert [e.kind for e in log].count(LogKind.FINISHED) == 1
        assert [e.kind for e in log].count(LogKind.STARTED) == 1
        shrinks = [
            e
            for e in log
            if e.kind is LogKind.RESIZED and len(e.detail["to"]) < len(e.detail["from"])
        ]
        assert shrinks, "the job never gave the GPU back"


def _attempt(state: Path, rid: str) -> object:
    try:
        return post(state, "echo", rid, {"x": [2.0]})
    except OSError as e:  # the connection closed as the controller died
        return e


def test_a_leaver_that_ignores_its_stop_is_killed_after_the_deadline(tmp_path: Path) -> None:
    """Both lent workers stop answering; two requests reclaim their GPUs. The job
    re-forms on the training node without them (its survivors' collective with them
    times out first); each one told to leave is killed after ``leave_timeout``, and
    the replicas that waited for their GPUs answer."""
    state = tmp_path / "state"
    flags = ("--training-nodes", "1", "--inference-nodes", "1", "--gpus-per-node", "2")
    with local_cluster(state, *flags, "--protect-factor", "0.05"):
        stop(state)
        path = state / "controller.json"
        raw = json.loads(path.read_text())
        raw.update(leave_timeout=20.0, form_timeout=60.0)
        path.write_text(json.dumps(raw))
        assert "restarted the controller" in cli(state, "up").stdout
        cli(state, "serve", str(service_file(tmp_path, "echo", delay=3.0, max_replicas=2)))
        assert post(state, "echo", "warm-up", {"x": [0.0]})[0] == 200
        gate, hang = tmp_path / "gate", tmp_path / "hang"
        cli(state, "submit", str(gated_job(tmp_path, "trainer", gate, max_workers=4, hang=hang)))
        wait_for(
            "the job to borrow both inference GPUs", lambda: _lent_everywhere(state, "trainer")
        )
        lent = {
            g: p for g, p in _worker_pids_by_gpu(state, "trainer").items() if g.startswith("1.")
        }
        hang.write_text("1.")  # from now on the workers on node 1 ignore everything
        wait_for("both to hang", lambda: _log(state, "trainer").count("hanging:") >= 2, 120)

        answers: list[tuple[int, object]] = []
        threads = [
            threading.Thread(target=lambda i=i: answers.append(post(state, "echo", f"r{i}", {})))
            for i in range(2)
        ]
        for t in threads:
            t.start()
        wait_for(
            "the job to re-form on node 0",
            lambda: sorted(job(state, "trainer")["workers"]) == ["0.0", "0.1"],
        )
        wait_for("the stubborn workers killed", lambda: not any(alive(p) for p in lent.values()))
        hang.unlink()
        for t in threads:
            t.join(300)
        assert [code for code, _ in answers] == [200, 200], answers
        killed = _log(state, "controller").count("did not leave in 20 s; killed")
        gave_up = _log(state, "controller").count("did not form in 60 s")
        assert killed >= 1, "no leaver was killed at its deadline"
        assert killed + gave_up >= 1
        open_gate(state, "trainer", gate)
        wait_for("trainer to finish", lambda: job(state, "trainer")["state"] == "finished", 600)


def _log(state: Path, name: str) -> str:
    return (state / "logs" / f"{name}.log").read_text()


def _worker_pids_by_gpu(state: Path, name: str) -> dict[str, int]:
    """GPU -> pid of the newest worker there, from the job's log."""
    out = {}
    for line in _log(state, name).splitlines():
        if "] worker pid " in line:
            # "worker pid <pid> on GPU <gpu>, generation <n>"
            words = line.split("] worker pid ")[1].split()
            out[words[3].rstrip(",")] = int(words[0])
    return out
