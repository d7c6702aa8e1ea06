"""The runtime end to end: a real local Ray cluster (2 training nodes x 2 logical GPUs),
real torch workers, the real controller process, the real SQLite store.

One cluster serves the module (starting one takes ~15 s); every test submits its
own jobs. Timings are scaled down (2 s rounds, 0.3 s polls, 15 s collective timeout).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from deepboot.runtime.cluster.raycluster import ClusterRecord, cluster_pids, ray_env  # noqa: E402
from deepboot.runtime.store.jobstore import LogKind  # noqa: E402
from deepboot.runtime.store.statedir import StateDir  # noqa: E402
from tests.runtime.cluster_helpers import (  # noqa: E402
    alive,
    assert_exact_resizes,
    cancel_leftover_jobs,
    cli,
    controller_pid,
    events,
    job,
    listening_sockets,
    local_cluster,
    open_gate_at,
    status,
    wait_for,
    worker_pids,
    write_job,
)

pytestmark = pytest.mark.runtime

CUDA_DEVICES = "4,5,6,7"
"""The module cluster's ``--cuda-devices`` on a machine without CUDA devices (taken
as they are there): node 0 sees "4,5", node 1 "6,7". On a GPU machine, ``up``'s own
mapping of the machine's devices."""


def _cuda_flags() -> tuple[str, ...]:
    from deepboot.elastic.devices import machine_devices

    return () if machine_devices() else ("--cuda-devices", CUDA_DEVICES)


GATED_LOSS = 0.05
"""The loss threshold of the jobs a test ends with a gate once what it checks has
happened (about 150 steps of batch 32, which they have trained by then): the gate, not
a threshold near the noise floor, says when they finish."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state = tmp_path_factory.mktemp("deepboot") / "state"
    # Its own: the first tests check the Ray processes a local `deepboot up` starts.
    # --cuda-devices: each node's processes see their own slice of "devices" (CUDA
    # ignores the variable on a machine without GPUs, as torch does here).
    flags = ("--training-nodes", "2", "--gpus-per-node", "2", *_cuda_flags())
    with local_cluster(state, *flags, own=True):
        ray_dir = ClusterRecord.load(StateDir.at(state)).temp_dir
        yield state
    # 'down' leaves no endpoint for a client to trust, and removes Ray's directory.
    assert not (state / "http.json").exists()
    assert not os.path.lexists(ray_dir)


@pytest.fixture(autouse=True)
def _no_leftover_jobs(request: pytest.FixtureRequest) -> Iterator[None]:
    """Cancel what a test leaves running (a failed one), so the next starts clean."""
    yield
    if "cluster" in request.fixturenames:
        cancel_leftover_jobs(request.getfixturevalue("cluster"))


def test_every_socket_is_on_loopback_and_ray_wants_the_token(cluster: Path) -> None:
    state = StateDir.at(cluster)
    assert stat.S_IMODE(os.stat(state.token_file).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(state.root).st_mode) == 0o700
    record = ClusterRecord.load(state)
    ours = cluster_pids(record) | {controller_pid(cluster)}
    checked = 0
    for host, port, pids in listening_sockets():  # what `ss -ltnp` lists
        if not pids & ours:
            continue
        assert host in ("127.0.0.1", "::1"), (host, port, pids)
        checked += 1
    assert checked >= 6  # GCS, raylets, agents, ...: the check saw the cluster
    # A Ray client without the token is refused; with it, it connects.
    code = f"import ray; ray.init(address={record.address!r}); print('CONNECTED')"
    env = ray_env(record)
    for var in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN"):
        env.pop(var, None)
    refused = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert "CONNECTED" not in refused.stdout
    assert "InvalidAuthToken" in refused.stderr
    allowed = subprocess.run(
        [sys.executable, "-c", code],
        env=ray_env(record),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "CONNECTED" in allowed.stdout, allowed.stderr[-2000:]


def test_ray_dir_is_random_and_private(cluster: Path) -> None:
    """Another user cannot guess Ray's directory, nor enter it: Ray makes the
    directories it creates 0777, so they lie in the cluster's own, which stays 0700."""
    from hashlib import sha256

    state = StateDir.at(cluster)
    record = ClusterRecord.load(state)
    st = os.lstat(record.temp_dir)
    assert stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode)
    assert st.st_uid == os.geteuid()
    assert stat.S_IMODE(st.st_mode) == 0o700
    assert sha256(str(state.root).encode()).hexdigest()[:10] not in record.temp_dir
    ray_dirs = set()
    for pid in cluster_pids(record):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        ray_dirs |= {
            a.split("=", 1)[1] for a in argv if a.startswith(("--temp-dir=", "--temp_dir="))
        }
    assert ray_dirs, "no Ray process names its --temp-dir"
    assert all(d.startswith(record.temp_dir + "/") for d in ray_dirs), ray_dirs


