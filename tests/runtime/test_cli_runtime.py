"""The runtime's commands where no cluster is needed: their errors are one line."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from deepboot.cli.main import main


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("policy", ["optimus", "afs", "lyra"])
def test_up_refuses_oracle_policies_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], policy: str
) -> None:
    state = tmp_path / "state"
    code, _, err = _run(capsys, "up", "--policy", policy, "--state-dir", str(state))
    assert code == 2
    assert err.startswith(f"deepboot: error: policy '{policy}' needs each job's remaining work")
    assert "deepboot" in err and "pollux" in err  # it names the usable ones
    assert not (state / "cluster.json").exists()


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["up", "--policy", "nope"], "nope"),
        (["up", "--param", "restart_delay=x"], "restart_delay"),
        (["up", "--gpus-per-node", "0"], "--gpus-per-node must be a positive integer"),
        (["up", "--interval", "0"], "--interval must be a positive number"),
        (["up", "--keep-events", "0"], "--keep-events must be >= 1"),
        (["status"], "no deepboot state"),
        (["down"], "no cluster is up"),
        (["cancel", "x"], "no deepboot state"),
        (["up", "--cuda-devices", "0,1,2"], "--cuda-devices names 3 device(s)"),
        (["up", "--cuda-devices", "0,0,1,1"], "a node's GPUs must be distinct devices"),
        (["up", "--address", "127.0.0.1:1", "--cuda-devices", "0"], "an attached cluster"),
    ],
    ids=[
        "unknown-policy",
        "bad-param",
        "zero-gpus",
        "zero-interval",
        "no-events",
        "status",
        "down",
        "cancel",
        "cuda-devices-count",
        "cuda-devices-within-a-node",
        "cuda-devices-attached",
    ],  # fmt: skip
)
def test_runtime_command_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    code, _, err = _run(capsys, *argv, "--state-dir", str(tmp_path / "state"))
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("deepboot: error:")
    assert words in err


def test_submit_bad_job_file_names_the_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.toml"
    job.write_text('name = "a"\nentry = "m:f"\nmin_workers = 3\nmax_workers = 2\n')
    code, _, err = _run(capsys, "submit", str(job), "--state-dir", str(tmp_path / "s"))
    assert code == 2
    assert (
        err == f"deepboot: error: {job}: field 'max_workers': must be >= min_workers (3), got 2\n"
    )


def test_submit_status_cancel_without_a_cluster_use_the_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The store is enough for these: a job waits in it until a controller runs."""
    state = tmp_path / "s"
    state.mkdir()
    job = tmp_path / "job.toml"
    job.write_text('name = "a"\nentry = "m:f"\n')
    from deepboot.runtime.store.jobstore import JobStore

    JobStore(state / "deepboot.db").close()
    assert _run(capsys, "submit", str(job), "--state-dir", str(state))[0] == 0
    code, out, _ = _run(capsys, "status", "--json", "--state-dir", str(state))
    assert code == 0 and '"state": "submitted"' in out and '"up": false' in out
    code, out, _ = _run(capsys, "cancel", "a", "--state-dir", str(state))
    assert code == 0 and "cancelling a" in out
    code, _, err = _run(capsys, "submit", str(job), "--state-dir", str(state))
    assert code == 2 and "exists already" in err


def test_serve_bad_service_file_names_the_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    svc = tmp_path / "svc.toml"
    svc.write_text('name = "a"\nmodel = "m"\nhandler = "mod:f"\nconcurrency = 0\n')
    code, _, err = _run(capsys, "serve", str(svc), "--state-dir", str(tmp_path / "s"))
    assert code == 2
    assert err.count("\n") == 1
    assert err.startswith(f"deepboot: error: {svc}: field 'concurrency': ")


