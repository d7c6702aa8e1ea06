"""One controller per state directory on a real local cluster: two ``deepboot up`` at
once start one cluster and one controller; a controller started by hand while one
runs exits at once, naming it; and neither kills anything of the running one's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from deepboot.runtime.cluster.raycluster import ClusterRecord, cluster_pids  # noqa: E402
from deepboot.runtime.store.statedir import StateDir  # noqa: E402
from tests.runtime.cluster_helpers import (  # noqa: E402
    REPO,
    alive,
    cancel_leftover_jobs,
    cli,
    controller_pid,
    job,
    wait_for,
    worker_pids,
    write_job,
)

pytestmark = pytest.mark.runtime

UP = ["up", "--interval", "2", "--poll", "0.3", "--collective-timeout", "15"]
UP += ["--param=restart_delay=2", "--http-port", "0", "--gpus-per-node", "2"]


def _deepboot(state: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "deepboot.cli.main", *args, "--state-dir", str(state)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


def test_two_ups_at_once_and_a_controller_by_hand_leave_exactly_one(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first, second = _deepboot(state, *UP), _deepboot(state, *UP)
    outs = [(p.wait(300), *p.communicate()) for p in (first, second)]
    try:
        assert sorted(rc for rc, _, _ in outs) == [0, 2], outs
        pid = controller_pid(state)
        assert pid is not None and alive(pid)
        [(_, _, refused)] = [o for o in outs if o[0] != 0]
        assert f"already up in {state.resolve()} (controller pid {pid})" in refused, refused

        c = write_job(tmp_path, "steady", threshold=1e-9, delay=0.05)
        cli(state, "submit", str(c))
        wait_for("steady running", lambda: job(state, "steady")["step"] > 10)
        workers = {p for p in worker_pids(state, "steady") if alive(p)}

        by_hand = subprocess.run(
            [
                sys.executable,
                "-m",
                "deepboot.runtime.controller_process",
                "--state-dir",
                str(state),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
        assert by_hand.returncode == 3, by_hand.stderr
        assert f"a controller already runs for {state.resolve()} (pid {pid}" in by_hand.stderr
        again = cli(state, "up", check=False)
        assert again.returncode == 2 and f"controller pid {pid}" in again.stderr

        # Nothing of the running controller's was touched.
        assert controller_pid(state) == pid and alive(pid)
        assert {p for p in worker_pids(state, "steady") if alive(p)} == workers
        assert job(state, "steady")["state"] == "running"
        cancel_leftover_jobs(state)
    finally:
        record = ClusterRecord.load(StateDir.at(state))
        cli(state, "down", check=False)
        assert not [p for p in cluster_pids(record) if alive(p)]