def _environ(pid: int) -> dict[str, str] | None:
    """The environment ``pid`` started with; None when unreadable, or when the process
    renamed itself (Ray's ``ray::...`` processes: setproctitle writes over it)."""
    try:
        if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::"):
            return None
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None  # gone, or not ours to read
    pairs = (item.split("=", 1) for item in raw.decode(errors="replace").split("\0"))
    return {kv[0]: kv[1] for kv in pairs if len(kv) == 2}


_PINNED = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def test_workers_keep_nccl_gloo_and_their_sockets_on_loopback(
    cluster: Path, tmp_path: Path
) -> None:
    """Ray's processes, the controller and the workers Ray starts on every node have
    NCCL's and gloo's sockets pinned to loopback, and each node's its own CUDA
    devices; with a job's torch workers running, nothing of the cluster listens beyond
    loopback."""
    from deepboot.runtime.cluster.raycluster import run_on_ray

    record = ClusterRecord.load(StateDir.at(cluster))
    seen_vars = (*_PINNED, "CUDA_VISIBLE_DEVICES")
    # What a Ray worker process sees, on each node (a task pinned there by its label).
    nodes = [n for n, _, _ in record.nodes]
    out = run_on_ray(
        record,
        "import json, os\n"
        "@ray.remote(num_cpus=0)\n"
        f"def env():\n    return {{k: os.environ.get(k) for k in {seen_vars!r}}}\n"
        "refs = [env.options(resources={f'deepboot_node_{n}': 1}).remote() "
        f"for n in {nodes!r}]\n"
        "print('ENV=' + json.dumps(ray.get(refs)))",
    )
    [line] = [ln for ln in out.splitlines() if ln.startswith("ENV=")]
    seen = json.loads(line[4:])
    assert [{k: e[k] for k in _PINNED} for e in seen] == [dict.fromkeys(_PINNED, "lo")] * len(nodes)
    # Each node's processes keep its raylet's slice of the devices (Ray, the nodes
    # carrying no Ray GPUs, leaves it): GPU i of a node is its i-th device.
    mapped = dict(record.cuda_devices)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in seen] == [mapped.get(n) for n in nodes], seen
    if _cuda_flags():
        assert record.cuda_devices == ((0, "4,5"), (1, "6,7")), record
    spec = write_job(tmp_path, "loopback-h", threshold=1e-9, delay=0.05, min_workers=2)
    cli(cluster, "submit", str(spec))
    wait_for(
        "loopback-h on 2 workers",
        lambda: (
            job(cluster, "loopback-h")["num_workers"] >= 2
            and job(cluster, "loopback-h")["step"] > 3
        ),
    )
    workers = {p for p in worker_pids(cluster, "loopback-h") if alive(p)}
    assert len(workers) >= 2
    ours = cluster_pids(record) | {controller_pid(cluster)}
    assert workers <= ours  # the workers are Ray's children
    envs = {pid: env for pid in ours if pid and (env := _environ(pid)) is not None}
    assert len(envs) >= 6  # GCS, raylets, the controller, ...
    for pid, env in envs.items():
        assert all(env.get(k) == "lo" for k in _PINNED), (pid, {k: env.get(k) for k in _PINNED})
    for host, port, pids in listening_sockets():
        if pids & ours:
            assert host in ("127.0.0.1", "::1"), (host, port, pids)
    cli(cluster, "cancel", "loopback-h")
    wait_for("loopback-h cancelled", lambda: job(cluster, "loopback-h")["state"] == "cancelled")