def test_serve_registers_a_service_in_the_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from deepboot.runtime.store.jobstore import JobStore
    from deepboot.runtime.store.statedir import StateDir

    example = Path(__file__).resolve().parents[2] / "examples" / "runtime" / "echo.toml"
    state = StateDir.at(tmp_path / "s").ensure()
    JobStore(state.db).close()
    code, out, _ = _run(capsys, "serve", str(example), "--state-dir", str(state.root))
    assert code == 0 and "registered service echo" in out
    code, out, _ = _run(capsys, "serve", str(example), "--state-dir", str(state.root))
    assert code == 0 and "already registered" in out
    store = JobStore(state.db)
    [row] = store.services()
    assert row.spec.name == "echo" and row.spec.max_replicas == 4
    assert [e.detail["service"] for e in store.events()] == ["echo"]
    store.close()


# -- issue 18: the local cluster's Ray directory, 'down', the processes of a cluster -------


def _fake_ray_start(
    monkeypatch: pytest.MonkeyPatch, seen: list[tuple[str, os.stat_result | None]]
) -> None:
    """Replace 'ray start' by a fake that records the head's --temp-dir and what the
    directory around it was when Ray would have started (None: missing)."""
    from deepboot.runtime.cluster import raycluster

    def fake(args: list[str], env: object, worker: bool) -> str:
        for arg in args:
            if arg.startswith("--temp-dir="):
                path = arg.split("=", 1)[1]
                try:
                    seen.append((path, os.lstat(os.path.dirname(path))))
                except FileNotFoundError:
                    seen.append((path, None))
        return ""

    monkeypatch.setattr(raycluster, "_ray_start", fake)


def test_local_ray_dir_is_random_and_private_before_ray_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deepboot.core.cluster import ClusterSpec
    from deepboot.runtime.cluster import raycluster
    from deepboot.runtime.store.statedir import StateDir

    seen: list[tuple[str, os.stat_result | None]] = []
    _fake_ray_start(monkeypatch, seen)
    state = StateDir.at(tmp_path / "s")
    try:
        for _ in range(2):  # twice in the same state directory: two names
            record = raycluster.up_local(state, ClusterSpec.parse("1x1"))
            state.cluster_file.unlink()
            # Ray's directory lies in the cluster's directory, which the record names.
            assert os.path.dirname(seen[-1][0]) == record.temp_dir
        assert len({path for path, _ in seen}) == 2
        for path, st in seen:
            assert len(path) <= 40  # Ray's unix sockets live below it (sun_path <= 108)
            assert st is not None, f"{path}'s directory did not exist when Ray started"
            assert stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode)
            assert st.st_uid == os.geteuid()
            assert stat.S_IMODE(st.st_mode) == 0o700
    finally:
        for path, _ in seen:
            shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def _squat(kind: str, path: Path) -> None:
    if kind == "symlink":
        target = path.with_name("target")
        target.mkdir(mode=0o700)
        path.symlink_to(target)
    elif kind == "shared":
        path.mkdir()
        os.chmod(path, 0o777)
    else:
        if os.geteuid() != 0:
            pytest.skip("giving a directory to another user needs root")
        path.mkdir(mode=0o700)
        os.chown(path, 65534, 65534)


