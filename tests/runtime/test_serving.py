"""Inference services on the runtime, end to end: a real local Ray cluster of 2 training
and 2 inference nodes x 2 logical GPUs, real torch training workers and replicas, the
real controller process with its HTTP endpoint, the load generator's CLI.

Timings are scaled down: 2 s rounds, 0.3 s polls, protect times x0.05 (1.5-6 s).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from deepboot.runtime.store.jobstore import EventRow, LogKind  # noqa: E402
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
    status,
    wait_for,
)
from tests.runtime.serving_helpers import (
    THRESHOLD,
    Load,
    gated_job,
    open_gate,
    post,
    rate_profile,
    service_file,
)

pytestmark = pytest.mark.runtime


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state = tmp_path_factory.mktemp("serving") / "state"
    flags = ("--training-nodes", "2", "--inference-nodes", "2", "--gpus-per-node", "2")
    with local_cluster(state, *flags, "--protect-factor", "0.05"):
        yield state


@pytest.fixture(autouse=True)
def _no_leftover_jobs(request: pytest.FixtureRequest) -> Iterator[None]:
    """Cancel what a test leaves running (a failed one), so the next starts clean."""
    yield
    if "cluster" in request.fixturenames:
        cancel_leftover_jobs(request.getfixturevalue("cluster"))


def _gpu_ops(log: list[EventRow], name: str) -> list[tuple[str, str]]:
    return [
        (e.detail["op"], e.detail["gpu"]) for e in log if e.kind is LogKind.GPU and e.job == name
    ]


def _replica_ops(log: list[EventRow]) -> list[tuple[str, str]]:
    return [(e.detail["op"], e.detail["gpu"]) for e in log if e.kind is LogKind.REPLICA]


def _metrics(state: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    url = json.loads((state / "http.json").read_text())["url"]
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_lull_spike_lull(cluster: Path, tmp_path: Path) -> None:
    """Training borrows inference GPUs in a lull, gives them back in a spike (AFE
    shrink), borrows them again after it, and finishes; every request is answered
    once; the metrics endpoint agrees with the event log."""
    cli(cluster, "serve", str(service_file(tmp_path, "echo", delay=0.2, max_replicas=4)))
    code, _ = post(cluster, "echo", "warm-up", {"x": [0.0]})  # one replica, started cold
    assert code == 200
    gate = tmp_path / "gate"
    cli(cluster, "submit", str(gated_job(tmp_path, "trainer", gate, max_workers=6)))
    runs: list[list[dict[str, str]]] = []

    # Lull: one request a second; the job takes the idle inference GPUs.
    lull = rate_profile(tmp_path, "lull", [(0, 1), (20, 0)])
    for i in range(15):
        load = Load(cluster, "echo", lull, tmp_path / f"lull1-requests-{i}.csv")
        runs.append(load.rows())
        t = job(cluster, "trainer")
        if t["lent_gpus"] and set(t["lent_gpus"]) <= set(t["workers"]) and t["step"] > 20:
            break
    else:
        pytest.fail(f"the job never borrowed an inference GPU: {status(cluster)}")
    spike_start = time.time()

    # Spike: 20 requests a second of 0.2 s each want 4 replicas (max 4 = every
    # inference GPU): the lent GPUs are reclaimed.
    spike = Load(
        cluster,
        "echo",
        rate_profile(tmp_path, "spike", [(0, 20), (15, 0)]),
        tmp_path / "spike-requests.csv",
    )
    runs.append(spike.rows())
    log = events(cluster)
    reclaims = [
        e
        for e in log
        if e.kind is LogKind.GPU and e.detail["op"] == "reclaim" and e.time >= spike_start
    ]
    assert reclaims, f"the spike reclaimed nothing: {_gpu_ops(log, 'trainer')}"
    spike_end = time.time()

    # Lull again: the idle replicas go PROTECT -> SLEEP and their GPUs are lent again.
    lull2 = rate_profile(tmp_path, "lull2", [(0, 0.5), (10, 0)])
    for i in range(20):
        load = Load(cluster, "echo", lull2, tmp_path / f"lull2-requests-{i}.csv")
        runs.append(load.rows())
        relent = [
            e
            for e in events(cluster, "trainer")
            if e.kind is LogKind.GPU and e.detail["op"] == "lend" and e.time > spike_end
        ]
        t = job(cluster, "trainer")
        if relent and t["lent_gpus"] and set(t["lent_gpus"]) <= set(t["workers"]):
            break
    else:
        pytest.fail(
            f"the job never borrowed again: {_gpu_ops(events(cluster), 'trainer')}; "
            f"replicas: {_replica_ops(events(cluster))}; status: {status(cluster)}"
        )

    open_gate(cluster, "trainer", gate)
    wait_for("trainer to finish", lambda: job(cluster, "trainer")["state"] == "finished", 600)

    # Training: lend -> reclaim -> lend, AFE resizes, exact parameters, loss reached.
    log = events(cluster, "trainer")
    ops = [op for op, _ in _gpu_ops(log, "trainer")]
    first_lend = ops.index("lend")
    first_reclaim = ops.index("reclaim", first_lend)
    assert "lend" in ops[first_reclaim:], ops
    resizes = assert_exact_resizes(cluster, "trainer")
    shrinks = [r for r in resizes if len(r["to"]) < len(r["from"]) and r["how"] == "afe"]
    grows = [r for r in resizes if len(r["to"]) > len(r["from"]) and r["how"] == "afe"]
    assert shrinks and grows, [(r["how"], r["from"], r["to"]) for r in resizes]
    [done] = [e for e in log if e.kind is LogKind.FINISHED]
    assert done.detail["loss"] < THRESHOLD

    answered = [r for run in runs for r in run]
    served = len(answered) + 1  # and the warm-up request
    # Requests: every id of every run exactly once, every one answered 200.
    for run in runs:
        ids = [r["id"] for r in run]
        assert ids and len(ids) == len(set(ids))
    bad = [r for r in answered if r["status"] != "200"]
    assert not bad, bad[:5]

    # Metrics: the counters equal the event log's counts.
    m = _metrics(cluster)
    everything = events(cluster)
    lends = sum(1 for e in everything if e.kind is LogKind.GPU and e.detail["op"] == "lend")
    taken = sum(1 for e in everything if e.kind is LogKind.GPU and e.detail["op"] == "reclaim")
    assert m[("deepboot_gpus_lent_total", ())] == lends
    assert m[("deepboot_gpus_reclaimed_total", ())] == taken >= 1
    for kind in ("afe", "restart", "failure"):
        n = sum(1 for e in everything if e.kind is LogKind.RESIZED and e.detail["how"] == kind)
        assert m[("deepboot_job_resizes_total", (("kind", kind),))] == n
    colds = sum(
        1
        for e in everything
        if e.kind is LogKind.REPLICA and e.detail["op"] == "ready" and e.detail["start"] == "cold"
    )
    assert m[("deepboot_replica_cold_starts_total", (("service", "echo"),))] == colds
    assert (
        m[("deepboot_inference_requests_total", (("code", "200"), ("service", "echo")))] == served
    )
    assert (
        m[("deepboot_inference_request_duration_seconds_count", (("service", "echo"),))] == served
    )
    inference_gpus = sum(
        v
        for (name, labels), v in m.items()
        if name == "deepboot_gpus" and ("pool", "inference") in labels
    )
    assert inference_gpus == 4

    # Status shows the service's replicas and states.
    doc = status(cluster)
    [svc] = [s for s in doc["services"] if s["name"] == "echo"]
    assert svc["cold_start_s"] is not None and svc["cold_start_s"] > 0
    assert all(r["state"] in ("running", "protect", "sleep") for r in svc["replicas"])

    # Every socket of the controller (HTTP endpoint included) is on loopback.
    pid = controller_pid(cluster)
    mine = [(addr, port) for addr, port, pids in listening_sockets() if pid in pids]
    assert mine and all(addr.startswith("127.") or addr == "::1" for addr, _ in mine), mine

    # The controller recorded every step of its loop: the run replays exactly, while
    # a policy that all but never changes a job's size (hysteresis 0.99: a changed
    # count is worth 1% of itself) would have decided otherwise (it never lends).
    same = cli(cluster, "replay", check=False)
    assert same.returncode == 0 and "no divergence" in same.stdout, same.stdout
    other = cli(cluster, "replay", "--param", "hysteresis=0.99", check=False)
    assert other.returncode == 1 and "first divergence at step" in other.stdout, other.stdout


def test_killed_replica_requests_are_retried(cluster: Path, tmp_path: Path) -> None:
    cli(cluster, "serve", str(service_file(tmp_path, "slow", delay=3.0, max_replicas=2)))
    code, first = post(cluster, "slow", "warm", {"x": [1.0]})
    assert code == 200
    victim = first["result"]["pid"]
    out: dict[str, tuple[int, Any]] = {}
    t = threading.Thread(target=lambda: out.update(a=post(cluster, "slow", "a", {"x": [2.0]})))
    t.start()
    time.sleep(1.0)  # "a" is in flight on the warm replica (3 s of work)
    os.kill(victim, signal.SIGKILL)
    t.join(300)
    code, body = out["a"]
    assert code == 200, body
    assert body["result"]["pid"] != victim
    died = [
        e
        for e in events(cluster)
        if e.kind is LogKind.REPLICA and e.detail["op"] == "died" and e.detail["service"] == "slow"
    ]
    assert died


def test_sigkilled_controller_recovers_services_and_jobs(cluster: Path, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    cli(cluster, "submit", str(gated_job(tmp_path, "keeper", gate, max_workers=4)))
    wait_for("keeper running", lambda: job(cluster, "keeper")["step"] > 20, 600)
    code, first = post(cluster, "echo", "before", {"x": [1.0]})
    assert code == 200
    port = json.loads((cluster / "http.json").read_text())["port"]
    old = controller_pid(cluster)
    assert old is not None
    os.kill(old, signal.SIGKILL)
    wait_for("the controller to die", lambda: not alive(old))
    cli(cluster, "up")
    wait_for(
        "the new controller to reconcile",
        lambda: (
            [e for e in events(cluster) if e.kind is LogKind.CONTROLLER_STARTED][-1].time
            > [e for e in events(cluster) if e.kind is LogKind.SUBMITTED][-1].time
        ),
    )
    reconciled = [e for e in events(cluster) if e.kind is LogKind.RECONCILED][-1]
    kept = reconciled.detail["kept"]
    assert any(n.startswith("w|keeper|") for n in kept), kept
    assert any(n.startswith("r|") for n in kept), kept
    assert json.loads((cluster / "http.json").read_text())["port"] == port
    doc = status(cluster)
    assert {s["name"] for s in doc["services"]} >= {"echo", "slow"}
    code, again = post(cluster, "echo", "after", {"x": [1.0]})
    assert code == 200
    open_gate(cluster, "keeper", gate)
    wait_for("keeper to finish", lambda: job(cluster, "keeper")["state"] == "finished", 600)
    starts = [e for e in events(cluster) if e.kind is LogKind.CONTROLLER_STARTED]
    assert "keeper" in starts[-1].detail["recovered"]
