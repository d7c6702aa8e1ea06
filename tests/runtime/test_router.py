"""The router's HTTP side without Ray: auth, the bounded queue, timeouts, submissions.

A real aiohttp server on a real socket, in its own thread, as in the controller; no
replica ever starts here (that needs Ray: tests/runtime/test_serving.py), so every
request waits in the queue as an arrival for the controller.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

from deepboot.core.service import ServiceSpec  # noqa: E402
from deepboot.runtime.controller.controller_settings import ControllerSettings  # noqa: E402
from deepboot.runtime.controller.wiring import Controller  # noqa: E402
from deepboot.runtime.controller_process import open_router  # noqa: E402
from deepboot.runtime.http import router as rt  # noqa: E402
from deepboot.runtime.http.frontdoor import is_loopback  # noqa: E402
from deepboot.runtime.messages import Arrival, Withdraw  # noqa: E402
from deepboot.runtime.prometheus_metrics import Metrics  # noqa: E402
from deepboot.runtime.store.jobstore import JobStore  # noqa: E402
from deepboot.runtime.store.statedir import StateDir  # noqa: E402

# Quick (seconds), but it needs the runtime extra (aiohttp, prometheus_client), so it
# runs in `make test-runtime`.
pytestmark = pytest.mark.runtime

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "runtime"


def _call(
    url: str, method: str = "GET", body: Any = None, token: str = "", rid: str = ""
) -> tuple[int, dict[str, str], Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if rid:
        req.add_header("X-Request-Id", rid)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
            return r.status, dict(r.headers), _decode(raw)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), _decode(e.read())


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode()


def _outward_address() -> str:
    """An address of this machine that is not loopback (where one exists)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET: nothing is sent
            addr = str(s.getsockname()[0])
        except OSError:
            addr = ""
    return addr if addr and not is_loopback(addr) else ""


TOKEN = "7e57" * 16


@pytest.fixture
def router() -> Iterator[rt.Router]:
    r = rt.Router(rt.Inbox(), Metrics(), token=TOKEN)
    r.start()
    r.set_services({"svc": ServiceSpec("svc", "m", queue_bound=2, request_timeout_s=0.6)})
    time.sleep(0.05)
    try:
        yield r
    finally:
        r.stop()


def test_loopback_reads_need_no_token(router: rt.Router) -> None:
    assert router.host == "127.0.0.1" and router.front_door.open_reads
    code, _, body = _call(router.url + "/healthz")
    assert body.pop("loop_age_s") >= 0
    assert (code, body) == (200, {"ok": True, "instance": router.instance})
    code, headers, text = _call(router.url + "/metrics")
    assert code == 200 and "deepboot_gpus_lent_total" in text
    code, _, body = _call(router.url + "/v1/nope/infer", "POST", {}, token=TOKEN, rid="x1")
    assert code == 404 and body["id"] == "x1"


def test_full_queue_answers_503_and_waiting_too_long_too(router: rt.Router) -> None:
    # Its own service: requests wait 5 s, long enough to see the queue full on a
    # loaded machine (the fixture's 0.6 s would make this a race).
    router.set_services({"held": ServiceSpec("held", "m", queue_bound=2, request_timeout_s=5.0)})
    results: dict[str, tuple[int, dict[str, str], Any]] = {}

    def send(rid: str) -> None:
        results[rid] = _call(router.url + "/v1/held/infer", "POST", {"x": 1}, TOKEN, rid)

    def queued() -> int:
        listed = _call(router.url + "/v1/services")[2]
        return sum(s["queued"] for s in listed if s["service"] == "held")

    waiting = [threading.Thread(target=send, args=(f"w{i}",)) for i in range(2)]
    for t in waiting:
        t.start()
    deadline = time.monotonic() + 30.0  # a generous bound: both queued (no replica comes)
    while queued() < 2:
        assert time.monotonic() < deadline, "two requests never queued"
        time.sleep(0.02)
    send("over")
    # Answered while both are still queued: a full queue refuses at once, it does not
    # make the request wait its turn.
    assert all(t.is_alive() for t in waiting), "the full queue's answer waited"
    code, headers, body = results["over"]
    assert code == 503 and int(headers["Retry-After"]) >= 1 and body["error"] == "queue full"
    for t in waiting:
        t.join(30)
    for rid in ("w0", "w1"):
        code, headers, body = results[rid]
        assert code == 503 and "Retry-After" in headers and body["id"] == rid
    # The controller heard of both arrivals, and of their withdrawal.
    msgs = router.inbox.drain()
    arrivals = {m.task for m in msgs if isinstance(m, Arrival)}
    withdrawn = {m.task for m in msgs if isinstance(m, Withdraw)}
    assert arrivals == withdrawn == {"w0", "w1"}
    code, _, text = _call(router.url + "/metrics")
    assert 'deepboot_inference_requests_total{code="503",service="held"} 3.0' in text