def _grew_back(state: Path, name: str) -> bool:
    """Whether ``name`` was resized onto more GPUs after it first shrank."""
    resizes = [
        (len(e.detail["from"]), len(e.detail["to"]))
        for e in events(state, name)
        if e.kind is LogKind.RESIZED
    ]
    shrank = next((i for i, (a, b) in enumerate(resizes) if b < a), None)
    return shrank is not None and any(b > a for a, b in resizes[shrank + 1 :])


def test_first_job_shrinks_for_the_second_and_grows_back(cluster: Path, tmp_path: Path) -> None:
    # long-a trains on until it has grown back (the gate): then it may finish.
    gate = tmp_path / "gate-a"
    a = write_job(tmp_path, "long-a", threshold=GATED_LOSS, delay=0.06, gate=gate)
    b = write_job(tmp_path, "short-b", threshold=0.004, delay=0.03, max_workers=2)
    cli(cluster, "submit", str(a))
    wait_for(
        "long-a on 4 GPUs",
        lambda: job(cluster, "long-a")["num_workers"] == 4 and job(cluster, "long-a")["step"] > 30,
    )
    cli(cluster, "submit", str(b))
    # Usually short-b finishes, then long-a grows back. But ATS-T may take short-b's
    # GPUs back first (below), and then short-b waits for them while the gated long-a
    # trains on: waiting for short-b's end before opening the gate never ended (a CI
    # run, 2026-12-07: short-b preempted 4 s after its start, before its workers
    # formed). So the gate opens once long-a has grown back, whichever came first.
    wait_for("long-a to grow back", lambda: _grew_back(cluster, "long-a"), 900)
    open_gate_at(cluster, "long-a", gate)
    wait_for("long-a to finish", lambda: job(cluster, "long-a")["state"] == "finished", 900)
    wait_for("short-b to finish", lambda: job(cluster, "short-b")["state"] == "finished", 900)
    resizes = assert_exact_resizes(cluster, "long-a")
    assert_exact_resizes(cluster, "short-b")
    sizes = [len(r["to"]) for r in resizes]
    b_start = next(e for e in events(cluster, "short-b") if e.kind is LogKind.STARTED)
    a_events = [e for e in events(cluster, "long-a") if e.kind is LogKind.RESIZED]
    shrink = [e for e in a_events if e.time <= b_start.time and len(e.detail["to"]) < 4]
    assert shrink, f"long-a never shrank before short-b started: {sizes}"
    # It grows back once short-b lets go of its GPUs. Usually that is when short-b
    # finishes, but ATS-T may also take them from short-b (its "0 GPUs" item wins
    # whenever long-a's fitted speedup on 4 outweighs both jobs' on 2), and then
    # long-a grows before short-b's end. One CI run saw [2, 4] with the grow before
    # short-b's end; five runs here (two on a loaded machine) never did, so the cause
    # is not known: the conftest now prints the event log of a failed test. The test
    # holds AFE to its claim, not the policy to one ordering.
    grow = [
        e
        for e in a_events
        if e.time > shrink[0].time and len(e.detail["to"]) > len(e.detail["from"])
    ]
    assert grow, f"long-a never grew back after it shrank: {sizes}"
    b_gpus = [e for e in events(cluster, "short-b") if e.kind is LogKind.GPU]
    for e in grow:
        for gpu in set(e.detail["to"]) - set(e.detail["from"]):
            # long-a grew only onto GPUs that short-b had let go of by then.
            ops = [g.detail["op"] for g in b_gpus if g.detail["gpu"] == gpu and g.time <= e.time]
            assert not ops or ops[-1] == "release", (gpu, ops, e.detail)
    assert all(r["how"] == "afe" for r in resizes)
    for name, threshold in (("long-a", GATED_LOSS), ("short-b", 0.004)):
        [done] = [e for e in events(cluster, name) if e.kind is LogKind.FINISHED]
        assert done.detail["loss"] < threshold
    kinds = [e.kind for e in events(cluster, "long-a") if e.kind is not LogKind.GPU]
    assert kinds[0] is LogKind.SUBMITTED and LogKind.STARTED in kinds
    assert kinds[-1] is LogKind.FINISHED
    # The control loop's decisions are timed as in the simulator, and status says so.
    sched = status(cluster)["scheduler"]
    assert sched["rounds"] >= 2, sched
    assert 0.0 < sched["decision_ms_median"] <= sched["decision_ms_max"], sched


