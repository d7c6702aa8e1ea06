"""The front door end to end (issue 18): a real local Ray cluster, the real controller
and its endpoint, real replicas running the misbehaving handlers of
front_door_handlers.py. Each test polls until what it waits for holds, with a
generous deadline; none bounds a wall-clock time.

1 training node and 2 inference nodes x 2 logical GPUs; protect times x0.05.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

pytest.importorskip("ray")
pytest.importorskip("aiohttp")

from deepboot.runtime.store.jobstore import LogKind  # noqa: E402
from tests.runtime.cluster_helpers import events, local_cluster, status, wait_for  # noqa: E402
from tests.runtime.front_door_handlers import read_record  # noqa: E402

pytestmark = pytest.mark.runtime


HANDLERS = Path(__file__).resolve().parent / "front_door_handlers.py"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state = tmp_path_factory.mktemp("front") / "state"
    flags = ("--training-nodes", "1", "--inference-nodes", "2", "--gpus-per-node", "2")
    with local_cluster(state, *flags, "--protect-factor", "0.05"):
        yield state


def _endpoint(state: Path) -> tuple[str, str]:
    info = json.loads((state / "http.json").read_text())
    token = state / "http-token"  # (before issue 18 a loopback endpoint had none)
    return str(info["url"]), token.read_text().strip() if token.exists() else ""


def _send(
    url: str, path: str, body: Any, headers: dict[str, str], timeout: float = 120
) -> tuple[int, Any]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    try:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request("POST", path, body=data, headers=headers)
        r = conn.getresponse()
        raw = r.read()
        try:
            return r.status, json.loads(raw)
        except ValueError:
            return r.status, raw.decode(errors="replace")
    finally:
        conn.close()


def _json(token: str) -> dict[str, str]:
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    return {**auth, "Content-Type": "application/json"}


def _register(state: Path, spec: dict[str, Any]) -> None:
    url, token = _endpoint(state)
    code, answer = _send(url, "/v1/services", spec, _json(token))
    assert (code, answer) == (201, {"name": spec["name"]}), answer
    # Served once the controller took it up (GET /v1/services lists it).
    wait_for(
        f"service {spec['name']} served",
        lambda: spec["name"] in _served(url),
        60,
    )


def _served(url: str) -> set[str]:
    import urllib.request

    with urllib.request.urlopen(url + "/v1/services", timeout=10) as r:
        return {s["service"] for s in json.loads(r.read())}


def _infer(state: Path, service: str, body: Any, rid: str, timeout: float = 120) -> tuple[int, Any]:
    url, token = _endpoint(state)
    return _send(url, f"/v1/{service}/infer", body, {**_json(token), "X-Request-Id": rid}, timeout)


def _replica_events(state: Path, service: str, op: str) -> list[dict[str, Any]]:
    return [
        e.detail
        for e in events(state)
        if e.kind is LogKind.REPLICA and e.detail.get("service") == service
        and e.detail.get("op") == op
    ]  # fmt: skip


def _service_gpus(state: Path, service: str) -> list[dict[str, Any]]:
    return [g for g in status(state)["gpus"] if g.get("service") == service]


def _answer_is_short(answer: Any) -> None:
    text = json.dumps(answer)
    for leak in ("Traceback", 'File \\"', ".py", "/srv/secret", "RayTaskError", "\\n"):
        assert leak not in text, (leak, answer)
    assert answer.get("id"), answer


def test_a_browser_cannot_register_code_nor_run_it(cluster: Path, tmp_path: Path) -> None:
    probe = tmp_path / "PROBE"
    spec = {
        "name": "probe",
        "model": "m",
        "handler": "timeit:timeit",
        "args": {"setup": f"open({str(probe)!r}, 'w').close()", "number": 0},
    }
    url, token = _endpoint(cluster)
    browser = {"Content-Type": "text/plain", "Origin": "https://evil.example"}
    code, answer = _send(url, "/v1/services", spec, browser)
    assert code in (401, 403, 415), answer
    code, answer = _send(url, "/v1/probe/infer", {}, browser, timeout=60)
    assert code in (401, 403, 415), answer
    # Nothing ran: give a replica every chance to start and run the line.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert not probe.exists(), "the probe ran"
        time.sleep(0.5)
    assert "probe" not in {s["name"] for s in status(cluster)["services"]}
    # The same service, with the token and as JSON (what the CLI sends): accepted.
    safe = {**spec, "name": "probe-ok", "args": {"number": 0}}
    code, answer = _send(url, "/v1/services", safe, _json(token))
    assert (code, answer) == (201, {"name": "probe-ok"})


def test_a_replica_that_never_loads_is_killed_and_its_gpu_freed(
    cluster: Path, tmp_path: Path
) -> None:
    _register(
        cluster,
        {
            "name": "hang",
            "model": "m",
            "handler": f"{HANDLERS}:hang",
            "concurrency": 1,
            "max_replicas": 1,
            "load_timeout_s": 1,
            "request_timeout_s": 5,
        },
    )
    out: list[tuple[int, Any]] = []
    t = threading.Thread(target=lambda: out.append(_infer(cluster, "hang", {}, "h1")), daemon=True)
    t.start()

    def settled() -> bool:
        return (
            bool(out)
            and bool(_replica_events(cluster, "hang", "died"))
            and all(g["state"] == "free" for g in _service_gpus(cluster, "hang"))
            and not _service_gpus(cluster, "hang")
        )

    wait_for("the hung replica gone, its GPU free, the request answered", settled, 60)
    code, answer = out[0]
    assert code in (502, 503), answer
    _answer_is_short(answer)
    died = _replica_events(cluster, "hang", "died")[0]
    assert "load" in died["error"] and died["backoff_s"] > 0, died


def test_a_handler_that_fails_to_load_backs_off(cluster: Path, tmp_path: Path) -> None:
    _register(
        cluster,
        {
            "name": "broken",
            "model": "m",
            "handler": f"{HANDLERS}:broken",
            "concurrency": 1,
            # Long enough for the replica's actor to start and its handler to fail on
            # a loaded 2-core machine (3 s was overrun once, in two pytest processes).
            "request_timeout_s": 15,
        },
    )
    code, answer = _infer(cluster, "broken", {}, "b1")
    assert code == 502, answer
    _answer_is_short(answer)  # the log keeps the detail; the client gets none of it
    died = wait_for("the died entry", lambda: _replica_events(cluster, "broken", "died"), 30)
    assert "/srv/secret" in died[0]["error"] and died[0]["backoff_s"] > 0
    sv = next(s for s in status(cluster)["services"] if s["name"] == "broken")
    assert sv["load_failures"] == 1 and sv["backoff_until"] > time.time() - 5, sv
    starts = len(_replica_events(cluster, "broken", "start"))
    # During the back-off a request starts no replica (no GPU is reclaimed for it).
    code, answer = _infer(cluster, "broken", {}, "b2")
    assert code in (502, 503), answer
    if sv["backoff_until"] > time.time():
        assert len(_replica_events(cluster, "broken", "start")) == starts


def test_a_poison_request_kills_two_replicas_at_most(cluster: Path, tmp_path: Path) -> None:
    record = tmp_path / "poison.jsonl"
    _register(
        cluster,
        {
            "name": "poison",
            "model": "m",
            "handler": f"{HANDLERS}:poison",
            "concurrency": 1,
            "max_replicas": 2,
            "request_timeout_s": 90,
            "args": {"record": str(record)},
        },
    )
    assert _infer(cluster, "poison", {}, "p0")[0] == 200
    bad: list[tuple[int, Any]] = []
    t = threading.Thread(
        target=lambda: bad.append(_infer(cluster, "poison", {"poison": True}, "bad")), daemon=True
    )
    t.start()
    good = []
    for i in range(8):
        good.append(_infer(cluster, "poison", {}, f"g{i}")[0])
        time.sleep(0.3)
    t.join(120)
    assert bad, "the poison request got no answer"
    code, answer = bad[0]
    assert code == 502, answer
    _answer_is_short(answer)
    assert good == [200] * len(good)
    assert _infer(cluster, "poison", {}, "after")[0] == 200
    poisoned = [e for e in read_record(str(record)) if e["event"] == "poisoned"]
    assert len(poisoned) == 2, poisoned
    assert len(_replica_events(cluster, "poison", "died")) <= 2


def test_a_client_that_goes_away_while_queued_is_never_served(
    cluster: Path, tmp_path: Path
) -> None:
    record = tmp_path / "held.jsonl"
    _register(
        cluster,
        {
            "name": "held",
            "model": "m",
            "handler": f"{HANDLERS}:recorded",
            "concurrency": 1,
            "max_replicas": 1,
            "request_timeout_s": 90,
            "args": {"record": str(record)},
        },
    )
    first: list[tuple[int, Any]] = []
    t = threading.Thread(
        target=lambda: first.append(_infer(cluster, "held", {"tag": "A", "sleep_s": 5}, "A")),
        daemon=True,
    )
    t.start()
    wait_for("A running", lambda: any(e["tag"] == "A" for e in read_record(str(record))), 60)
    url, token = _endpoint(cluster)
    parts = urlsplit(url)
    body = json.dumps({"tag": "B"}).encode()
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as s:
        s.sendall(
            (
                f"POST /v1/held/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
                "X-Request-Id: B\r\n\r\n"
            ).encode()
            + body
        )
        time.sleep(1.0)  # queued behind A (one replica, one slot)
    t.join(120)
    assert first and first[0][0] == 200
    assert _infer(cluster, "held", {"tag": "C"}, "C")[0] == 200
    tags = [e["tag"] for e in read_record(str(record)) if e["event"] == "start"]
    assert tags == ["A", "C"], tags


def test_one_slot_never_runs_two_calls(cluster: Path, tmp_path: Path) -> None:
    record = tmp_path / "slow.jsonl"
    _register(
        cluster,
        {
            "name": "slow",
            "model": "m",
            "handler": f"{HANDLERS}:recorded",
            "concurrency": 1,
            "max_replicas": 1,
            "request_timeout_s": 1.5,
            "args": {"record": str(record), "sleep_s": 4},
        },
    )
    # A call times out on the replica (504) only once one has loaded; the calls start
    # it (a replica starts on demand). A cold start slower than four calls' 6 s (a
    # loaded CI machine) answered four 503s, so calls go on until a 504, then two more
    # (each at most request_timeout_s + handler_timeout_s: the loop is bounded).
    codes: list[int] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        i = len(codes)
        codes.append(_infer(cluster, "slow", {"tag": f"s{i}"}, f"s{i}")[0])
        if 504 in codes and len(codes) - codes.index(504) >= 3:
            break  # the 504 and two calls after it
    assert all(c in (503, 504) for c in codes), codes
    assert 504 in codes, codes
    time.sleep(5)  # let any call still running end (and record its end)
    open_calls: dict[int, int] = {}
    for e in read_record(str(record)):
        if e["event"] == "start":
            assert open_calls.get(e["pid"], 0) == 0, f"two calls at once in pid {e['pid']}"
            open_calls[e["pid"]] = 1
        else:
            open_calls[e["pid"]] = 0