def test_a_duplicate_id_in_progress_is_refused(router: rt.Router) -> None:
    out: list[int] = []
    t = threading.Thread(
        target=lambda: out.append(_call(router.url + "/v1/svc/infer", "POST", {}, TOKEN, "d")[0])
    )
    t.start()
    time.sleep(0.2)
    code, _, body = _call(router.url + "/v1/svc/infer", "POST", {}, TOKEN, "d")
    assert code == 409
    t.join(10)
    assert out == [503]


def test_bad_body_is_a_400(router: rt.Router) -> None:
    req = urllib.request.Request(
        router.url + "/v1/svc/infer",
        data=b"{not json",
        method="POST",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=10)
    assert exc.value.code == 400


def _controller(tmp_path: Path, host: str) -> Controller:
    from deepboot.core.cluster import ClusterSpec

    state = StateDir.at(tmp_path / "state").ensure()
    settings = ControllerSettings(http_host=host, http_port=0)
    return Controller(state, settings, ClusterSpec.parse("2x2", 1), actors=None)  # type: ignore[arg-type]


@pytest.mark.parametrize("where", ["loopback", "outward"])
def test_controller_requires_the_token_for_work_everywhere(tmp_path: Path, where: str) -> None:
    host = "127.0.0.1" if where == "loopback" else (_outward_address() or "0.0.0.0")
    ctl = _controller(tmp_path, host)
    ctl.connect_router(open_router(ctl))
    assert ctl.router.port is not None
    try:
        info = json.loads(ctl.state.http_file.read_text())
        assert info["auth"] is True and info["instance"] == ctl.router.port.instance
        assert (ctl.state.http_file.stat().st_mode & 0o777) == 0o600
        url = info["url"]
        if host == "0.0.0.0":
            url = url.replace("0.0.0.0", "127.0.0.1")
        job = {
            "name": "j1",
            "entry": f"{EXAMPLES / 'regression.py'}:train",
            "max_workers": 2,
        }
        service = json.loads(
            json.dumps(
                ServiceSpec("s1", "m", handler=f"{EXAMPLES / 'echo_service.py'}:load").to_json()
            )
        )
        token = ctl.state.http_token.read_text().strip()
        assert (ctl.state.http_token.stat().st_mode & 0o777) == 0o600
        for path, body in (("/v1/jobs", job), ("/v1/services", service), ("/v1/s1/infer", {})):
            code, headers, _ = _call(url + path, "POST", body)
            assert code == 401 and headers["WWW-Authenticate"].startswith("Bearer")
            code, _, _ = _call(url + path, "POST", body, token="wrong" + token)
            assert code == 401
        # /healthz is open everywhere; the other reads only on loopback.
        code, _, body = _call(url + "/healthz")
        assert body.pop("loop_age_s") >= 0
        assert (code, body) == (200, {"ok": True, "instance": info["instance"]})
        for path in ("/metrics", "/v1/services"):
            code, _, _ = _call(url + path)
            assert code == (200 if where == "loopback" else 401), path
            assert _call(url + path, token=token)[0] == 200
        code, _, body = _call(url + "/v1/jobs", "POST", job, token=token)
        assert (code, body) == (201, {"name": "j1"})
        code, _, body = _call(url + "/v1/services", "POST", service, token=token)
        assert (code, body) == (201, {"name": "s1"})
        code, _, body = _call(url + "/v1/jobs", "POST", {"name": "j2"}, token=token)
        assert code == 400 and "entry" in body["error"]
        store = JobStore(ctl.state.db)
        assert [r.name for r in store.jobs()] == ["j1"]
        assert [r.spec.name for r in store.services()] == ["s1"]
        store.close()
    finally:
        ctl.router.port.stop()


def test_a_restarted_controller_keeps_a_services_back_off(tmp_path: Path) -> None:
    """The back-off is in the store: a new controller's router holds it (no arrival
    posted for the service until it ends), and the failure count it doubles from."""
    ctl = _controller(tmp_path, "127.0.0.1")
    spec = ServiceSpec("s1", "m", handler=f"{EXAMPLES / 'echo_service.py'}:load")
    store = JobStore(ctl.state.db)
    store.register_service(spec)
    with store.transaction() as db:
        store.set_backoff(db, "s1", 3, time.time() + 30)
    store.close()
    ctl.catalog.take_services()
    ctl.connect_router(open_router(ctl))
    assert ctl.router.port is not None
    try:
        deadline = time.monotonic() + 30
        while not (q := ctl.router.port.services.get("s1")) or not q.load_failures:
            assert time.monotonic() < deadline, "the back-off never reached the router"
            time.sleep(0.05)
        assert q.load_failures == 3 and q.backing_off(time.monotonic())
        assert 20 < q.backoff_until - time.monotonic() <= 30
    finally:
        ctl.router.port.stop()