def test_a_killed_worker_does_not_lose_the_job(cluster: Path, tmp_path: Path) -> None:
    gate = tmp_path / "gate-c"
    c = write_job(tmp_path, "fault-c", threshold=GATED_LOSS, delay=0.05, min_workers=2, gate=gate)
    cli(cluster, "submit", str(c))
    wait_for(
        "fault-c running",
        lambda: (
            job(cluster, "fault-c")["num_workers"] >= 2 and job(cluster, "fault-c")["step"] > 40
        ),
    )
    victim = worker_pids(cluster, "fault-c")[-1]
    os.kill(victim, signal.SIGKILL)
    wait_for(
        "fault-c to re-form without the dead worker",
        lambda: any(
            e.kind is LogKind.RESIZED and e.detail["how"] == "failure"
            for e in events(cluster, "fault-c")
        ),
        900,
    )
    open_gate_at(cluster, "fault-c", gate)
    wait_for("fault-c to finish", lambda: job(cluster, "fault-c")["state"] == "finished", 900)
    log = events(cluster, "fault-c")
    failed = [e for e in log if e.kind is LogKind.WORKER_FAILED]
    assert failed, "the controller never noticed the dead worker"
    recovery = [e for e in log if e.kind is LogKind.RESIZED and e.detail["how"] == "failure"]
    assert recovery and all(r.detail["steps_lost"] <= 1 for r in recovery)
    assert_exact_resizes(cluster, "fault-c")
    [done] = [e for e in log if e.kind is LogKind.FINISHED]
    assert done.detail["loss"] < GATED_LOSS


def test_sigkilled_controller_comes_back_and_finishes_the_jobs(
    cluster: Path, tmp_path: Path
) -> None:
    gate = tmp_path / "gate-d"
    d = write_job(tmp_path, "survive-d", threshold=GATED_LOSS, delay=0.05, gate=gate)
    cli(cluster, "submit", str(d))
    wait_for("survive-d running", lambda: job(cluster, "survive-d")["step"] > 30)
    old = controller_pid(cluster)
    assert old is not None
    os.kill(old, signal.SIGKILL)
    wait_for("the controller to die", lambda: not alive(old))
    workers_before = {p for p in worker_pids(cluster, "survive-d") if alive(p)}
    assert workers_before, "the workers died with the controller"
    out = cli(cluster, "up").stdout
    assert "restarted the controller" in out
    assert controller_pid(cluster) not in (None, old)
    wait_for(
        "the new controller to reconcile",
        lambda: (
            [e for e in events(cluster) if e.kind is LogKind.CONTROLLER_STARTED][-1].seq
            > [e for e in events(cluster) if e.kind is LogKind.SUBMITTED][-1].seq
        ),
    )
    # It kept the running workers' processes: no new worker group.
    alive_after = {p for p in worker_pids(cluster, "survive-d") if alive(p)}
    assert alive_after == workers_before
    # Never two live worker groups: never more worker processes than the job may hold,
    # through the new controller's first rounds (five of 2 s: then the job may
    # finish) to the end.
    most = 0
    gate_at = time.monotonic() + 10.0
    while job(cluster, "survive-d")["state"] != "finished":
        live = [p for p in worker_pids(cluster, "survive-d") if alive(p)]
        most = max(most, len(live))
        assert len(live) <= 4, live
        if gate_at is not None and time.monotonic() >= gate_at:
            open_gate_at(cluster, "survive-d", gate)
            gate_at = None
        time.sleep(0.5)
    assert most >= 1
    log = events(cluster, "survive-d")
    starts = [e for e in events(cluster) if e.kind is LogKind.CONTROLLER_STARTED]
    assert "survive-d" in starts[-1].detail["recovered"]
    assert [e for e in log if e.kind is LogKind.FINISHED]
    reconciled = [e for e in events(cluster) if e.kind is LogKind.RECONCILED][-1]
    assert not [n for n in reconciled.detail["killed"] if "|survive-d|" in n]
    assert json.dumps(reconciled.detail)  # the entry is well-formed JSON