@pytest.mark.parametrize("kind", ["symlink", "shared", "other-owner"])
def test_up_refuses_a_ray_dir_it_does_not_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Another user created the directory first (or a link in its place): no Ray."""
    from deepboot.core.cluster import ClusterSpec
    from deepboot.core.errors import DeepbootError
    from deepboot.runtime.cluster import raycluster
    from deepboot.runtime.store.statedir import StateDir

    squatted = tmp_path / "squatted"
    _squat(kind, squatted)
    # Whatever name up_local picks, it finds the squatter's directory there.
    monkeypatch.setattr(raycluster, "_temp_dir_for", lambda state: str(squatted), raising=False)
    monkeypatch.setattr(raycluster, "_new_temp_dir_name", lambda: str(squatted), raising=False)
    seen: list[tuple[str, os.stat_result | None]] = []
    _fake_ray_start(monkeypatch, seen)
    state = StateDir.at(tmp_path / "s")
    with pytest.raises(DeepbootError, match=str(squatted)):
        raycluster.up_local(state, ClusterSpec.parse("1x1"))
    assert seen == []
    assert not state.cluster_file.exists()


def _local_record(state_root: Path, temp_dir: Path) -> None:
    """A local cluster record whose processes are none (nothing names its directory
    or its address: port 99999 is no port, and no prefix of one)."""
    from deepboot.runtime.cluster.raycluster import ClusterRecord
    from deepboot.runtime.store.statedir import StateDir

    state = StateDir.at(state_root).ensure()
    ClusterRecord("local", "127.0.0.1:99999", str(temp_dir), ((0, "training", 1),), "").save(state)


def test_down_removes_http_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "s"
    ray_dir = tmp_path / "ray"
    ray_dir.mkdir(mode=0o700)
    _local_record(state, ray_dir)
    (state / "http.json").write_text('{"url": "http://127.0.0.1:8470", "instance": "ab"}')
    os.chmod(state / "http.json", 0o600)  # as the controller writes it
    code, out, err = _run(capsys, "down", "--state-dir", str(state))
    assert code == 0, err
    assert not (state / "http.json").exists()
    assert not (state / "cluster.json").exists()
    assert not ray_dir.exists()  # its Ray directory, ours: removed


@pytest.mark.parametrize("kind", ["symlink", "shared", "other-owner"])
def test_down_leaves_a_ray_dir_it_does_not_own(tmp_path: Path, kind: str) -> None:
    from deepboot.runtime.cluster.raycluster import ClusterRecord, remove_temp_dir, stop_local

    squatted = tmp_path / "squatted"
    _squat(kind, squatted)
    inside = (squatted.with_name("target") if kind == "symlink" else squatted) / "theirs"
    inside.write_text("x")
    record = ClusterRecord("local", "127.0.0.1:99999", str(squatted), (), "")
    assert remove_temp_dir(record) is False
    assert stop_local(record) == 0
    assert inside.read_text() == "x"


def test_the_http_header_file_holds_the_token_mode_0600(tmp_path: Path) -> None:
    """For curl -H @FILE: the token stays off the command line (ps shows it)."""
    from deepboot.runtime.store.statedir import StateDir

    state = StateDir.at(tmp_path / "s")
    token = state.ensure_http_token().read_text().strip()
    assert len(token) == 64
    assert state.http_header.read_text() == f"Authorization: Bearer {token}\n"
    for path in (state.http_token, state.http_header):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    state.http_token.write_text("new-token\n")  # a token replaced by hand
    state.ensure_http_token()
    assert state.http_header.read_text() == "Authorization: Bearer new-token\n"


@pytest.mark.parametrize("command", ["up", "serve"])
def test_help_shows_curl_with_the_header_file(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    code, out, _ = _run(capsys, command, "--help")
    assert code == 0
    text = " ".join(out.split())
    assert re.search(r"-H @\S*/http-header", text), text
    assert "$(cat" not in text and "Bearer $" not in text
    if command == "serve":
        assert "-H 'Content-Type: application/json'" in text


def _sleeper(*argv: str) -> subprocess.Popen[bytes]:
    """A process that sleeps, with ``argv`` on its command line."""
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", *argv],
        stdin=subprocess.DEVNULL,
    )


def test_cluster_pids_match_whole_addresses_and_directories(tmp_path: Path) -> None:
    """'down' stops the processes naming the cluster's address or directory: not those
    of another cluster whose address or directory merely starts the same."""
    from deepboot.runtime.cluster.raycluster import ClusterRecord, cluster_pids

    ours = tmp_path / "ray-ab"
    procs = [
        _sleeper("--address=127.0.0.1:6500"),  # ours
        _sleeper(f"--log_dir={ours}/session_1/logs"),  # ours
        _sleeper("--address=127.0.0.1:65001"),  # another cluster's
        _sleeper(f"--log_dir={ours}c/session_1/logs"),  # another cluster's
    ]
    try:
        record = ClusterRecord("local", "127.0.0.1:6500", str(ours), (), "")
        found = cluster_pids(record)
        assert [p.pid in found for p in procs] == [True, True, False, False]
    finally:
        for p in procs:
            p.kill()
            p.wait()
