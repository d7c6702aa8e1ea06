"""The router's request and replica state machine, edge by edge (issue 18's review).

The real router on a real socket; its replicas are stand-ins whose every call returns
a future the test completes, so that each interleaving (a load that fails with
requests queued, a client that leaves while its call runs, a replica the router
restarts under another request) happens exactly, every time. The same paths with
real Ray replicas are in tests/runtime/test_front_door.py.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

from deepboot.core.service import ServiceSpec  # noqa: E402
from deepboot.runtime import messages as msg  # noqa: E402
from deepboot.runtime.client.endpoint import healthz_proof  # noqa: E402
from deepboot.runtime.http import router as rt  # noqa: E402
from deepboot.runtime.prometheus_metrics import Metrics  # noqa: E402

pytestmark = pytest.mark.runtime

TOKEN = "ab" * 32
HEADERS = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


class _Method:
    def __init__(self, calls: list[concurrent.futures.Future[Any]]) -> None:
        self.calls = calls

    def remote(self, *args: Any) -> Any:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.calls.append(fut)

        class Ref:
            def future(self) -> concurrent.futures.Future[Any]:
                return fut

        return Ref()


class FakeReplica:
    """A replica handle: ``pid``, ``load`` and ``infer`` calls, each a future the test
    completes (``pid`` and ``load`` complete at once unless ``hold_load``)."""

    def __init__(self, hold_load: bool = False, loaded: Any = None) -> None:
        self.loaded = {"seconds": 0.5, "start": "cold"} if loaded is None else loaded
        self.pids: list[concurrent.futures.Future[Any]] = []
        self.loads: list[concurrent.futures.Future[Any]] = []
        self.infers: list[concurrent.futures.Future[Any]] = []
        self.pid = _Method(self.pids)
        self.load = _Method(self.loads)
        self.infer = _Method(self.infers)
        self.hold_load = hold_load

    def settle_start(self) -> None:
        """Answer ``pid`` and (unless held) ``load`` as they are asked."""
        wait_until("pid asked", lambda: bool(self.pids))
        self.pids[0].set_result(1)
        if not self.hold_load:
            wait_until("load asked", lambda: bool(self.loads))
            self.loads[0].set_result(self.loaded)


def wait_until(what: str, ok: Callable[[], Any], timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := ok()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
    return value


class Inbox:
    """Every message the router sent, in order (the inbox drained into a list)."""

    def __init__(self, router: rt.Router) -> None:
        self.router = router
        self.seen: list[msg.Message] = []

    def all(self) -> list[msg.Message]:
        self.seen += self.router.inbox.drain()
        return self.seen


@pytest.fixture
def router() -> Iterator[rt.Router]:
    # A short drain: some tests leave a call hanging on purpose.
    r = rt.Router(rt.Inbox(), Metrics(), token=TOKEN, drain_s=1.0)
    r.start()
    try:
        yield r
    finally:
        r.stop()


def serve(router: rt.Router, **spec: Any) -> ServiceSpec:
    s = ServiceSpec("svc", "m", **spec)
    router.set_services({"svc": s})
    wait_until("service set", lambda: "svc" in router.services)
    return s


def post(router: rt.Router, rid: str, out: dict[str, tuple[int, Any]], **headers: str) -> None:
    """POST an inference request in a thread; its (status, body) lands in ``out``."""

    def run() -> None:
        parts = urlsplit(router.url)
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=120)
        conn.request(
            "POST", "/v1/svc/infer", body=b"{}", headers={**HEADERS, "X-Request-Id": rid, **headers}
        )
        # The router stopping (a test's teardown) with the request still waiting
        # closes the connection after its drain: no answer is recorded then.
        with contextlib.suppress(ConnectionError):
            r = conn.getresponse()
            out[rid] = (r.status, json.loads(r.read()))
        conn.close()

    threading.Thread(target=run, daemon=True).start()


def cold_start(
    router: rt.Router,
    inbox: Inbox,
    rid: str,
    out: dict[str, tuple[int, Any]],
    rep: FakeReplica | None = None,
) -> FakeReplica:
    """POST ``rid``; once it is an arrival, start a replica for it on GPU 2.0 (cold),
    and return that replica once the request runs on it."""
    rep = rep or FakeReplica()
    post(router, rid, out)
    wait_until(f"{rid} posted", lambda: msg.Arrival(rid, "svc") in inbox.all())
    router.start_replica("2.0", "svc", "r|svc|2.0|1", rep, cold=True, task=rid)
    rep.settle_start()
    wait_until(f"{rid} running", lambda: len(rep.infers) == 1)
    return rep


def queued(router: rt.Router) -> list[str]:
    return [p.id for p in router.services["svc"].queue]


def test_a_failed_load_withdraws_what_waits_before_it_frees_the_gpu(router: rt.Router) -> None:
    """The controller reads messages in order: a Withdraw after the Died would let it
    place the arrival on the freed GPU, starting a replica during the back-off."""
    serve(router, request_timeout_s=60)
    inbox = Inbox(router)
    out: dict[str, tuple[int, Any]] = {}
    for rid in ("r1", "r2"):
        post(router, rid, out)
        wait_until(f"{rid} posted", lambda rid=rid: msg.Arrival(rid, "svc") in inbox.all())
    rep = FakeReplica(hold_load=True)
    router.start_replica("2.0", "svc", "r|svc|2.0|1", rep, cold=True, task="r1")
    rep.settle_start()
    wait_until("load asked", lambda: bool(rep.loads))
    rep.loads[0].set_exception(RuntimeError("the actor died"))
    wait_until("the death", lambda: any(isinstance(m, msg.Died) for m in inbox.all()))
    kinds = [type(m).__name__ for m in inbox.all()]
    died = kinds.index("Died")
    assert kinds.index("Backoff") < died
    assert msg.Withdraw("r2") in inbox.all()[:died]
    assert not [m for m in inbox.all()[died:] if isinstance(m, msg.Arrival)]
    assert queued(router) == ["r1", "r2"]  # still waiting, for after the back-off
    # After the back-off (1 s) the uncovered requests are posted again.
    wait_until("posted again", lambda: inbox.all().count(msg.Arrival("r2", "svc")) == 2, 10)


def test_a_client_gone_while_its_call_runs_is_never_retried(router: rt.Router) -> None:
    serve(router, request_timeout_s=60)
    inbox = Inbox(router)
    rep = FakeReplica()
    parts = urlsplit(router.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as s:
        head = "".join(f"{k}: {v}\r\n" for k, v in {**HEADERS, "X-Request-Id": "gone"}.items())
        line = "POST /v1/svc/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
        s.sendall(f"{line}{head}\r\n{{}}".encode())
        wait_until("posted", lambda: msg.Arrival("gone", "svc") in inbox.all())
        router.start_replica("2.0", "svc", "r|svc|2.0|1", rep, cold=True, task="gone")
        rep.settle_start()
        wait_until("the call", lambda: bool(rep.infers))
    # The client has gone; while the call still runs, its id stays taken.
    out: dict[str, tuple[int, Any]] = {}
    time.sleep(0.2)
    post(router, "gone", out)
    wait_until("the duplicate answered", lambda: "gone" in out)
    assert out["gone"][0] == 409
    rep.infers[0].set_exception(RuntimeError("the actor died"))
    wait_until("the death", lambda: any(isinstance(m, msg.Died) for m in inbox.all()))
    wait_until("the id released", lambda: "gone" not in router.dispatcher.ids)
    seen = inbox.all()
    died = next(i for i, m in enumerate(seen) if isinstance(m, msg.Died))
    assert msg.Arrival("gone", "svc") not in seen[died:]  # no GPU is sought for it
    assert queued(router) == []


def test_a_replica_the_router_restarts_costs_other_requests_no_retry(router: rt.Router) -> None:
    """concurrency 2: A runs past its deadline (504, the replica is restarted); B, in
    flight beside it, loses its replica through no fault of its own: it is retried
    with no death counted, and answered by the next replica."""
    serve(router, concurrency=2, request_timeout_s=30, handler_timeout_s=2)
    inbox = Inbox(router)
    out: dict[str, tuple[int, Any]] = {}
    first = cold_start(router, inbox, "A", out)
    time.sleep(0.5)  # B's own handler deadline falls well after A's
    post(router, "B", out)
    wait_until("B running", lambda: len(first.infers) == 2)
    # The controller kills the replica as soon as the router gives A's call up (the
    # router cancels it): B's call fails then, in the router's own loop, long before
    # B's deadline, however slowly this thread runs (it once lost that race in CI).
    first.infers[0].add_done_callback(
        lambda _: first.infers[1].set_exception(RuntimeError("killed by the controller"))
    )
    wait_until("A's 504", lambda: "A" in out)
    assert out["A"][0] == 504
    wait_until("B posted again", lambda: msg.Arrival("B", "svc") in inbox.all())
    second = FakeReplica()
    router.start_replica("2.1", "svc", "r|svc|2.1|2", second, cold=True, task="B")
    second.settle_start()
    wait_until("B on the new replica", lambda: bool(second.infers))
    second.infers[0].set_result({"ok": 1})
    wait_until("B answered", lambda: "B" in out)
    assert out["B"][0] == 200
    died = [m for m in inbox.all() if isinstance(m, msg.Died)]
    assert len(died) == 1 and died[0].backoff_s == 0  # one restart, no back-off


def test_replicas_that_keep_dying_serving_back_the_service_off(router: rt.Router) -> None:
    serve(router, request_timeout_s=60)
    inbox = Inbox(router)
    out: dict[str, tuple[int, Any]] = {}
    post(router, "p", out)
    for n in (1, 2):
        rep = FakeReplica()
        router.start_replica(f"2.{n}", "svc", f"r|svc|2.{n}|{n}", rep, cold=True, task="p")
        rep.settle_start()
        wait_until("the call", lambda rep=rep: bool(rep.infers))
        rep.infers[0].set_exception(RuntimeError("segfault"))
        # The router must hear of this death before the next replica starts for the
        # same request, or the request may still be the dead one's.
        wait_until("the death", lambda n=n: sum(isinstance(m, msg.Died) for m in inbox.all()) == n)
    wait_until("p answered", lambda: "p" in out)
    assert out["p"][0] == 502 and "2 replicas died" in out["p"][1]["error"]
    backoffs = [m for m in inbox.all() if isinstance(m, msg.Backoff)]
    assert backoffs == [msg.Backoff("svc", 1, 1.0)]
    died = [m.backoff_s for m in inbox.all() if isinstance(m, msg.Died)]
    assert died == [0.0, 1.0]


def test_a_cancelled_call_is_answered_not_left_to_the_backstop(router: rt.Router) -> None:
    serve(router, request_timeout_s=60)
    inbox = Inbox(router)
    rep = FakeReplica()
    out: dict[str, tuple[int, Any]] = {}
    post(router, "c", out)
    wait_until("posted", lambda: msg.Arrival("c", "svc") in inbox.all())
    router.start_replica("2.0", "svc", "r|svc|2.0|1", rep, cold=True, task="c")
    rep.settle_start()
    wait_until("the call", lambda: bool(rep.infers))
    rep.infers[0].cancel()
    # Counted as the replica's death: retried, queued again (no replica left).
    wait_until("c queued again", lambda: queued(router) == ["c"])
    assert "c" not in out


def test_slow_uploads_cannot_overfill_the_queue(router: rt.Router) -> None:
    serve(router, queue_bound=1, request_timeout_s=60)
    parts = urlsplit(router.url)
    head = "".join(f"{k}: {v}\r\n" for k, v in HEADERS.items())
    request = f"POST /v1/svc/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n{head}\r\n"
    socks = []
    try:
        first = socket.create_connection((parts.hostname, parts.port), timeout=30)
        socks.append(first)
        first.sendall(request.encode() + b'{"x": ')  # the rest never comes
        wait_until("the first upload admitted", lambda: router.services["svc"].reading == 1)
        for _ in range(3):
            s = socket.create_connection((parts.hostname, parts.port), timeout=30)
            socks.append(s)
            s.sendall(request.encode() + b'{"x": ')
            assert b" 503 " in s.recv(4096).split(b"\r\n", 1)[0]
    finally:
        for s in socks:
            s.close()


def test_a_slow_upload_is_cut_off_at_the_request_timeout(router: rt.Router) -> None:
    serve(router, request_timeout_s=0.5)
    parts = urlsplit(router.url)
    head = "".join(f"{k}: {v}\r\n" for k, v in HEADERS.items())
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as s:
        s.sendall(
            f"POST /v1/svc/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n{head}\r\n".encode()
        )
        assert b" 408 " in s.recv(4096).split(b"\r\n", 1)[0]
    assert router.services["svc"].reading == 0


def test_a_non_ascii_token_is_a_401(router: rt.Router) -> None:
    parts = urlsplit(router.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as s:
        s.sendall(
            b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
            b"Content-Type: application/json\r\nAuthorization: Bearer \xff\xfe\r\n\r\n{}"
        )
        assert b" 401 " in s.recv(4096).split(b"\r\n", 1)[0]


def test_healthz_proves_it_holds_the_token_without_revealing_it(router: rt.Router) -> None:
    parts = urlsplit(router.url)
    challenge = "0f" * 16
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    conn.request("GET", f"/healthz?challenge={challenge}")
    body = json.loads(conn.getresponse().read())
    assert body.pop("loop_age_s") >= 0
    assert body == {
        "ok": True,
        "instance": router.instance,
        "proof": healthz_proof(TOKEN, challenge),
    }
    assert TOKEN not in json.dumps(body)
    conn.request("GET", "/healthz?challenge=not-hex")
    r = conn.getresponse()
    assert r.status == 400 and "challenge" in json.loads(r.read())["error"]
    conn.close()


def test_generated_request_ids_are_random(router: rt.Router) -> None:
    serve(router, request_timeout_s=0.3)
    out: dict[str, tuple[int, Any]] = {}
    ids = set()
    for _ in range(3):
        parts = urlsplit(router.url)
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
        conn.request("POST", "/v1/svc/infer", body=b"{}", headers=HEADERS)
        r = conn.getresponse()
        ids.add(json.loads(r.read())["id"])
        conn.close()
    assert len(ids) == 3 and all(len(i) == len("req-") + 16 for i in ids), ids
    assert not out


def test_a_retried_request_keeps_its_deadlines(router: rt.Router) -> None:
    """request_timeout_s 1, handler_timeout_s 3: a request whose replica dies after
    its queue deadline is not queued again (503 at once), and one that waits in the
    queue after a retry is answered 503 at its queue deadline (measured from its
    arrival, not from the retry); neither outlives request + handler timeouts."""
    serve(router, request_timeout_s=1, handler_timeout_s=3)
    inbox = Inbox(router)
    out: dict[str, tuple[int, Any]] = {}
    sent = time.monotonic()
    post(router, "late", out)
    wait_until("posted", lambda: msg.Arrival("late", "svc") in inbox.all())
    rep = FakeReplica()
    router.start_replica("2.0", "svc", "r|svc|2.0|1", rep, cold=True, task="late")
    rep.settle_start()
    wait_until("the call", lambda: bool(rep.infers))
    # Past the queue deadline (1 s from arrival), inside the handler's (3 s more).
    wait_until("past the queue deadline", lambda: time.monotonic() - sent > 1.2)
    rep.infers[0].set_exception(RuntimeError("the actor died"))
    wait_until("answered", lambda: "late" in out)
    assert out["late"][0] == 503 and queued(router) == []

    post(router, "early", out)
    wait_until("posted", lambda: msg.Arrival("early", "svc") in inbox.all())
    second = FakeReplica()
    router.start_replica("2.1", "svc", "r|svc|2.1|2", second, cold=True, task="early")
    second.settle_start()
    wait_until("the call", lambda: bool(second.infers))
    second.infers[0].set_exception(RuntimeError("the actor died"))  # at once: retried
    wait_until("queued again", lambda: queued(router) == ["early"])
    wait_until("answered", lambda: "early" in out)  # by its queue deadline, no replica
    assert out["early"][0] == 503 and queued(router) == []


def test_every_request_counts_in_the_load_warm_served_ones_too(router: rt.Router) -> None:
    """The lending reserve reads each service's load from every request: the router
    reports each one it accepts (``Received``) and each answer's handler time
    (``Served``), while only the request no replica covered is an arrival (concurrency
    2: the second joins the first's replica, warm)."""
    serve(router, concurrency=2, request_timeout_s=60)
    inbox = Inbox(router)
    out: dict[str, tuple[int, Any]] = {}
    rep = cold_start(router, inbox, "cold", out)
    post(router, "warm", out)
    wait_until("warm running beside it", lambda: len(rep.infers) == 2)
    for n, rid in enumerate(("cold", "warm")):
        rep.infers[n].set_result({"n": n})
        wait_until(f"{rid} answered", lambda rid=rid: rid in out)
        assert out[rid][0] == 200
    wait_until("both served", lambda: sum(isinstance(m, msg.Served) for m in inbox.all()) == 2)
    seen = inbox.all()
    assert [m for m in seen if isinstance(m, msg.Received)] == [msg.Received("svc")] * 2
    assert all(m.service == "svc" and m.seconds >= 0 for m in seen if isinstance(m, msg.Served))
    assert [m.task for m in seen if isinstance(m, msg.Arrival)] == ["cold"]


@pytest.mark.parametrize(
    ("loaded", "start"),
    [({"seconds": 0.25, "start": "host"}, "host"), (0.25, "cold")],
    ids=["host-start", "an-older-replica's-bare-seconds"],
)
def test_ready_says_how_the_replica_started(router: rt.Router, loaded: Any, start: str) -> None:
    """``load`` answers its seconds and its start (a host start from the node's model
    cache, or cold); a replica an older deepboot started (detached, it outlives an
    upgrade) answers bare seconds: a cold start."""
    serve(router)
    inbox = Inbox(router)
    out: dict[str, tuple[int, Any]] = {}
    cold_start(router, inbox, "r1", out, FakeReplica(loaded=loaded))
    ready = wait_until("ready", lambda: [m for m in inbox.all() if isinstance(m, msg.Ready)])
    assert [(m.load_seconds, m.start) for m in ready] == [(0.25, start)]


def test_healthz_turns_unhealthy_when_the_controllers_loop_stops_turning(
    router: rt.Router,
) -> None:
    def health() -> tuple[int, dict[str, Any]]:
        parts = urlsplit(router.url)
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
        conn.request("GET", "/healthz")
        r = conn.getresponse()
        out = (r.status, json.loads(r.read()))
        conn.close()
        return out

    router.beat()
    status, body = health()
    assert status == 200 and body["ok"] is True
    router.stall_s = 0.05
    time.sleep(0.2)  # no beat: the loop is stuck
    status, body = health()
    assert status == 503 and body["ok"] is False and body["loop_age_s"] >= 0.05
    assert "has not turned" in body["error"]
    router.beat()  # it turns again
    assert health()[0] == 200


def test_a_replica_pre_warmed_with_no_request_reports_ready_then_idle(
    router: rt.Router,
) -> None:
    """``--slo``'s pre-warm: a new replica with no task. Loaded with nothing queued, it
    took nothing (``Ready.inflight`` 0) and is idle next (the controller's
    REPLICA_WARM); a request that arrives while it loads queues on it (no arrival for
    the controller) and is what it takes once loaded."""
    serve(router, request_timeout_s=60)
    inbox = Inbox(router)
    idle = FakeReplica()
    router.start_replica("2.0", "svc", "r|svc|2.0|1", idle, cold=True)
    idle.settle_start()
    wait_until("idle", lambda: msg.Idle("2.0", "r|svc|2.0|1") in inbox.all())
    kinds = [type(m).__name__ for m in inbox.all()]
    assert kinds == ["Ready", "Idle"]
    assert [m.inflight for m in inbox.all() if isinstance(m, msg.Ready)] == [0]

    loading = FakeReplica(hold_load=True)
    router.start_replica("2.1", "svc", "r|svc|2.1|2", loading, cold=True)
    loading.settle_start()
    wait_until("load asked", lambda: bool(loading.loads))
    out: dict[str, tuple[int, Any]] = {}
    post(router, "r1", out)
    wait_until("r1 queued", lambda: queued(router) == ["r1"])
    assert not [m for m in inbox.all() if isinstance(m, msg.Arrival)]  # it covers r1
    loading.loads[0].set_result({"seconds": 0.5, "start": "cold"})
    wait_until("r1 running", lambda: len(loading.infers) == 1)
    ready = [m for m in inbox.all() if isinstance(m, msg.Ready) and m.gpu == "2.1"]
    assert [m.inflight for m in ready] == [1]
    loading.infers[0].set_result({"y": 1})
    wait_until("r1 answered", lambda: "r1" in out)
    assert out["r1"][0] == 200