def test_cancel_frees_the_gpus_and_logs_tell_the_story(cluster: Path, tmp_path: Path) -> None:
    e = write_job(tmp_path, "cancel-e", threshold=1e-9, delay=0.05)
    cli(cluster, "submit", str(e))
    wait_for("cancel-e running", lambda: job(cluster, "cancel-e")["step"] > 10)
    pids = worker_pids(cluster, "cancel-e")
    assert "cancelling cancel-e" in cli(cluster, "cancel", "cancel-e").stdout
    wait_for("cancel-e cancelled", lambda: job(cluster, "cancel-e")["state"] == "cancelled")
    gpus = json.loads(cli(cluster, "status", "--json").stdout)["gpus"]
    assert not [g for g in gpus if g["holder"] == "cancel-e"]
    wait_for("its workers to exit", lambda: not [p for p in pids if alive(p)], 180)
    logs = cli(cluster, "logs", "cancel-e").stdout
    assert "] worker pid " in logs and "-- events of cancel-e --" in logs
    assert " cancelled " in logs or logs.rstrip().endswith("cancelled {}")
    table = cli(cluster, "status").stdout
    assert "cancel-e" in table and "GPUs" in table


def test_without_afe_resizes_checkpoint_and_restart(cluster: Path, tmp_path: Path) -> None:
    """Last in the module: it restarts the controller with --no-afe's setting."""
    from deepboot.runtime.cluster.updown import stop_controller
    from deepboot.runtime.controller.controller_settings import ControllerSettings, settings_file

    state = StateDir.at(cluster)
    stop_controller(state)
    settings = ControllerSettings.load(settings_file(state))
    no_afe = dataclasses.replace(settings.shared, afe=False)
    dataclasses.replace(settings, shared=no_afe).save(settings_file(state))
    cli(cluster, "up")
    gate = tmp_path / "gate-f"
    f = write_job(tmp_path, "restart-f", threshold=GATED_LOSS, delay=0.06, gate=gate)
    g = write_job(tmp_path, "restart-g", threshold=0.004, delay=0.03, max_workers=2)
    cli(cluster, "submit", str(f))
    wait_for(
        "restart-f on 4 GPUs",
        lambda: (
            job(cluster, "restart-f")["num_workers"] == 4 and job(cluster, "restart-f")["step"] > 30
        ),
    )
    cli(cluster, "submit", str(g))
    # As in test_first_job_shrinks_for_the_second_and_grows_back: ATS-T may take
    # restart-g's GPUs back before its workers form (a CI run, 2026-12-07: 18 s after
    # it was given them), and then it waits behind the gated restart-f for ever. The
    # gate opens once restart-f has grown back, whichever came first.
    wait_for("restart-f to grow back", lambda: _grew_back(cluster, "restart-f"), 900)
    open_gate_at(cluster, "restart-f", gate)
    wait_for("restart-f to finish", lambda: job(cluster, "restart-f")["state"] == "finished", 900)
    wait_for("restart-g to finish", lambda: job(cluster, "restart-g")["state"] == "finished", 900)
    resizes = assert_exact_resizes(cluster, "restart-f")
    assert resizes and all(r["how"] == "restart" for r in resizes)
    assert all(r["steps_lost"] == 0 for r in resizes)  # the checkpoint is taken at the boundary
    # Every restart starts new processes: more worker pids than GPUs.
    assert len(set(worker_pids(cluster, "restart-f"))) > 4
    [done] = [e for e in events(cluster, "restart-f") if e.kind is LogKind.FINISHED]
    assert done.detail["loss"] < GATED_LOSS
