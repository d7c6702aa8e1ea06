"""`deepboot up --address`: attach to a Ray cluster someone else started, run a job on
it, and `deepboot down` leaves that cluster running."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from deepboot.runtime.cluster.processes import kill_pids  # noqa: E402
from deepboot.runtime.cluster.raycluster import ClusterRecord, cluster_pids  # noqa: E402
from tests.runtime.cluster_helpers import alive, cli, job, wait_for, write_job  # noqa: E402

pytestmark = pytest.mark.runtime


def test_attach_runs_a_job_and_down_leaves_the_cluster(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(secrets.token_hex(32))
    os.chmod(token, 0o600)
    temp_dir = f"/tmp/deepboot-attach-{secrets.token_hex(4)}"
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    resources = {
        "deepboot_node_0": 1000,
        "deepboot_pool_training": 1000,
        "deepboot_gpu_0_0": 1,
        "deepboot_gpu_0_1": 1,
    }
    # The user's own cluster: a plain `ray start`, as docs/runtime.md shows.
    started = subprocess.run(
        [
            sys.executable,
            "-m",
            "ray.scripts.scripts",
            "start",
            "--head",
            "--port=0",
            f"--temp-dir={temp_dir}",
            "--include-dashboard=false",
            "--num-cpus=3",
            f"--resources={json.dumps(resources)}",
            "--disable-usage-stats",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert started.returncode == 0, started.stderr
    found = re.search(r"--address='([^']+)'", started.stdout + started.stderr)
    assert found, started.stdout
    address = found.group(1)
    theirs = ClusterRecord("local", address, temp_dir, (), "")
    state = tmp_path / "state"
    try:
        out = cli(
            state,
            "up",
            "--address",
            address,
            "--ray-token",
            str(token),
            "--interval",
            "2",
            "--poll",
            "0.3",
            "--collective-timeout",
            "15",
            "--http-port",
            "0",
        ).stdout
        assert "attached" in out and "2 GPUs" in out
        cli(state, "submit", str(write_job(tmp_path, "attached-a", 0.05, 0.02, max_workers=2)))
        wait_for("attached-a to finish", lambda: job(state, "attached-a")["state"] == "finished")
        # Their cluster's daemons, not its worker processes: deepboot's actors run in
        # workers that 'down' kills, and Ray itself reaps idle workers when it likes.
        daemons = _daemons(theirs)
        assert {"gcs_server", "raylet"} <= set(daemons.values()), daemons
        assert "killed deepboot's workers" in cli(state, "down").stdout
        # Their Ray cluster is still up: 'down' stopped only what 'up' started.
        assert all(alive(p) for p in daemons), {p: n for p, n in daemons.items() if not alive(p)}
        answered = subprocess.run(
            [sys.executable, "-m", "ray.scripts.scripts", "status", f"--address={address}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert answered.returncode == 0, answered.stderr
    finally:
        cli(state, "down", check=False)
        kill_pids(cluster_pids(theirs))
        shutil.rmtree(temp_dir, ignore_errors=True)


def _daemons(record: ClusterRecord) -> dict[int, str]:
    """pid -> name of the cluster's own daemons (GCS, raylet), read from /proc."""
    found = {}
    for pid in cluster_pids(record):
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError:
            continue
        name = Path(argv0).name
        if name in ("gcs_server", "raylet"):
            found[pid] = name
    return found
