"""The endpoint's front door without Ray (issue 18): the token on every route that
accepts work, on loopback too; no cross-site requests; bounded input before any work;
short error answers.

A real aiohttp server on a real socket, in its own thread, as in the controller. No
replica ever starts here (that needs Ray: tests/runtime/test_front_door.py).
"""

from __future__ import annotations

import contextlib
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

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

from deepboot.core.service import ServiceSpec  # noqa: E402
from deepboot.runtime.http import router as rt  # noqa: E402
from deepboot.runtime.http.frontdoor import is_loopback  # noqa: E402
from deepboot.runtime.messages import Arrival  # noqa: E402
from deepboot.runtime.prometheus_metrics import Metrics  # noqa: E402

pytestmark = pytest.mark.runtime


TOKEN = "f00d" * 16
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "runtime"

# The spec of the review's finding 1: a "handler" that runs any Python line it is given.
PROBE_SPEC = {
    "name": "probe",
    "model": "m",
    "handler": "timeit:timeit",
    "args": {"setup": "open('/tmp/PROBE', 'w').close()", "number": 0},
}


def send(
    url: str,
    path: str,
    method: str = "POST",
    body: bytes | None = b"{}",
    headers: dict[str, str] | None = None,
    timeout: float = 30,
) -> tuple[int, dict[str, str], Any]:
    """One HTTP request with exactly the headers given (no defaults added)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    try:
        conn.request(method, path, body=body if method == "POST" else None, headers=headers or {})
        r = conn.getresponse()
        raw = r.read()
        try:
            decoded: Any = json.loads(raw)
        except ValueError:
            decoded = raw.decode(errors="replace")
        return r.status, dict(r.getheaders()), decoded
    finally:
        conn.close()


def authed(**extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json", **extra}


@pytest.fixture
def router() -> Iterator[rt.Router]:
    registered: list[dict[str, Any]] = []

    def register(raw: dict[str, Any]) -> str:
        registered.append(raw)
        return str(raw.get("name", ""))

    # A short drain: a full queue's test leaves requests waiting on purpose.
    r = rt.Router(
        rt.Inbox(), Metrics(), token=TOKEN, submit=register, register=register, drain_s=1.0
    )
    r.start()
    r.set_services({"svc": ServiceSpec("svc", "m", queue_bound=1, request_timeout_s=30)})
    r.registered = registered  # type: ignore[attr-defined]
    time.sleep(0.05)
    try:
        yield r
    finally:
        r.stop()


@pytest.mark.parametrize(
    "path", ["/v1/services", "/v1/jobs", "/v1/svc/infer"], ids=["services", "jobs", "infer"]
)
def test_work_needs_the_token_on_loopback(router: rt.Router, path: str) -> None:
    assert is_loopback(router.host)
    body = json.dumps(PROBE_SPEC).encode()
    for headers in (
        {"Content-Type": "application/json"},
        {"Content-Type": "application/json", "Authorization": "Bearer wrong"},
        {"Content-Type": "application/json", "Authorization": TOKEN},  # no scheme
    ):
        code, hdrs, answer = send(router.url, path, body=body, headers=headers)
        assert code == 401, (path, headers, code, answer)
        assert hdrs["WWW-Authenticate"].startswith("Bearer")
        assert set(answer) >= {"error"} and "\n" not in answer["error"]
    assert router.registered == []  # type: ignore[attr-defined]
    assert not [m for m in router.inbox.drain() if isinstance(m, Arrival)]


def test_a_browser_post_is_refused_and_runs_nothing(router: rt.Router) -> None:
    """What a web page can make a browser send to 127.0.0.1 without a preflight: a
    text/plain POST with a foreign Origin (and no token)."""
    body = json.dumps(PROBE_SPEC).encode()
    browser = {"Content-Type": "text/plain", "Origin": "https://evil.example"}
    for path in ("/v1/services", "/v1/probe/infer", "/v1/svc/infer"):
        code, _, answer = send(router.url, path, body=body, headers=browser)
        assert code in (401, 403, 415), (path, code)
        assert "error" in answer
    # Even with the token (a page cannot have it, but the checks are independent):
    code, _, answer = send(
        router.url, "/v1/services", body=body, headers=authed(Origin="https://evil.example")
    )
    assert code == 403 and "origin" in answer["error"].lower()
    code, _, answer = send(
        router.url, "/v1/services", body=body, headers={**authed(), "Content-Type": "text/plain"}
    )
    assert code == 415 and "application/json" in answer["error"]
    assert router.registered == []  # type: ignore[attr-defined]
    # The endpoint's own origin is fine, and JSON with a charset too.
    own = authed(Origin=router.url)
    own["Content-Type"] = "application/json; charset=utf-8"
    code, _, answer = send(router.url, "/v1/services", body=body, headers=own)
    assert (code, answer) == (201, {"name": "probe"})


def test_reads_stay_open_on_loopback_but_not_cross_site(router: rt.Router) -> None:
    for path in ("/healthz", "/metrics", "/v1/services"):
        code, _, _ = send(router.url, path, method="GET", headers={})
        assert code == 200, path
        code, _, _ = send(router.url, path, method="GET", headers={"Origin": "http://evil.example"})
        assert code == 403, path


def test_sizes_are_checked_before_the_body_is_read(router: rt.Router) -> None:
    # A service or job spec is small: 1 MiB is refused by its length alone.
    big = b'{"name": "' + b"x" * (1 << 20) + b'"}'
    for path in ("/v1/services", "/v1/jobs"):
        code, _, answer = send(router.url, path, body=big, headers=authed())
        assert code == 413 and "error" in answer, path
    # An inference body over the service's limit (1 MiB by default).
    huge = b'{"x": "' + b"y" * (2 << 20) + b'"}'
    code, _, answer = send(router.url, "/v1/svc/infer", body=huge, headers=authed())
    assert code == 413 and answer["id"]
    # A body of unannounced length (chunked) is cut off once past the limit: the
    # answer comes while the body is still unfinished.
    parts = urlsplit(router.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as s:
        head = (
            "POST /v1/services HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n\r\n"
        )
        chunk = b"x" * (256 << 10)
        s.sendall(head.encode() + (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * 2)
        reply = s.recv(4096)  # never the terminating chunk
    assert b" 413 " in reply.split(b"\r\n", 1)[0]


def test_a_full_queue_answers_before_reading_the_body(router: rt.Router) -> None:
    """queue_bound = 1: one request waits; the next is refused on its headers alone,
    even though its (announced) body is never sent."""

    def wait_in_the_queue() -> None:
        # The router's stop (the teardown) closes it, still waiting: expected.
        with contextlib.suppress(ConnectionError):
            send(router.url, "/v1/svc/infer", body=b"{}", headers=authed(), timeout=60)

    waiting = threading.Thread(target=wait_in_the_queue, daemon=True)
    waiting.start()
    deadline = time.monotonic() + 30
    while not router.services["svc"].queue:
        assert time.monotonic() < deadline, "the first request never queued"
        time.sleep(0.05)
    parts = urlsplit(router.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as s:
        s.sendall(
            (
                "POST /v1/svc/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
                f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n\r\n"
            ).encode()
        )
        reply = s.recv(4096)  # answered with the body still unsent
    assert b" 503 " in reply.split(b"\r\n", 1)[0] and b"Retry-After" in reply


@pytest.mark.parametrize("path", ["/v1/services", "/v1/svc/infer"], ids=["services", "infer"])
def test_deep_json_is_a_400(router: rt.Router, path: str) -> None:
    deep = b"[" * 30_000 + b"]" * 30_000  # under every body limit
    code, _, answer = send(router.url, path, body=deep, headers=authed())
    assert code == 400 and "deep" in answer["error"], answer
    assert "Traceback" not in json.dumps(answer)


@pytest.mark.parametrize(
    "name",
    ["svc\n", "a\nb", "", "-x", "x" * 64],
    ids=["newline", "inner", "empty", "dash", "long"],
)
def test_names_are_matched_whole(name: str) -> None:
    from deepboot.core.errors import ConfigError

    with pytest.raises(ConfigError):
        ServiceSpec(name, "m")


def test_an_unknown_service_in_a_url_with_a_newline_is_a_404(router: rt.Router) -> None:
    code, _, answer = send(router.url, "/v1/svc%0A/infer", headers=authed())
    assert code == 404 and "error" in answer


def test_errors_carry_a_short_message_and_an_id(router: rt.Router) -> None:
    code, hdrs, answer = send(router.url, "/v1/svc/infer", body=b"{oops", headers=authed())
    assert code == 400 and answer["id"] and hdrs["X-Request-Id"] == answer["id"]
    assert len(answer["error"]) < 200 and "\n" not in answer["error"]
    code, _, answer = send(router.url, "/v1/services", body=b"[1]", headers=authed())
    assert code == 400 and "id" in answer and "\n" not in answer["error"]
